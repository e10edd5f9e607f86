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

from glassbox.models.config_reader import facts_from_dir, facts_from_gguf
from glassbox.models.facts import ModelFacts
from glassbox.models.fused_parts import FUSED_MODEL_TYPES, fused_config, split_fused
from glassbox.models.gguf_reader import GGUFCheckpoint, open_gguf
from glassbox.models.loader import Packed, safetensors_tensors
from glassbox.models.sources import ModelSource
from glassbox.quant.blocks import kquant
from glassbox.quant.blocks.ct_int import read_ct_int
from glassbox.quant.blocks.ct_int_config import ct_int_spec
from glassbox.quant.blocks.gguf_experts import EXPERT_TYPES, expert_matrix, held_gguf_experts
from glassbox.quant.blocks.gptq_awq import check_runs, read_group_quant
from glassbox.quant.blocks.weights import GGUF_TYPES
from glassbox.quant.config import group_quant
from glassbox.quant.fp4.checkpoint import read_fp4
from glassbox.quant.fp8.checkpoint import read_fp8
from glassbox.quant.fp8.config import fp8_spec
from glassbox.quant.held_experts import ExpertMatrix, HeldExperts
from glassbox.tokenizer.gguf_tokenizer import tokenizer_from_gguf
from glassbox.tokenizer.hf_tokenizer import Tokenizer

Tensors = Iterator[tuple[str, torch.Tensor]]  # (HF name, tensor), one at a time


@dataclass
class Checkpoint:
    source: ModelSource
    facts: ModelFacts
    tokenizer: Tokenizer
    gguf: GGUFCheckpoint | None = None

    def weights(
        self, keep_packed: bool, device: torch.device, dtype: torch.dtype, cpu: bool = True
    ) -> tuple[Tensors, dict[str, Packed]]:
        """(the float tensors, the packed ones by HF name). With ``keep_packed``, a GGUF file's 2-D
        tensors of the packed types (quant/blocks/weights.py, quant/blocks/kquant.py) stay in their blocks, and its
        experts too by MoE module (``gguf_experts``, MXFP4 too: quant/fp4/weights.py; for CUDA a module's
        only where they stack for its fused block MoE); a GPTQ/AWQ, compressed-tensors integer, NVFP4 or MXFP4 checkpoint's layers always do (ValueError where no kernels run
        them: gptq_awq.check_runs, fp4_checkpoint; or for settings the loader cannot run), and an FP8
        checkpoint's stay 8-bit (any device and dtype); all else is float."""
        if self.gguf is None:
            if self.facts.model_type in FUSED_MODEL_TYPES:  # Phi-3: q/k/v and gate/up stored fused
                return split_fused(safetensors_tensors(self.source.path), fused_config(self.facts)), {}
            fp4 = read_fp4(self.source.path, self.facts.quantization_config, device, dtype)
            if fp4 is not None:
                return fp4[1], dict(fp4[0])
            spec = group_quant(self.facts.quantization_config)
            if spec is not None:
                check_runs(spec.method.upper(), device, dtype)
                packed_layers, rest = read_group_quant(self.source.path, spec, cpu)
                return rest, dict(packed_layers)
            ct = ct_int_spec(self.facts.quantization_config)
            if ct is not None:
                check_runs("compressed-tensors integer", device, dtype)
                packed_layers, rest = read_ct_int(self.source.path, ct, cpu)
                return rest, dict(packed_layers)
            fp8 = fp8_spec(self.facts.quantization_config)
            if fp8 is not None:
                fp8_layers, rest = read_fp8(self.source.path, fp8, cpu)
                return rest, dict(fp8_layers)
            return safetensors_tensors(self.source.path), {}
        gguf = self.gguf
        packed: dict[str, Packed] = {}
        skip: set[str] = set()
        if keep_packed:
            types = {*GGUF_TYPES, *kquant.KQUANT_TYPES}
            for name, ggml_type, raw, shape in gguf.stored_tensors(types):
                packed[name] = expert_matrix(ggml_type, raw, shape)
            skip = set(packed)
            # MoE experts: held for the CPU's kernels, or whole for CUDA's fused block MoE
            experts, held_names = gguf_experts(gguf, whole=not cpu)
            packed.update(experts)
            skip |= held_names

        def floats() -> Tensors:
            for name, array in gguf.tensors(skip=skip):
                yield name, torch.from_numpy(array)

        return floats(), packed


def gguf_experts(gguf: GGUFCheckpoint, whole: bool = False) -> tuple[dict[str, HeldExperts], set[str]]:
    """Each MoE layer's stacked experts kept in their GGML types where the CPU kernels run those
    (``EXPERT_TYPES``), by module name, and the tensor names taken (quant/blocks/gguf_experts.py)."""
    stacked: dict[str, dict[str, list[ExpertMatrix]]] = {}
    for name, ggml_type, raw, shape in gguf.stored_tensors(set(EXPERT_TYPES), ndim=3):
        module, _, proj = name.removesuffix(".weight").rpartition(".")
        stacked.setdefault(module, {})[proj] = [
            expert_matrix(ggml_type, raw[e], shape[1:]) for e in range(shape[0])
        ]
    return held_gguf_experts(stacked, whole)


def open_checkpoint(source: ModelSource) -> Checkpoint:
    """Read a checkpoint's description and tokenizer (weights are read by ``weights()``)."""
    if source.format == "gguf":
        gguf = open_gguf(source.path)
        return Checkpoint(source, facts_from_gguf(gguf, source.name), tokenizer_from_gguf(gguf), gguf)
    return Checkpoint(source, facts_from_dir(source.path, source.name), Tokenizer.from_dir(source.path))
