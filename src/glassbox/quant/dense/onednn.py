"""CPU linear layers with packed weights: the same math as nn.Linear, laid out for fast GEMV/GEMM.

On CPUs, torch's plain bf16 ``F.linear`` reads weights at a fraction of memory bandwidth when a decode
step has one or a few rows; oneDNN's blocked weight layout runs the same product about twice as fast, and
glassbox's own tiles (quant/dense/bf16_tiles.py) faster still where AVX-512 BF16 runs them (``cpu_matrix``).
"""

from __future__ import annotations

import logging

import torch
from torch import nn

from glassbox.quant.dense.bf16_tiles import TiledBf16Linear, tiled_available
from glassbox.quant.walk import swap_layers

logger = logging.getLogger(__name__)


class PackedLinear(nn.Module):
    """y = x W^T + b with W held in oneDNN's blocked layout (CPU only)."""

    def __init__(self, linear: nn.Linear, batch_hint: int = 1) -> None:
        super().__init__()
        w = linear.weight.detach()
        self.in_features, self.out_features = linear.in_features, linear.out_features
        self.packed = torch.ops.mkldnn._reorder_linear_weight(w.contiguous(), batch_hint)
        self.bias = None if linear.bias is None else linear.bias.detach()
        self.nbytes = w.numel() * w.element_size()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.ops.mkldnn._linear_pointwise(x, self.packed, self.bias, "none", [], "")


def packing_available(dtype: torch.dtype) -> bool:
    """Whether this torch build packs and runs ``dtype`` linears through oneDNN on this CPU."""
    if not torch.backends.mkldnn.is_available():
        return False
    try:
        lin = nn.Linear(32, 8, bias=True).to(dtype)
        x = torch.randn(3, 32, dtype=dtype)
        y = PackedLinear(lin)(x)
        ref = nn.functional.linear(x.float(), lin.weight.float(), lin.bias.float())
        return bool(torch.allclose(y.float(), ref, rtol=0.05, atol=0.05))
    except (RuntimeError, AttributeError, NotImplementedError) as e:
        logger.info("oneDNN weight packing unavailable: %s", e)
        return False


def pack_linears(model: nn.Module) -> int:
    """Replace every nn.Linear of a CPU model (and tensor-parallel one: ``in_place_of`` keeps its collective
    around the packed shard) with its weight in the fastest layout here (``cpu_matrix``), and let each
    module that holds its matrices otherwise (a ``pack_weights()`` method: MoE experts) pack them; returns
    how many matrices."""

    def own(module: nn.Module) -> int:
        pack = getattr(module, "pack_weights", None)
        return int(pack()) if callable(pack) else 0

    return swap_layers(model, linear=lambda layer, bias: cpu_matrix(layer.weight, bias), own=own)


def packed_matrix(w: torch.Tensor, bias: torch.Tensor | None = None) -> PackedLinear:
    """A PackedLinear of the matrix ``w`` (out, in), with ``bias`` (out,) or none."""
    with torch.device("meta"):
        linear = nn.Linear(w.shape[1], w.shape[0], bias=False)
    linear.weight = nn.Parameter(w, requires_grad=False)
    if bias is not None:
        linear.bias = nn.Parameter(bias, requires_grad=False)
    return PackedLinear(linear)


CpuMatrix = PackedLinear | TiledBf16Linear


def cpu_matrix(w: torch.Tensor, bias: torch.Tensor | None = None) -> CpuMatrix:
    """A CPU linear of the matrix ``w`` (out, in) in the fastest layout here: bf16 in glassbox's tiles
    (quant/dense/bf16_tiles.py) where that kernel runs, else oneDNN's packed layout."""
    if w.dtype == torch.bfloat16 and w.shape[1] % 2 == 0 and tiled_available():
        return TiledBf16Linear(w, bias)
    return packed_matrix(w.detach(), None if bias is None else bias.detach())


class ConcatLinear(nn.Module):
    """Linears side by side that cannot share one weight (block weights of different bits): their
    outputs concatenated along the last dim."""

    def __init__(self, parts: list[nn.Module]) -> None:
        super().__init__()
        self.parts = nn.ModuleList(parts)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.cat([p(x) for p in self.parts], dim=-1)


def concat_linears(*linears: nn.Module) -> nn.Module:
    """One module computing ``linears`` side by side, so that ``fused(x).split([out_features ...], -1)``
    gives each one's output: nn.Linear weights (and biases) concatenated along the output dim, block
    weights stacked by rows when they share their bits, FP8 weights when their scales stack
    (layers/fp8_weights.concat), FP4 weights when they share their format, else a ConcatLinear. All share
    in_features and either all carry a bias or none does."""
    from glassbox.quant.blocks.linear import BlockQuantLinear, concat_weights
    from glassbox.quant.fp4.linear import FP4Linear
    from glassbox.quant.fp4.weights import concat as concat_fp4
    from glassbox.quant.fp8.linear import Fp8Linear, concat_fp8

    if all(isinstance(lin, Fp8Linear) for lin in linears):
        return concat_fp8([lin for lin in linears if isinstance(lin, Fp8Linear)]) or ConcatLinear(
            list(linears)
        )
    fp4 = [lin for lin in linears if isinstance(lin, FP4Linear)]
    if fp4 and len(fp4) == len(linears):  # MXFP4 / NVFP4 of one kind stack by rows
        weights = concat_fp4([lin.w for lin in fp4])
        biases = [lin.bias for lin in fp4]
        bias = None if biases[0] is None else torch.cat([b for b in biases if b is not None])
        return FP4Linear(weights, bias) if weights is not None else ConcatLinear(list(linears))
    quantized = [lin for lin in linears if isinstance(lin, BlockQuantLinear)]
    if len(quantized) == len(linears):
        blocks = concat_weights([lin.w for lin in quantized])
        biases = [lin.bias for lin in quantized]
        bias = None if biases[0] is None else torch.cat([b for b in biases if b is not None])
        return BlockQuantLinear(blocks, bias) if blocks is not None else ConcatLinear(list(linears))
    if not all(type(lin) is nn.Linear for lin in linears):
        return ConcatLinear(list(linears))
    dense = [lin for lin in linears if isinstance(lin, nn.Linear)]
    first = dense[0]
    fused = nn.Linear(
        first.in_features,
        sum(lin.out_features for lin in dense),
        bias=first.bias is not None,
        device=first.weight.device,
        dtype=first.weight.dtype,
    )
    with torch.no_grad():
        fused.weight.copy_(torch.cat([lin.weight for lin in dense]))
        if fused.bias is not None:
            fused.bias.copy_(torch.cat([lin.bias for lin in dense if lin.bias is not None]))
    return fused
