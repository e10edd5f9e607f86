"""The K/V tile loads of the triton attention kernels (kernels/triton_attention.py): a 16-bit cache's rows
as they are, or an 8-bit cache's (layers/kv_quant.py) codes and scales.

An 8-bit cache half is (num_blocks, block_size, Hk, D + 4) of int8 or float8_e4m3fn: each (token, head) row
holds D codes, then the 4 bytes of its float32 scale s, and stands for s * code. With KV8 set, a K tile's
codes enter the dot in the queries' dtype (the model's: int8 and e4m3 codes are exact in bf16, fp16 and
fp32) and each key's scale multiplies its score column afterwards; a V tile is dequantized (code * s in
float32, rounded to the queries' dtype, as the torch reference rounds it) before its dot with the
probabilities. Scores, softmax and accumulation stay float32 either way. With KV8 unset the loads are the
16-bit kernels' own.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl


@triton.jit
def _scores(  # type: ignore[no-untyped-def]
    q,
    k_ptr,
    off,
    d,
    tmask,
    kv_mask,
    HEAD_DIM: tl.constexpr,
    IEEE: tl.constexpr,
    KV8: tl.constexpr,
):
    # q (rows, BLOCK_D) . the keys whose rows start at ``off`` (BLOCK_N,): (rows, BLOCK_N), not yet scaled
    # by the softmax scale
    if KV8:
        off = tl.multiple_of(off, 4)  # rows of D + 4 bytes with D % 4 == 0 (check_cache)
    k = tl.load(k_ptr + off[:, None] + d[None, :], mask=kv_mask, other=0.0)  # (BLOCK_N, BLOCK_D)
    if KV8:
        k = k.to(q.dtype)
    if IEEE:
        s = tl.dot(q, tl.trans(k), input_precision="ieee")
    else:
        s = tl.dot(q, tl.trans(k))
    if KV8:  # each key's float32 scale, the last 4 bytes of its row, scales its column
        scale = tl.load((k_ptr + off + HEAD_DIM).to(tl.pointer_type(tl.float32)), mask=tmask, other=0.0)
        s = s * scale[None, :]
    return s


@triton.jit
def _values(  # type: ignore[no-untyped-def]
    v_ptr,
    off,
    d,
    tmask,
    kv_mask,
    dtype: tl.constexpr,
    HEAD_DIM: tl.constexpr,
    KV8: tl.constexpr,
):
    # the V tile (BLOCK_N, BLOCK_D) of the rows at ``off``: the cache's own, or 8-bit rows as ``dtype``
    if KV8:
        off = tl.multiple_of(off, 4)
    v = tl.load(v_ptr + off[:, None] + d[None, :], mask=kv_mask, other=0.0)
    if KV8:
        scale = tl.load((v_ptr + off + HEAD_DIM).to(tl.pointer_type(tl.float32)), mask=tmask, other=0.0)
        v = (v.to(tl.float32) * scale[:, None]).to(dtype)
    return v


def check_cache(q: torch.Tensor, k_cache: torch.Tensor) -> bool:
    """Whether ``k_cache`` holds 8-bit rows, checking that it fits the queries ``q`` (..., D): a 16-bit
    cache takes queries of its own dtype and width; an 8-bit one queries of any dtype, rows of D + 4 and
    D % 4 == 0 (each row's scale is read as an aligned float32)."""
    d = q.shape[-1]
    if k_cache.element_size() != 1:
        assert k_cache.dtype == q.dtype and k_cache.shape[-1] == d, (q.dtype, q.shape, k_cache.shape)
        return False
    assert k_cache.dtype in (torch.int8, torch.float8_e4m3fn) and k_cache.shape[-1] == d + 4, k_cache.shape
    if d % 4:
        raise ValueError(f"the triton kernels read an 8-bit KV cache for head dims divisible by 4, not {d}")
    return True
