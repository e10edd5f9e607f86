"""Triton paged attention for CUDA: decode (split over the context) and varlen prefill.

Both kernels read K/V straight from the paged cache through the block tables (no gather of the live
blocks). Imported only on the CUDA path (layers/attention.py imports it lazily), so a CPU install never
needs triton. Invariants: q/out rows have a contiguous last dim; the cache halves are
(num_blocks, block_size, Hk, D) with a contiguous last dim; the new tokens' K/V are already in the cache.
Softmax runs in base 2 (scores pre-multiplied by scale * log2(e)) with float32 statistics.

An 8-bit cache (layers/kv_quant.py) is read by the same kernels with KV8 set, through the tile loads of
kernels/triton_kv_tiles.py; the queries then stay in the model's dtype.

Attention sinks (gpt-oss, HAS_SINKS): each query head's sink logit joins its softmax's denominator and
contributes no value. A head's online softmax starts at (max = sink, sum = 1) instead of (-inf, 0), in the
first context split only, so the split decode's log-sum-exp merge counts it once.

The @triton.jit functions' parameters carry no annotations: Triton's compiler reads them from the source
and rejects any that is not a constexpr (``typing.Any`` included), which the interpreter does not check;
tests/kernels/test_triton_compile.py compiles every launch configuration for real GPU targets to catch that.
"""

from __future__ import annotations

import functools
import math

import torch
import triton
import triton.language as tl

from glassbox.kernels.attention_tiles import decode_tiles, device_capability, prefill_block_m, prefill_tiles
from glassbox.kernels.triton_kv_tiles import _scores, _values, check_cache

__all__ = ["decode_attention", "decode_splits", "prefill_attention", "prefill_block_m"]

LOG2E = 1.4426950408889634
MAX_SPLITS = 16


