"""A checkpoint opened for the engine: its description, tokenizer and weights, from a Hugging Face
directory (config.json, tokenizer files, safetensors; GPTQ and AWQ layers repacked into blocks, FP8 layers
kept as stored, NVFP4 linears and MXFP4 experts kept in 4-bit floats) or a GGUF file (metadata, vocabulary,
tensors: Q4_0, Q4_1, Q8_0 and the K-quants Q4_K, Q5_K, Q6_K kept in their blocks when the engine can run
them so, a MoE layer's experts also in MXFP4 (each expert's matrices held by its ``MoEExperts``), the rest
dequantized)."""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass

import torch

from glassbox.models.config_reader import facts_from_dir, facts_from_gguf, read_config
from glassbox.models.facts import ModelFacts
from glassbox.models.fused_parts import fused_config, is_fused, split_fused
from glassbox.models.gguf_check import gguf_errors
from glassbox.models.gguf_reader import GGUFCheckpoint, open_gguf
from glassbox.models.multimodal import is_multimodal, text_kept, text_tensors
from glassbox.models.safetensors_files import safetensors_tensors
from glassbox.models.sources import ModelSource
from glassbox.quant.blocks.gguf_experts import gguf_matrix, held_gguf_experts
from glassbox.quant.checkpoint import read_kept
from glassbox.quant.formats import kept_ggml_types
from glassbox.quant.held_experts import ExpertMatrix, HeldExperts
from glassbox.quant.kept import Kept
from glassbox.tokenizer.gguf_tokenizer import tokenizer_from_gguf
from glassbox.tokenizer.hf_tokenizer import Tokenizer

Tensors = Iterator[tuple[str, torch.Tensor]]  # (HF name, tensor), one at a time


@dataclass
class Checkpoint:
    source: ModelSource
    facts: ModelFacts
    tokenizer: Tokenizer
    gguf: GGUFCheckpoint | None = None
    multimodal: bool = False  # the text model of a multimodal checkpoint (models/multimodal.py)

    def weights(
        self, keep_blocks: bool, device: torch.device, dtype: torch.dtype, cpu: bool = True
    ) -> tuple[Tensors, dict[str, Kept]]:
        """(the float tensors, the ones kept in their format by HF name). With ``keep_blocks``, a GGUF file's
        2-D tensors of the types a format keeps (quant/formats.py) stay in their blocks, and its
        experts too by MoE module (``gguf_experts``, MXFP4 too: quant/fp4/weights.py; for CUDA a module's
        only where they stack for its fused block MoE); a GPTQ/AWQ, compressed-tensors integer, NVFP4 or MXFP4 checkpoint's layers always do (ValueError where no kernels run
        them: gptq_awq.check_runs, fp4_checkpoint; or for settings the loader cannot run), and an FP8
        checkpoint's stay 8-bit (any device and dtype); all else is float."""
        if self.gguf is None:
            if is_fused(self.facts.model_type):  # Phi-3: q/k/v and gate/up stored fused
                return split_fused(safetensors_tensors(self.source.path), fused_config(self.facts)), {}
            read = read_kept(self.source.path, self.facts.quantization_config, device, dtype, cpu)
            tensors, layers = read if read is not None else (safetensors_tensors(self.source.path), {})
            if self.multimodal:
                return text_tensors(tensors, str(self.source.path)), text_kept(layers)
            return tensors, layers
        gguf = self.gguf
        kept: dict[str, Kept] = {}
        skip: set[str] = set()
        if keep_blocks:
            types = set(kept_ggml_types("blocks", triton=not cpu))
            for name, ggml_type, raw, shape in gguf.stored_tensors(types):
                kept[name] = gguf_matrix(ggml_type, raw, shape)
            skip = set(kept)
            # MoE experts: held for the CPU's kernels, or whole for CUDA's fused block MoE
            experts, held_names = gguf_experts(gguf, whole=not cpu)
            kept.update(experts)
            skip |= held_names

        def floats() -> Tensors:
            for name, array in gguf.tensors(skip=skip):
                yield name, torch.from_numpy(array)

        return floats(), kept


def gguf_experts(gguf: GGUFCheckpoint, whole: bool = False) -> tuple[dict[str, HeldExperts], set[str]]:
    """Each MoE layer's stacked experts kept in their GGML types where the CPU kernels run those
    (quant/formats.py ``kept_ggml_types``), by module name, and the tensor names taken (quant/blocks/gguf_experts.py)."""
    stacked: dict[str, dict[str, list[ExpertMatrix]]] = {}
    for name, ggml_type, raw, shape in gguf.stored_tensors(set(kept_ggml_types(triton=whole)), ndim=3):
        if not name.endswith(".weight"):  # a plain stacked parameter (Nemotron-H's experts): held as floats
            continue
        module, _, proj = name.removesuffix(".weight").rpartition(".")
        stacked.setdefault(module, {})[proj] = [
            gguf_matrix(ggml_type, raw[e], shape[1:]) for e in range(shape[0])
        ]
    return held_gguf_experts(stacked, whole)


def open_checkpoint(source: ModelSource) -> Checkpoint:
    """Read a checkpoint's description and tokenizer (weights are read by ``weights()``)."""
    if source.format == "gguf":
        gguf = open_gguf(source.path)
        with gguf_errors(gguf.paths[0]):  # metadata of the wrong type or shape: one error naming the file
            return Checkpoint(source, facts_from_gguf(gguf, source.name), tokenizer_from_gguf(gguf), gguf)
    facts = facts_from_dir(source.path, source.name)
    outer = str((read_config(source.path).get("architectures") or [""])[0])
    return Checkpoint(source, facts, Tokenizer.from_dir(source.path), multimodal=is_multimodal(facts, outer))
