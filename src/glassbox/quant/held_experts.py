"""A mixture-of-experts layer's expert matrices kept as stored, and the linears that run them.

``HeldExperts`` is what a checkpoint reader hands models/moe.py's ``MoEExperts.hold``: per expert its
gate_up (one matrix, or the gate and up matrices) and down matrix in one of the formats the CPU kernels run
as stored (``BlockWeights``: GGUF Q4_0/Q4_1/Q8_0; ``KQuantWeights``: Q4_K/Q5_K/Q6_K; ``FP4Weights``: MXFP4,
NVFP4; ``Fp8Weights``: FP8 checkpoints' experts). ``kept_linear`` turns an expert's matrices into one linear (stacked by rows into one kernel call
where they share a format, as layers/linear.concat_linears does for a dense gate/up: a batch-1 decode row
runs the int8-activation GEMV), ``ExpertSlice`` runs one expert's rows of a float parameter.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import nn

from glassbox.quant.blocks.kquant import KQuantWeights
from glassbox.quant.blocks.linear import BlockQuantLinear
from glassbox.quant.blocks.weights import BlockWeights
from glassbox.quant.dense.onednn import ConcatLinear, concat_linears, cpu_matrix
from glassbox.quant.fp4.linear import FP4Linear
from glassbox.quant.fp4.weights import FP4Weights
from glassbox.quant.fp8.linear import Fp8Linear
from glassbox.quant.fp8.weights import Fp8Weights

ExpertMatrix = BlockWeights | KQuantWeights | FP4Weights | Fp8Weights  # one expert matrix as stored
Quantize = Callable[[torch.Tensor], ExpertMatrix]  # a float matrix to one as stored (--quantization)


@dataclass
class HeldExperts:
    """A MoE layer's routed experts kept as stored (quant/blocks/weights.py, quant/blocks/kquant.py,
    quant/fp4/weights.py, quant/fp8/weights.py), by expert: ``gate_up`` one matrix (2I x H, rows in the model's order) or the gate
    and up matrices (I x H each: their outputs then read as [gate | up]); ``down`` (H x I). A side left
    None loads into its float parameter as usual."""

    gate_up: Sequence[tuple[ExpertMatrix, ...]] | None = None
    down: Sequence[ExpertMatrix] | None = None


class ExpertSlice(nn.Module):
    """One expert's matrix of a fused float parameter, as a linear (``F.linear``)."""

    def __init__(self, weight: torch.Tensor, bias: torch.Tensor | None) -> None:
        super().__init__()
        self.weight, self.bias = weight, bias
        self.nbytes = weight.numel() * weight.element_size()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return F.linear(x, self.weight, self.bias)


def kept_linear(parts: tuple[ExpertMatrix, ...], bias: torch.Tensor | None) -> nn.Module:
    """A linear of the matrices ``parts`` side by side (one kernel call where they share a format:
    layers/linear.concat_linears), with ``bias`` split over them."""
    linears: list[nn.Module] = []
    start = 0
    for w in parts:
        b = None if bias is None else bias[start : start + w.out_features]
        start += w.out_features
        if isinstance(w, Fp8Weights):
            linears.append(Fp8Linear(w, b))
        else:
            linears.append(FP4Linear(w, b) if isinstance(w, FP4Weights) else BlockQuantLinear(w, b))
    return linears[0] if len(linears) == 1 else concat_linears(*linears)


def linear_bytes(m: nn.Module) -> int:
    """The bytes a linear's weight and bias hold as stored."""
    if isinstance(m, ConcatLinear):
        return sum(linear_bytes(p) for p in m.parts)
    bias = getattr(m, "bias", None)
    if bias is None:
        bias = getattr(m, "bias_f32", None)
    return int(getattr(m, "nbytes", 0)) + (0 if bias is None else bias.numel() * bias.element_size())


def kept_slice(m: nn.Module) -> nn.Module:
    """An ExpertSlice in the CPU's packed layout (``cpu_matrix``); any other linear as it is."""
    return cpu_matrix(m.weight, m.bias) if isinstance(m, ExpertSlice) else m
