"""``--quantization fp8``: a 16/32-bit model's linears quantized at load to FP8 (E4M3) with one float32
scale per output channel, as llm-compressor's FP8_DYNAMIC scheme stores them (and vLLM's ``--quantization
fp8`` computes them, there per tensor): s = max|w_row| / 448, code = e4m3(w / s), rounded to nearest even by
torch's float8 cast, so no weight saturates. Every ``nn.Linear`` but the LM head becomes an ``Fp8Linear``
(quant/fp8/linear.py: the CPU's E4M3 GEMV, CUDA's Triton kernels); embeddings, the LM head, routers and
MoE routed experts are quantized too on the CPU (held per expert, as FP8 checkpoints' are); off the CPU
they stay in the model's dtype (the fused Triton MoE takes float parameters).

W8A8 (``scaled_mm_rows``): the activations quantized per row (token) the same way, s_x = max|x_row| / 448,
then ``torch._scaled_mm`` with the weights' per-channel scales: y = (e4m3(x / s_x) . e4m3(W)^T) s_x s_w,
FP8 tensor cores on CUDA devices of compute capability 8.9 or more (2x bf16's FLOP/s on an H100).
quant/fp8/linear.py takes it on CUDA for bf16 steps of ``W8A8_MIN_ROWS`` rows or more (prompts, large
batches) with per-channel or per-tensor weight scales, where ``w8a8_available`` says the device runs it;
``GLASSBOX_FP8_W8A8=0`` keeps the weight-only kernels there too. Not yet measured on a GPU.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Callable

import torch
from torch import nn

from glassbox.quant.formats import WeightFormat
from glassbox.quant.fp8.weights import Fp8Weights
from glassbox.quant.walk import cuts_k, swap_layers

logger = logging.getLogger(__name__)

E4M3_MAX = 448.0  # torch.finfo(torch.float8_e4m3fn).max
# W8A8 from this many rows: more than a decode step's 16, which the split-K GEMV reads at the weights' bytes
# (kernels/triton_block_linear.DECODE_ROWS)
W8A8_MIN_ROWS = 17


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
    from glassbox.quant.fp8.linear import Fp8Linear

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


def quantize_rows_fp8(x: torch.Tensor, amax: torch.Tensor | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """(M, K) activations as (E4M3 (M, K), float32 scales (M, 1)): each row scaled to max |x| = 448 (or to
    ``amax`` (M, 1), the largest magnitudes of rows that ``x`` holds part of)."""
    xf = x.float()
    amax = xf.abs().amax(dim=1, keepdim=True) if amax is None else amax
    scale = torch.where(amax > 0, amax / E4M3_MAX, torch.ones_like(amax))
    return (xf / scale).clamp(-E4M3_MAX, E4M3_MAX).to(torch.float8_e4m3fn), scale


def row_scales(w: Fp8Weights) -> torch.Tensor | None:
    """The weights' scales as one per output channel, (1, N) float32, or None for block scales (a scale
    that changes along K: ``_scaled_mm``'s row-wise scaling cannot carry it)."""
    n, k = w.codes.shape
    if w.block_cols < k:
        return None
    if w.block_rows == 1:
        return w.scales.reshape(1, n).contiguous()
    return w.scales.repeat_interleave(w.block_rows, 0)[:n].reshape(1, n).contiguous()


def scaled_mm_rows(
    x: torch.Tensor, codes: torch.Tensor, scales: torch.Tensor, bias: torch.Tensor | None
) -> torch.Tensor:
    """x (M, K) bf16 times the E4M3 weights (N, K) with per-channel ``scales`` (1, N), activations
    quantized per row: (M, N) bf16. ``torch._scaled_mm`` on the device of ``x`` (the CPU's build runs it
    too: the tests' reference of the arithmetic)."""
    q, sx = quantize_rows_fp8(x)
    y = torch._scaled_mm(
        q, codes.view(torch.float8_e4m3fn).t(), scale_a=sx, scale_b=scales, out_dtype=torch.bfloat16
    )
    return y if bias is None else y + bias.to(y.dtype)


_AVAILABLE: dict[torch.device, bool] = {}


def w8a8_available(device: torch.device) -> bool:
    """Whether FP8 tensor cores run ``_scaled_mm`` with row-wise scales here (CUDA, compute capability 8.9
    or more, and a first small product runs: torch builds differ by device) and ``GLASSBOX_FP8_W8A8`` does
    not turn it off. Decided once per device, outside CUDA graph capture (inside one before that: no)."""
    if device.type != "cuda" or os.environ.get("GLASSBOX_FP8_W8A8", "1") == "0":
        return False
    if device not in _AVAILABLE:
        if torch.cuda.is_current_stream_capturing():
            return False
        ok = torch.cuda.get_device_capability(device) >= (8, 9)
        if ok:
            try:
                x = torch.ones(32, 32, dtype=torch.bfloat16, device=device)
                w = torch.ones(32, 32, device=device).to(torch.float8_e4m3fn).view(torch.uint8)
                y = scaled_mm_rows(x, w, torch.ones(1, 32, device=device), None)
                ok = bool((y == 32).all())
            except RuntimeError as e:  # this build or device has no row-wise FP8 GEMM
                logger.warning("FP8 prompt rows stay weight-only on %s: torch._scaled_mm: %s", device, e)
                ok = False
        _AVAILABLE[device] = ok
    return _AVAILABLE[device]
