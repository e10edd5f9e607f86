"""The 8-bit KV cache (``--kv-cache-dtype int8|fp8``): its layout, and its arithmetic in PyTorch ops, which
is the torch backend's path and the reference of kernels/cpu_kv8.c.

Such a cache is a tensor of that dtype (int8, or float8_e4m3fn) of shape (2, num_blocks, block_size, Hk,
D + 4): each (token, head) row holds D codes, then the 4 bytes of its float32 scale s = max|x| / 127 (int8)
or max|x| / 448 (fp8; 1 for an all-zero row). Codes are round-half-even(x / s), or x / s converted to fp8
as torch converts; a value is read back as s * code. A scale per token and head keeps an outlier head or
token from costing the others their precision; the cost is 4 bytes per D codes.
"""

from __future__ import annotations

import torch

SCALE_BYTES = 4
QMAX = {torch.int8: 127.0, torch.float8_e4m3fn: 448.0}  # the largest code magnitude of each 8-bit dtype
KV8_DTYPES = tuple(QMAX)


def is_8bit(cache: torch.Tensor) -> bool:
    return cache.dtype in QMAX


def row_width(head_dim: int, dtype: torch.dtype) -> int:
    """Elements of a cache row of one (token, head): D, or D + 4 for an 8-bit cache."""
    return head_dim + SCALE_BYTES if dtype in QMAX else head_dim


def quantize(x: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """(..., D) values -> (..., D + 4) cache rows of ``dtype`` (int8 or float8_e4m3fn)."""
    xf = x.float()
    amax = xf.abs().amax(dim=-1, keepdim=True)
    scale = torch.where(amax > 0, amax / QMAX[dtype], torch.ones_like(amax))
    y = xf / scale
    codes = y.round().clamp(-127, 127).to(torch.int8) if dtype == torch.int8 else y.to(dtype)
    rows = torch.empty(*x.shape[:-1], x.shape[-1] + SCALE_BYTES, dtype=torch.uint8, device=x.device)
    rows[..., : x.shape[-1]] = codes.view(torch.uint8)
    rows[..., x.shape[-1] :] = scale.view(torch.uint8)
    return rows.view(dtype)


def dequantize(rows: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """(..., D + 4) cache rows -> (..., D) values s * code in ``dtype`` (computed in float32)."""
    raw = rows.view(torch.uint8)
    d = rows.shape[-1] - SCALE_BYTES
    scale = raw[..., d:].contiguous().view(torch.float32)  # (..., 1)
    return (raw[..., :d].view(rows.dtype).float() * scale).to(dtype)


def store(cache_half: torch.Tensor, rows: torch.Tensor, slots: torch.Tensor) -> None:
    """cache_half (num_blocks, block_size, Hk, W)[slots] <- rows (T, Hk, W), moved as bytes (index_copy_
    of float8 tensors is not implemented everywhere)."""
    nb, bs, hk, w = cache_half.shape
    cache_half.view(torch.uint8).view(nb * bs, hk, w).index_copy_(0, slots, rows.view(torch.uint8))


def select_blocks(cache_half: torch.Tensor, blocks: torch.Tensor) -> torch.Tensor:
    """cache_half[blocks] (index_select along the block dimension), moved as bytes."""
    return cache_half.view(torch.uint8).index_select(0, blocks).view(cache_half.dtype)
