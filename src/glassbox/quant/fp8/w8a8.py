"""W8A8 (``scaled_mm_rows``): the activations quantized per row (token) the same way, s_x = max|x_row| / 448,
then ``torch._scaled_mm`` with the weights' per-channel scales: y = (e4m3(x / s_x) . e4m3(W)^T) s_x s_w,
FP8 tensor cores on CUDA devices of compute capability 8.9 or more (2x bf16's FLOP/s on an H100).
quant/fp8/linear.py takes it on CUDA for bf16 steps of ``W8A8_MIN_ROWS`` rows or more (prompts, large
batches) with per-channel or per-tensor weight scales, where ``w8a8_available`` says the device runs it;
``GLASSBOX_FP8_W8A8=0`` keeps the weight-only kernels there too. Not yet measured on a GPU.
"""

from __future__ import annotations

import logging
import os

import torch

from glassbox.quant.fp8.weights import Fp8Weights

logger = logging.getLogger(__name__)

E4M3_MAX = 448.0  # torch.finfo(torch.float8_e4m3fn).max
# W8A8 from this many rows: more than a decode step's 16, which the split-K GEMV reads at the weights' bytes
# (kernels/triton_block_linear.DECODE_ROWS)
W8A8_MIN_ROWS = 17


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