@triton.jit(do_not_specialize=["stride_btb"])  # table widths vary step to step: one compile for all
def _decode_kernel(  # type: ignore[no-untyped-def]
    q_ptr,
    k_ptr,
    v_ptr,
    bt_ptr,
    lens_ptr,
    out_ptr,
    part_o_ptr,
    part_lse_ptr,
    sinks_ptr,
    qk_scale,
    window,
    num_q_heads,
    stride_qb,
    stride_qh,
    stride_ob,
    stride_oh,
    stride_kb,
    stride_kt,
    stride_kh,
    stride_btb,
    GROUP: tl.constexpr,
    BLOCK_G: tl.constexpr,
    HEAD_DIM: tl.constexpr,
    BLOCK_D: tl.constexpr,
    BLOCK_SIZE: tl.constexpr,
    BLOCK_N: tl.constexpr,
    NUM_SPLITS: tl.constexpr,
    USE_WINDOW: tl.constexpr,
    IEEE: tl.constexpr,
    KV8: tl.constexpr,
    HAS_SINKS: tl.constexpr,
) -> None:
    # grid (B, Hk, NUM_SPLITS): one program = the GROUP query heads of one kv head, one slice of context
    b = tl.program_id(0)
    kvh = tl.program_id(1)
    split = tl.program_id(2)
    ctx = tl.load(lens_ptr + b).to(tl.int32)  # tokens incl. the new one; 0 for a padded row
    lo = 0
    if USE_WINDOW:
        lo = tl.maximum(ctx - window, 0)
    per = tl.cdiv(tl.cdiv(ctx - lo, NUM_SPLITS), BLOCK_N) * BLOCK_N  # tokens per split, BLOCK_N multiple
    start = lo + split * per
    end = tl.minimum(start + per, ctx)

    g = tl.arange(0, BLOCK_G)
    d = tl.arange(0, BLOCK_D)
    heads = kvh * GROUP + g
    gmask = g < GROUP
    dmask = d < HEAD_DIM
    q = tl.load(
        q_ptr + b.to(tl.int64) * stride_qb + heads[:, None] * stride_qh + d[None, :],
        mask=gmask[:, None] & dmask[None, :],
        other=0.0,
    )  # (BLOCK_G, BLOCK_D)
    m_i = tl.full([BLOCK_G], float("-inf"), tl.float32)
    l_i = tl.zeros([BLOCK_G], tl.float32)
    if HAS_SINKS:  # split 0 starts from each head's sink (base 2): (max, sum) = (sink, 1)
        sink = tl.load(sinks_ptr + heads, mask=gmask, other=0.0).to(tl.float32) * 1.4426950408889634
        m_i = tl.where(split == 0, sink, m_i)
        l_i = tl.where(split == 0, 1.0, l_i)
    acc = tl.zeros([BLOCK_G, BLOCK_D], tl.float32)
    bt_row = bt_ptr + b.to(tl.int64) * stride_btb
    for t0 in range(start, end, BLOCK_N):
        t = t0 + tl.arange(0, BLOCK_N)
        tmask = t < end
        blk = tl.load(bt_row + t // BLOCK_SIZE, mask=tmask, other=0).to(tl.int64)
        off = blk * stride_kb + (t % BLOCK_SIZE) * stride_kt + kvh * stride_kh  # (BLOCK_N,)
        kv_mask = tmask[:, None] & dmask[None, :]
        s = _scores(q, k_ptr, off, d, tmask, kv_mask, HEAD_DIM, IEEE, KV8)
        s = tl.where(tmask[None, :], s * qk_scale, float("-inf"))  # (BLOCK_G, BLOCK_N)
        m_new = tl.maximum(m_i, tl.max(s, 1))  # finite: every tile holds a valid token
        p = tl.math.exp2(s - m_new[:, None])
        alpha = tl.math.exp2(m_i - m_new)
        l_i = l_i * alpha + tl.sum(p, 1)
        v = _values(v_ptr, off, d, tmask, kv_mask, q.dtype, HEAD_DIM, KV8)
        if IEEE:
            pv = tl.dot(p.to(v.dtype), v, input_precision="ieee")
        else:
            pv = tl.dot(p.to(v.dtype), v)
        acc = acc * alpha[:, None] + pv
        m_i = m_new
    o = acc / tl.where(l_i > 0, l_i, 1.0)[:, None]
    if NUM_SPLITS == 1:
        o_ptrs = out_ptr + b.to(tl.int64) * stride_ob + heads[:, None] * stride_oh + d[None, :]
        tl.store(o_ptrs, o.to(out_ptr.dtype.element_ty), mask=gmask[:, None] & dmask[None, :])
    else:
        row = (b * num_q_heads + heads).to(tl.int64) * NUM_SPLITS + split  # (BLOCK_G,)
        tl.store(part_o_ptr + row[:, None] * BLOCK_D + d[None, :], o, mask=gmask[:, None])
        lse = tl.where(l_i > 0, m_i + tl.math.log2(l_i), float("-inf"))
        tl.store(part_lse_ptr + row, lse, mask=gmask)


@triton.jit
def _reduce_kernel(  # type: ignore[no-untyped-def]
    part_o_ptr,
    part_lse_ptr,
    out_ptr,
    num_q_heads,
    stride_ob,
    stride_oh,
    HEAD_DIM: tl.constexpr,
    BLOCK_D: tl.constexpr,
    NUM_SPLITS: tl.constexpr,
) -> None:
    # grid (B, Hq): merge the splits' normalized partial outputs by their log-sum-exp weights
    b = tl.program_id(0)
    h = tl.program_id(1)
    s = tl.arange(0, NUM_SPLITS)
    d = tl.arange(0, BLOCK_D)
    row = (b * num_q_heads + h).to(tl.int64) * NUM_SPLITS + s  # (NUM_SPLITS,)
    lse = tl.load(part_lse_ptr + row)
    m = tl.max(lse, 0)
    m = tl.where(m == float("-inf"), 0.0, m)
    w = tl.math.exp2(lse - m)  # 0 for empty splits
    o = tl.load(part_o_ptr + row[:, None] * BLOCK_D + d[None, :])  # (NUM_SPLITS, BLOCK_D)
    total = tl.sum(w, 0)
    res = tl.sum(w[:, None] * o, 0) / tl.where(total > 0, total, 1.0)
    o_ptrs = out_ptr + b.to(tl.int64) * stride_ob + h * stride_oh + d
    tl.store(o_ptrs, res.to(out_ptr.dtype.element_ty), mask=d < HEAD_DIM)


@triton.jit
def _attend(  # type: ignore[no-untyped-def]
    q,
    qpos,
    m_i,
    l_i,
    acc,
    k_ptr,
    v_ptr,
    bt_row,
    kv_head_off,
    t_lo,
    t_hi,
    qk_scale,
    window,
    stride_kb,
    stride_kt,
    HEAD_DIM: tl.constexpr,
    BLOCK_D: tl.constexpr,
    BLOCK_SIZE: tl.constexpr,
    BLOCK_N: tl.constexpr,
    CAUSAL: tl.constexpr,
    USE_WINDOW: tl.constexpr,
    IEEE: tl.constexpr,
    KV8: tl.constexpr,
):
    # online softmax of q (BLOCK_M, BLOCK_D) over keys [t_lo, t_hi); CAUSAL masks keys after each query
    d = tl.arange(0, BLOCK_D)
    dmask = d < HEAD_DIM
    for t0 in range(t_lo, t_hi, BLOCK_N):
        t = t0 + tl.arange(0, BLOCK_N)
        tmask = t < t_hi
        blk = tl.load(bt_row + t // BLOCK_SIZE, mask=tmask, other=0).to(tl.int64)
        off = blk * stride_kb + (t % BLOCK_SIZE) * stride_kt + kv_head_off
        kv_mask = tmask[:, None] & dmask[None, :]
        s = _scores(q, k_ptr, off, d, tmask, kv_mask, HEAD_DIM, IEEE, KV8)
        allowed = tmask[None, :]
        if CAUSAL:
            allowed = allowed & (t[None, :] <= qpos[:, None])
        if USE_WINDOW:
            allowed = allowed & (t[None, :] > qpos[:, None] - window)
        s = tl.where(allowed, s * qk_scale, float("-inf"))  # (BLOCK_M, BLOCK_N)
        m_new = tl.maximum(m_i, tl.max(s, 1))
        m_safe = tl.where(m_new == float("-inf"), 0.0, m_new)  # a row may see no key in this tile
        p = tl.math.exp2(s - m_safe[:, None])
        alpha = tl.math.exp2(m_i - m_safe)
        l_i = l_i * alpha + tl.sum(p, 1)
        v = _values(v_ptr, off, d, tmask, kv_mask, q.dtype, HEAD_DIM, KV8)
        if IEEE:
            pv = tl.dot(p.to(v.dtype), v, input_precision="ieee")
        else:
            pv = tl.dot(p.to(v.dtype), v)
        acc = acc * alpha[:, None] + pv
        m_i = m_new
    return m_i, l_i, acc


@triton.jit(do_not_specialize=["stride_btb"])
def _prefill_kernel(  # type: ignore[no-untyped-def]
    q_ptr,
    k_ptr,
    v_ptr,
    out_ptr,
    bt_ptr,
    tile_seq_ptr,
    tile_m_ptr,
    q_start_ptr,
    q_len_ptr,
    ctx_ptr,
    sinks_ptr,
    qk_scale,
    window,
    stride_qt,
    stride_qh,
    stride_ot,
    stride_oh,
    stride_kb,
    stride_kt,
    stride_kh,
    stride_btb,
    GROUP: tl.constexpr,
    HEAD_DIM: tl.constexpr,
    BLOCK_D: tl.constexpr,
    BLOCK_SIZE: tl.constexpr,
    BLOCK_M: tl.constexpr,
    BLOCK_N: tl.constexpr,
    USE_WINDOW: tl.constexpr,
    IEEE: tl.constexpr,
    KV8: tl.constexpr,
    HAS_SINKS: tl.constexpr,
) -> None:
    # grid (num_tiles, Hq): BLOCK_M query rows of one sequence for one query head
    tile = tl.program_id(0)
    h = tl.program_id(1)
    seq = tl.load(tile_seq_ptr + tile)
    m0 = tl.load(tile_m_ptr + tile)
    q_start = tl.load(q_start_ptr + seq)
    q_len = tl.load(q_len_ptr + seq)
    ctx0 = tl.load(ctx_ptr + seq)  # tokens cached before this step
    rows = m0 + tl.arange(0, BLOCK_M)
    rmask = rows < q_len
    qpos = ctx0 + rows  # absolute positions of the queries
    d = tl.arange(0, BLOCK_D)
    dmask = d < HEAD_DIM
    q_rows = (q_start + rows).to(tl.int64)
    q = tl.load(
        q_ptr + q_rows[:, None] * stride_qt + h * stride_qh + d[None, :],
        mask=rmask[:, None] & dmask[None, :],
        other=0.0,
    )
    m_i = tl.full([BLOCK_M], float("-inf"), tl.float32)
    l_i = tl.zeros([BLOCK_M], tl.float32)
    if HAS_SINKS:  # the head's sink (base 2) as the softmax's start: (max, sum) = (sink, 1)
        m_i = tl.zeros([BLOCK_M], tl.float32) + tl.load(sinks_ptr + h).to(tl.float32) * 1.4426950408889634
        l_i = l_i + 1.0
    acc = tl.zeros([BLOCK_M, BLOCK_D], tl.float32)
    bt_row = bt_ptr + seq.to(tl.int64) * stride_btb
    kv_head_off = (h // GROUP) * stride_kh
    mid = ctx0 + m0  # keys before mid precede every query of the tile: no causal mask needed
    hi = ctx0 + tl.minimum(m0 + BLOCK_M, q_len)
    lo = 0
    if USE_WINDOW:
        lo = tl.maximum(mid - window + 1, 0) // BLOCK_N * BLOCK_N
    m_i, l_i, acc = _attend(
        q, qpos, m_i, l_i, acc, k_ptr, v_ptr, bt_row, kv_head_off, lo, mid, qk_scale, window,
        stride_kb, stride_kt, HEAD_DIM, BLOCK_D, BLOCK_SIZE, BLOCK_N, False, USE_WINDOW, IEEE, KV8,
    )  # fmt: skip
    m_i, l_i, acc = _attend(
        q, qpos, m_i, l_i, acc, k_ptr, v_ptr, bt_row, kv_head_off, mid, hi, qk_scale, window,
        stride_kb, stride_kt, HEAD_DIM, BLOCK_D, BLOCK_SIZE, BLOCK_N, True, USE_WINDOW, IEEE, KV8,
    )  # fmt: skip
    o = acc / tl.where(l_i > 0, l_i, 1.0)[:, None]
    o_ptrs = out_ptr + q_rows[:, None] * stride_ot + h * stride_oh + d[None, :]
    tl.store(o_ptrs, o.to(out_ptr.dtype.element_ty), mask=rmask[:, None] & dmask[None, :])


# -- host side ----------------------------------------------------------------------------------------
def _pow2(n: int) -> int:
    return 1 << max(0, math.ceil(math.log2(max(1, n))))


@functools.cache
def _cuda_sms(index: int) -> int:
    return int(torch.cuda.get_device_properties(index).multi_processor_count)


def num_sms(device: torch.device) -> int:
    """Multiprocessors of ``device``; 1 for a CPU device (triton's interpreter)."""
    if device.type != "cuda":
        return 1
    return _cuda_sms(device.index if device.index is not None else torch.cuda.current_device())


def decode_splits(batch: int, num_kv_heads: int, device: torch.device) -> int:
    """Context splits per (row, kv head): enough programs to cover the SMs, a power of two <= 16.

    Depends only on the batch shape, so a CUDA graph captured for ``batch`` keeps its launch valid.
    """
    return min(MAX_SPLITS, _pow2(-(-num_sms(device) // max(1, batch * num_kv_heads))))


def decode_attention(
    q: torch.Tensor,  # (B, Hq, D)
    k_cache: torch.Tensor,  # (num_blocks, block_size, Hk, D), or (..., D + 4) 8-bit rows
    v_cache: torch.Tensor,
    block_tables: torch.Tensor,  # (B, max_blocks) int32/int64
    context_lens: torch.Tensor,  # (B,) tokens incl. the new one; 0 = padded row (output 0)
    scale: float,
    sliding_window: int | None,
    out: torch.Tensor,  # (B, Hq, D) written
    num_splits: int | None = None,
    block_n: int | None = None,  # keys per tile; None: attention_tiles.decode_tiles (benchmarks sweep it)
    sinks: torch.Tensor | None = None,  # (Hq,) attention sinks (gpt-oss), any float dtype
) -> None:
    batch, hq, d = q.shape
    _, bs, hk, _ = k_cache.shape
    assert q.stride(2) == 1 and out.stride(2) == 1 and k_cache.stride() == v_cache.stride()
    kv8 = check_cache(q, k_cache)
    splits = num_splits or decode_splits(batch, hk, q.device)
    block_d = max(16, _pow2(d))
    tiles = decode_tiles(d, q.dtype, kv8)
    if splits > 1:
        part_o = torch.empty((batch, hq, splits, block_d), dtype=torch.float32, device=q.device)
        part_lse = torch.empty((batch, hq, splits), dtype=torch.float32, device=q.device)
    else:
        part_o = part_lse = out  # unused
    _decode_kernel[(batch, hk, splits)](
        q, k_cache, v_cache, block_tables, context_lens, out, part_o, part_lse,
        q if sinks is None else sinks, scale * LOG2E, sliding_window or 0, hq,
        q.stride(0), q.stride(1), out.stride(0), out.stride(1),
        k_cache.stride(0), k_cache.stride(1), k_cache.stride(2), block_tables.stride(0),
        GROUP=hq // hk, BLOCK_G=max(16, _pow2(hq // hk)), HEAD_DIM=d, BLOCK_D=block_d,
        BLOCK_SIZE=bs, BLOCK_N=block_n or tiles.block_n, NUM_SPLITS=splits,
        USE_WINDOW=sliding_window is not None, IEEE=q.dtype == torch.float32, KV8=kv8,
        HAS_SINKS=sinks is not None, num_warps=tiles.num_warps, num_stages=tiles.num_stages,
    )  # fmt: skip
    if splits > 1:
        _reduce_kernel[(batch, hq)](
            part_o, part_lse, out, hq, out.stride(0), out.stride(1),
            HEAD_DIM=d, BLOCK_D=block_d, NUM_SPLITS=splits, num_warps=4,
        )  # fmt: skip


def prefill_attention(
    q: torch.Tensor,  # (T, Hq, D) the prefill rows
    k_cache: torch.Tensor,  # (num_blocks, block_size, Hk, D), or (..., D + 4) 8-bit rows
    v_cache: torch.Tensor,
    block_tables: torch.Tensor,  # (P, max_blocks) one row per prefill sequence
    tile_seq: torch.Tensor,  # (num_tiles,) int32: the sequence of each BLOCK_M tile
    tile_m: torch.Tensor,  # (num_tiles,) int32: the tile's first row within its sequence
    q_start: torch.Tensor,  # (P,) int32: first row of each sequence in q
    q_len: torch.Tensor,  # (P,) int32
    ctx: torch.Tensor,  # (P,) int32: tokens cached before this step
    scale: float,
    sliding_window: int | None,
    out: torch.Tensor,  # (T, Hq, D) written
    block_m: int,  # the rows per tile the layout was built with: attention_tiles.prefill_block_m
    sinks: torch.Tensor | None = None,  # (Hq,) attention sinks (gpt-oss), any float dtype
) -> None:
    _, hq, d = q.shape
    _, bs, hk, _ = k_cache.shape
    assert q.stride(2) == 1 and out.stride(2) == 1 and k_cache.stride() == v_cache.stride()
    kv8 = check_cache(q, k_cache)
    block_d = max(16, _pow2(d))
    tiles = prefill_tiles(d, q.dtype, device_capability(q.device), kv8)
    assert block_m == tiles.block_m, f"prefill layout built for {block_m}-row tiles, the kernel takes {tiles}"
    _prefill_kernel[(tile_seq.shape[0], hq)](
        q, k_cache, v_cache, out, block_tables, tile_seq, tile_m, q_start, q_len, ctx,
        q if sinks is None else sinks, scale * LOG2E, sliding_window or 0,
        q.stride(0), q.stride(1), out.stride(0), out.stride(1),
        k_cache.stride(0), k_cache.stride(1), k_cache.stride(2), block_tables.stride(0),
        GROUP=hq // hk, HEAD_DIM=d, BLOCK_D=block_d, BLOCK_SIZE=bs, BLOCK_M=block_m,
        BLOCK_N=tiles.block_n, USE_WINDOW=sliding_window is not None,
        IEEE=q.dtype == torch.float32, KV8=kv8, HAS_SINKS=sinks is not None, num_warps=tiles.num_warps,
        num_stages=tiles.num_stages,
    )  # fmt: skip
