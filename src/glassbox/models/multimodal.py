"""The text model of a multimodal checkpoint (an architecture its family lists as ``multimodal``:
Gemma4ForConditionalGeneration): its language model's tensors under the text model's names, the other
towers' left out (and said so once).

transformers stores such a model's decoder under ``model.language_model.`` (the text model's ``model.``)
beside ``model.vision_tower.``, ``model.audio_tower.`` and their projections into the text embedding
(``model.embed_vision.``, ``model.embed_audio.``); the LM head (``lm_head.``) is the text model's.
"""

from __future__ import annotations

import logging
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import TypeVar

from safetensors import safe_open

from glassbox.models.facts import ModelFacts
from glassbox.models.families import engine_family
from glassbox.models.safetensors_files import weight_files

logger = logging.getLogger(__name__)

TEXT_PREFIX = "model.language_model."
T = TypeVar("T")


def is_multimodal(facts: ModelFacts, outer_architecture: str) -> bool:
    """Whether a checkpoint of ``outer_architecture`` holds the text model of ``facts`` among other towers."""
    return bool(facts.architecture) and outer_architecture in engine_family(facts.architecture).multimodal


def text_name(name: str) -> str | None:
    """A multimodal checkpoint's tensor name as the text model's, or None for another tower's."""
    if name.startswith(TEXT_PREFIX):
        return "model." + name[len(TEXT_PREFIX) :]
    return name if name.startswith("lm_head.") else None


def text_tensors(tensors: Iterator[tuple[str, T]], where: str) -> Iterator[tuple[str, T]]:
    """The text model's (name, tensor) of a multimodal checkpoint's stream; the rest counted and skipped,
    said once (after the stream, so that the count is whole)."""
    towers: set[str] = set()
    skipped = 0
    for name, tensor in tensors:
        text = text_name(name)
        if text is None:
            skipped += 1
            towers.add(".".join(name.split(".")[:2]))
            continue
        yield text, tensor
    if skipped:
        logger.info(
            "%s: the text model only; %d tensors of %s ignored", where, skipped, ", ".join(sorted(towers))
        )


def tower_names(model_dir: Path) -> set[str]:
    """The names of the other towers' tensors in a multimodal checkpoint's files (for readers that slice
    each tensor they are handed: tensor parallelism's), said once."""
    names: set[str] = set()
    for path in weight_files(model_dir):
        with safe_open(str(path), framework="pt") as f:
            names |= {n for n in f.keys() if text_name(n) is None}  # noqa: SIM118 (not a dict)
    towers = sorted({".".join(n.split(".")[:2]) for n in names})
    logger.info("%s: the text model only; %d tensors of %s ignored", model_dir, len(names), ", ".join(towers))
    return names


def text_kept(kept: Mapping[str, T]) -> dict[str, T]:
    """Layers kept in their format (by checkpoint name) under the text model's names; other towers' dropped."""
    return {text: v for name, v in kept.items() if (text := text_name(name)) is not None}
