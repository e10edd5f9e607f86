"""A checkpoint opened for the engine: its description, tokenizer and weights, from a Hugging Face
directory (config.json, tokenizer files, safetensors) or a GGUF file (metadata, vocabulary, tensors
dequantized at load)."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from dataclasses import dataclass, field

import torch

from glassbox.models.config_reader import facts_from_dir, facts_from_gguf
from glassbox.models.facts import ModelFacts
from glassbox.models.gguf_reader import open_gguf
from glassbox.models.loader import safetensors_tensors
from glassbox.models.sources import ModelSource
from glassbox.tokenizer.gguf_tokenizer import tokenizer_from_gguf
from glassbox.tokenizer.hf_tokenizer import Tokenizer


@dataclass
class Checkpoint:
    source: ModelSource
    facts: ModelFacts
    tokenizer: Tokenizer
    tensors: Callable[[], Iterator[tuple[str, torch.Tensor]]]  # (HF name, tensor), one at a time
    tensor_types: dict[str, str] = field(default_factory=dict)  # GGUF: HF name -> GGML type ("Q4_1")


def open_checkpoint(source: ModelSource) -> Checkpoint:
    """Read a checkpoint's description and tokenizer (weights are read when ``tensors()`` is iterated)."""
    if source.format == "gguf":
        gguf = open_gguf(source.path)

        def gguf_tensors() -> Iterator[tuple[str, torch.Tensor]]:
            for name, array in gguf.tensors():
                yield name, torch.from_numpy(array)

        facts = facts_from_gguf(gguf, source.name)
        return Checkpoint(source, facts, tokenizer_from_gguf(gguf), gguf_tensors, dict(gguf.tensor_types))
    facts = facts_from_dir(source.path, source.name)
    return Checkpoint(
        source, facts, Tokenizer.from_dir(source.path), lambda: safetensors_tensors(source.path)
    )
