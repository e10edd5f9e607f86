"""``--quantization fp8``: a 16/32-bit model's linears quantized at load to FP8 (E4M3) with one float32
scale per output channel, as llm-compressor's FP8_DYNAMIC scheme stores them (and vLLM's ``--quantization
fp8`` computes them, there per tensor): s = max|w_row| / 448, code = e4m3(w / s), rounded to nearest even by
torch's float8 cast, so no weight saturates. Every ``nn.Linear`` but the LM head becomes an ``Fp8Linear``
(quant/fp8/linear.py: the CPU's E4M3 GEMV, CUDA's Triton kernels); embeddings, the LM head, routers and
MoE routed experts are quantized too on the CPU (held per expert, as FP8 checkpoints' are); off the CPU
they stay in the model's dtype (the fused Triton MoE takes float parameters). W8A8 prompt rows:
quant/fp8/w8a8.py.
"""

from __future__ import annotations

from collections.abc import Callable

import torch
from torch import nn

from glassbox.quant.formats import WeightFormat
from glassbox.quant.fp8.linear import Fp8Linear
from glassbox.quant.fp8.w8a8 import quantize_rows_fp8
from glassbox.quant.fp8.weights import Fp8Weights
from glassbox.quant.walk import cuts_k, swap_layers


def quantize_fp8(weight: torch.Tensor, amax: torch.Tensor | None = None) -> Fp8Weights:
    """(N, K) weights as E4M3 codes with a float32 scale per row (a row of zeros gets scale 1); ``amax``
    (N, 1): each row's largest magnitude where this is part of a row (a row-parallel shard: the whole row's)."""
    codes, scale = quantize_rows_fp8(weight.detach(), amax)  # rounded as the W8A8 path rounds activation rows
    return Fp8Weights(
        codes.view(torch.uint8).contiguous(), scale.contiguous(), 1, weight.shape[1], "FP8 per-channel"
    )


Across = Callable[[torch.Tensor], torch.Tensor]  # a value's largest over the tensor-parallel ranks


def quantize_model_fp8(
    model: nn.Module, fmt: WeightFormat, experts: bool = False, across: Across | None = None
) -> int:
    """Every ``nn.Linear`` but the LM head in per-channel FP8 (routers are ``RouterLinear`` and stay); with
    ``experts`` (the CPU's held experts) the routed experts too (models/moe.py ``quantize_experts``).
    ``across`` (tensor parallelism: ``distributed.load_max``): the scales of layers that hold part of each
    row (row-parallel o/down, the experts' down) from the whole rows' largest values, so that every rank's
    codes are the whole model's. ``fmt`` is fp8's row (quant/formats.py). Returns how many matrices."""

    def fp8(w: torch.Tensor, part_rows: bool) -> Fp8Weights:
        amax = across(_row_amax(w)) if across is not None and part_rows else None
        return quantize_fp8(w, amax)

    def linear(layer: nn.Linear, bias: torch.Tensor | None) -> nn.Module:
        return Fp8Linear(fp8(layer.weight, cuts_k(layer)), bias).to(layer.weight.device)

    def own(module: nn.Module) -> int:  # under TP each expert's down holds part of its rows
        hold = getattr(module, "quantize_experts", None)
        return int(hold(lambda w: fp8(w, False), lambda w: fp8(w, True))) if experts and callable(hold) else 0

    return swap_layers(model, linear=linear, own=own, skip=frozenset({"lm_head"}))


def _row_amax(w: torch.Tensor) -> torch.Tensor:
    return w.detach().float().abs().amax(dim=1, keepdim=True)
