"""Triton fused mixture-of-experts FFN for CUDA: grouped GEMMs over the (token, choice) pairs by expert.

The experts are the fused tensors models/moe.py holds: ``w1`` (E, 2I, H) gate and up rows, ``w2`` (E, H, I),
optional biases (E, 2I) and (E, H), in the activations' dtype (bf16, fp16 or float32). Three launches (in
decode batches), none of which waits for the host, so an eager step never synchronizes and a CUDA graph
captures them:

1. :func:`align`: the M = T k expert ids counted per expert, each expert's rows padded to whole
   ``block_m`` blocks, its blocks laid out in expert order; every pair gets its padded row (stable: an
   expert's pairs in token order) and every block its expert and live row count. Decode batches take one
   program (``_align_kernel``, one launch); more pairs the same layout from torch's sort and scans (a dozen
   launches, but no serial loop over the pairs), on the device either way. The grid of the GEMMs
   is sized on the host from shapes alone: with nz = min(E, M) experts used at most, the blocks number at
   most nz + (M - nz) // block_m (an expert of c rows takes 1 + (c - 1) // block_m); programs past the
   blocks in use return at once, and an expert no pair chose has no block: its weights are never read.
2. ``_gate_up_kernel``: per block, its rows' tokens gathered from x and multiplied by the expert's gate and
   up rows (two float32 accumulators), the biases added, the activation applied (``act(gate) * up`` over
   [gate | up] halves, or gpt-oss's clamped SwiGLU over interleaved [g0, u0, g1, u1, ...] rows), stored in
   the model's dtype at the padded rows (I wide).
3. ``_down_kernel``: per block, those rows by the expert's down matrix, the bias added, scaled by the pair's
   routing weight (float32), stored in the model's dtype at the pair's row of a (T k, H) buffer.

Then one sum over each token's k rows (torch). The tiles per row count and architecture are
:func:`moe_tiles` (compiled for sm_90 and sm_121 without spills by tests/kernels/test_triton_compile_moe.py).
Checked against ``MoEExperts.reference`` under Triton's interpreter (tests/kernels/test_triton_moe.py).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import triton
import triton.language as tl

from glassbox.kernels.attention_tiles import device_capability

__all__ = ["ACTIVATIONS", "MoeTiles", "align", "fused_moe", "max_blocks", "moe_tiles"]

ACTIVATIONS = ("silu", "swiglu")  # act(gate) * up with act = SiLU; gpt-oss's clamped SwiGLU, interleaved


@triton.jit(do_not_specialize=["num_pairs", "num_blocks"])
def _align_kernel(  # type: ignore[no-untyped-def]
    ids_ptr,
    pairs_ptr,
    block_expert_ptr,
    block_rows_ptr,
    reads_ptr,
    num_pairs,
    num_blocks,
    E_PAD: tl.constexpr,
    BLOCK_M: tl.constexpr,
    CHUNK: tl.constexpr,
    COUNT_READS: tl.constexpr,
) -> None:
    # one program: pairs and blocks CHUNK at a time against all E_PAD experts (one-hot tiles)
    e = tl.arange(0, E_PAD)
    counts = tl.zeros([E_PAD], tl.int32)
    for c0 in range(0, num_pairs, CHUNK):
        c = c0 + tl.arange(0, CHUNK)
        ids = tl.load(ids_ptr + c, mask=c < num_pairs, other=E_PAD).to(tl.int32)  # past the end: no expert
        counts += tl.sum((ids[:, None] == e[None, :]).to(tl.int32), 0)
    blocks = (counts + BLOCK_M - 1) // BLOCK_M
    block_end = tl.cumsum(blocks, 0)  # an expert's blocks are [block_end - blocks, block_end)
    block_start = block_end - blocks
    used = tl.sum(blocks, 0)
    if COUNT_READS:  # the experts whose weights this call reads, added to a running device counter
        tl.store(reads_ptr, tl.load(reads_ptr) + tl.sum((counts > 0).to(tl.int64), 0))
    for b0 in range(0, num_blocks, CHUNK):
        b = b0 + tl.arange(0, CHUNK)
        expert = tl.sum((block_end[None, :] <= b[:, None]).to(tl.int32), 1)  # the first expert ending past b
        mine = e[None, :] == expert[:, None]
        first = tl.sum(tl.where(mine, block_start[None, :], 0), 1)
        rows = tl.sum(tl.where(mine, counts[None, :], 0), 1) - (b - first) * BLOCK_M
        live = b < used
        tl.store(block_expert_ptr + b, tl.where(live, expert, -1), mask=b < num_blocks)
        tl.store(block_rows_ptr + b, tl.where(live, tl.minimum(rows, BLOCK_M), 0), mask=b < num_blocks)
    next_row = block_start * BLOCK_M  # each expert's next padded row
    for c0 in range(0, num_pairs, CHUNK):
        c = c0 + tl.arange(0, CHUNK)
        ids = tl.load(ids_ptr + c, mask=c < num_pairs, other=E_PAD).to(tl.int32)
        onehot = (ids[:, None] == e[None, :]).to(tl.int32)
        rank = tl.cumsum(onehot, 0) - onehot  # earlier pairs of the same expert in this chunk
        row = tl.sum(onehot * (next_row[None, :] + rank), 1)
        tl.store(pairs_ptr + row, c, mask=c < num_pairs)
        next_row += tl.sum(onehot, 0)


@triton.jit
def _block_rows(pairs_ptr, block_rows_ptr, blk, BLOCK_M: tl.constexpr):  # type: ignore[no-untyped-def]
    # the block's (padded row indices, live-row mask, pair of each row: 0 where not live)
    r = tl.arange(0, BLOCK_M)
    live = r < tl.load(block_rows_ptr + blk)
    rows = blk.to(tl.int64) * BLOCK_M + r
    pair = tl.load(pairs_ptr + rows, mask=live, other=0)
    return rows, live, pair


@triton.jit
def _dot(a, b, IEEE: tl.constexpr):  # type: ignore[no-untyped-def]
    if IEEE:
        return tl.dot(a, b, input_precision="ieee")
    return tl.dot(a, b)


@triton.jit
def _glu(acc_g, acc_u, alpha, limit, ACT: tl.constexpr):  # type: ignore[no-untyped-def]
    """The activation of the gate and up sums (float32): SiLU(gate) up, or transformers' gpt-oss clamped
    SwiGLU (gate clamped above, up both ways, (up + 1) gate sigmoid(alpha gate))."""
    if ACT == "swiglu":
        g = tl.minimum(acc_g, limit)
        u = tl.minimum(tl.maximum(acc_u, -limit), limit)
        return (u + 1.0) * (g * tl.sigmoid(g * alpha))
    else:
        return acc_g * tl.sigmoid(acc_g) * acc_u


@triton.jit
def _gate_up_kernel(  # type: ignore[no-untyped-def]
    x_ptr,
    w_ptr,
    bias_ptr,
    h_ptr,
    pairs_ptr,
    block_expert_ptr,
    block_rows_ptr,
    hidden,
    inter,
    stride_xt,
    stride_we,
    stride_wn,
    stride_be,
    stride_hm,
    alpha,
    limit,
    TOP_K: tl.constexpr,
    ACT: tl.constexpr,
    HAS_BIAS: tl.constexpr,
    BLOCK_M: tl.constexpr,
    BLOCK_N: tl.constexpr,
    BLOCK_K: tl.constexpr,
    IEEE: tl.constexpr,
) -> None:
    # grid (blocks, cdiv(I, BLOCK_N)): BLOCK_M rows of one expert by BLOCK_N of its I outputs
    blk = tl.program_id(0)
    expert = tl.load(block_expert_ptr + blk)
    if expert < 0:  # past the blocks in use
        return
    rows, live, pair = _block_rows(pairs_ptr, block_rows_ptr, blk, BLOCK_M)
    tok = (pair // TOP_K).to(tl.int64)
    n = tl.program_id(1) * BLOCK_N + tl.arange(0, BLOCK_N)
    nmask = n < inter
    if ACT == "swiglu":  # interleaved rows: gate 2j, up 2j + 1
        gate_rows, up_rows = 2 * n, 2 * n + 1
    else:  # [gate | up] halves
        gate_rows, up_rows = n, inter + n
    w_e = w_ptr + expert.to(tl.int64) * stride_we
    acc_g = tl.zeros([BLOCK_M, BLOCK_N], tl.float32)
    acc_u = tl.zeros([BLOCK_M, BLOCK_N], tl.float32)
    for k0 in range(0, hidden, BLOCK_K):
        k = k0 + tl.arange(0, BLOCK_K)
        kmask = k < hidden
        a = tl.load(
            x_ptr + tok[:, None] * stride_xt + k[None, :], mask=live[:, None] & kmask[None, :], other=0.0
        )
        wmask = kmask[:, None] & nmask[None, :]
        wg = tl.load(
            w_e + gate_rows[None, :] * stride_wn + k[:, None], mask=wmask, other=0.0
        )  # (BLOCK_K, BLOCK_N)
        wu = tl.load(w_e + up_rows[None, :] * stride_wn + k[:, None], mask=wmask, other=0.0)
        acc_g += _dot(a, wg, IEEE)
        acc_u += _dot(a, wu, IEEE)
    if HAS_BIAS:
        b_e = bias_ptr + expert.to(tl.int64) * stride_be
        acc_g += tl.load(b_e + gate_rows, mask=nmask, other=0.0).to(tl.float32)[None, :]
        acc_u += tl.load(b_e + up_rows, mask=nmask, other=0.0).to(tl.float32)[None, :]
    out = _glu(acc_g, acc_u, alpha, limit, ACT)
    h = h_ptr + rows[:, None] * stride_hm + n[None, :]
    tl.store(h, out.to(h_ptr.dtype.element_ty), mask=live[:, None] & nmask[None, :])


@triton.jit
def _down_kernel(  # type: ignore[no-untyped-def]
    h_ptr,
    w_ptr,
    bias_ptr,
    route_ptr,
    y_ptr,
    pairs_ptr,
    block_expert_ptr,
    block_rows_ptr,
    hidden,
    inter,
    stride_hm,
    stride_we,
    stride_wn,
    stride_be,
    stride_ym,
    HAS_BIAS: tl.constexpr,
    BLOCK_M: tl.constexpr,
    BLOCK_N: tl.constexpr,
    BLOCK_K: tl.constexpr,
    IEEE: tl.constexpr,
) -> None:
    # grid (blocks, cdiv(H, BLOCK_N)): the block's activations by BLOCK_N rows of the expert's down matrix
    blk = tl.program_id(0)
    expert = tl.load(block_expert_ptr + blk)
    if expert < 0:
        return
    rows, live, pair = _block_rows(pairs_ptr, block_rows_ptr, blk, BLOCK_M)
    n = tl.program_id(1) * BLOCK_N + tl.arange(0, BLOCK_N)
    nmask = n < hidden
    w_e = w_ptr + expert.to(tl.int64) * stride_we
    acc = tl.zeros([BLOCK_M, BLOCK_N], tl.float32)
    for k0 in range(0, inter, BLOCK_K):
        k = k0 + tl.arange(0, BLOCK_K)
        kmask = k < inter
        a = tl.load(
            h_ptr + rows[:, None] * stride_hm + k[None, :], mask=live[:, None] & kmask[None, :], other=0.0
        )
        w = tl.load(
            w_e + n[None, :] * stride_wn + k[:, None], mask=kmask[:, None] & nmask[None, :], other=0.0
        )
        acc += _dot(a, w, IEEE)
    if HAS_BIAS:
        acc += tl.load(bias_ptr + expert.to(tl.int64) * stride_be + n, mask=nmask, other=0.0).to(tl.float32)[
            None, :
        ]
    acc *= tl.load(route_ptr + pair, mask=live, other=0.0).to(tl.float32)[:, None]
    y = y_ptr + pair.to(tl.int64)[:, None] * stride_ym + n[None, :]
    tl.store(y, acc.to(y_ptr.dtype.element_ty), mask=live[:, None] & nmask[None, :])


# -- host side ----------------------------------------------------------------------------------------
@dataclass(frozen=True)
class GemmTiles:
    block_n: int
    block_k: int
    num_warps: int
    num_stages: int


@dataclass(frozen=True)
class MoeTiles:
    block_m: int  # rows per block: each expert's rows padded to a multiple
    gate_up: GemmTiles
    down: GemmTiles


def moe_tiles(pairs: int, num_experts: int, dtype: torch.dtype, capability: tuple[int, int]) -> MoeTiles:
    """The tiles for ``pairs`` (token, choice) rows over ``num_experts`` in ``dtype`` on ``capability``.

    Decode batches (16 rows per expert or fewer on average) take 16-row blocks and narrow, deep weight tiles
    (many programs streaming the chosen experts' weights); more rows take 64-row blocks. float32 (the exact
    dot of the parity tests, on the CUDA cores) takes small tiles. A DGX Spark (sm_121: 99 KiB of shared
    memory, no wgmma) takes fewer stages."""
    spark = capability[0] != 9
    if dtype.itemsize > 2:
        return MoeTiles(16, GemmTiles(32, 32, 4, 2), GemmTiles(32, 32, 4, 2))
    if pairs <= 16 * num_experts:
        stages = 3 if spark else 4
        return MoeTiles(16, GemmTiles(32, 128, 4, stages), GemmTiles(32, 128, 4, stages))
    stages = 2 if spark else 3
    return MoeTiles(64, GemmTiles(64, 64, 4, stages), GemmTiles(128, 64, 8, stages))


def max_blocks(pairs: int, num_experts: int, block_m: int) -> int:
    """The most ``block_m``-row blocks ``pairs`` rows can take over ``num_experts`` experts."""
    used = min(num_experts, pairs)
    return used + (pairs - used) // block_m


def _pow2(n: int) -> int:
    return 1 << max(0, (n - 1).bit_length())


ALIGN_KERNEL_PAIRS = 1024  # up to here _align_kernel (one launch); beyond, torch's sort (many programs)


def align(
    ids: torch.Tensor,  # (T, k) expert ids
    num_experts: int,
    block_m: int,
    reads: torch.Tensor | None = None,  # int64 scalar: the experts used are added to it
    kernel: bool | None = None,  # None: the kernel up to ALIGN_KERNEL_PAIRS pairs
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """(each padded row's pair (int32, max_blocks x block_m; rows past a block's live ones unset), each
    block's expert (int32; -1 past the blocks in use), each block's live rows (int32)), on the device without
    a host read. One program (``_align_kernel``) for decode batches; for more pairs, where its serial loop
    over them would outlast the GEMMs, the same layout from torch's stable sort and scans."""
    pairs = ids.numel()
    nblocks = max_blocks(pairs, num_experts, block_m)
    dev = ids.device
    flat = ids.reshape(-1).contiguous()
    if kernel if kernel is not None else pairs <= ALIGN_KERNEL_PAIRS:
        rows = torch.empty(nblocks * block_m, dtype=torch.int32, device=dev)
        block_expert = torch.empty(nblocks, dtype=torch.int32, device=dev)
        block_rows = torch.empty(nblocks, dtype=torch.int32, device=dev)
        e_pad = _pow2(max(num_experts, 2))
        _align_kernel[(1,)](
            flat, rows, block_expert, block_rows, rows if reads is None else reads, pairs, nblocks,
            E_PAD=e_pad, BLOCK_M=block_m, CHUNK=max(16, min(128, 4096 // e_pad)),
            COUNT_READS=reads is not None, num_warps=4,
        )  # fmt: skip
        return rows, block_expert, block_rows
    counts = torch.zeros(num_experts, dtype=torch.int64, device=dev)
    counts.scatter_add_(0, flat, torch.ones_like(flat))
    if reads is not None:
        reads.add_((counts > 0).sum())
    blocks = (counts + block_m - 1) // block_m
    block_end = blocks.cumsum(0)
    block_start = block_end - blocks
    order = torch.argsort(flat, stable=True)  # the pairs by expert, each expert's in token order
    expert_of = flat[order]
    rank = torch.arange(pairs, device=dev) - (counts.cumsum(0) - counts)[expert_of]
    rows = torch.empty(nblocks * block_m, dtype=torch.int32, device=dev)
    rows.scatter_(0, block_start[expert_of] * block_m + rank, order.to(torch.int32))
    b = torch.arange(nblocks, device=dev)
    expert = torch.searchsorted(block_end, b, right=True)  # the first expert whose blocks end past b
    live = expert < num_experts
    e = expert.clamp(max=num_experts - 1)
    left = (counts[e] - (b - block_start[e]) * block_m).clamp(max=block_m)
    block_expert = torch.where(live, expert, -1).to(torch.int32)
    return rows, block_expert, torch.where(live, left, 0).to(torch.int32)


def fused_moe(
    x: torch.Tensor,  # (T, H)
    ids: torch.Tensor,  # (T, k) expert ids
    weights: torch.Tensor,  # (T, k) routing weights
    w1: torch.Tensor,  # (E, 2I, H)
    w2: torch.Tensor,  # (E, H, I)
    b1: torch.Tensor | None = None,  # (E, 2I)
    b2: torch.Tensor | None = None,  # (E, H)
    act: str = "silu",  # one of ACTIVATIONS
    alpha: float = 0.0,  # the clamped SwiGLU's (act "swiglu")
    limit: float = 0.0,
    tiles: MoeTiles | None = None,  # None: moe_tiles for the device
    reads: torch.Tensor | None = None,  # an int64 scalar on the device: the experts read are added to it
    align_kernel: bool | None = None,  # align()'s path; None: by the pair count
) -> torch.Tensor:  # (T, H) in x's dtype
    """sum_j weights[t, j] * expert_{ids[t, j]}(x[t]) for every token t, without a host synchronization."""
    if act not in ACTIVATIONS:
        raise ValueError(f"fused MoE activation {act!r} is not one of {ACTIVATIONS}")
    t, hidden = x.shape
    k = ids.shape[1]
    num_experts, two_i, _ = w1.shape
    inter = two_i // 2
    assert w1.shape[2] == hidden and w2.shape == (num_experts, hidden, inter), (w1.shape, w2.shape)
    assert w1.stride(2) == 1 and w2.stride(2) == 1 and w1.dtype == w2.dtype == x.dtype
    x = x.contiguous()
    pairs = t * k
    if pairs == 0:
        return torch.zeros_like(x)
    tiles = tiles or moe_tiles(pairs, num_experts, x.dtype, device_capability(x.device))
    bm = tiles.block_m
    rows, block_expert, block_rows = align(ids, num_experts, bm, reads, align_kernel)
    nblocks, dev = block_expert.shape[0], x.device
    ieee = x.dtype == torch.float32
    h = torch.empty(nblocks * bm, inter, dtype=x.dtype, device=dev)
    up = tiles.gate_up
    _gate_up_kernel[(nblocks, triton.cdiv(inter, up.block_n))](
        x, w1, w1 if b1 is None else b1, h, rows, block_expert, block_rows, hidden, inter,
        x.stride(0), w1.stride(0), w1.stride(1), 0 if b1 is None else b1.stride(0), h.stride(0),
        alpha, limit, TOP_K=k, ACT=act, HAS_BIAS=b1 is not None, BLOCK_M=bm, BLOCK_N=up.block_n,
        BLOCK_K=up.block_k, IEEE=ieee, num_warps=up.num_warps, num_stages=up.num_stages,
    )  # fmt: skip
    y = torch.empty(pairs, hidden, dtype=x.dtype, device=dev)
    down = tiles.down
    _down_kernel[(nblocks, triton.cdiv(hidden, down.block_n))](
        h, w2, w2 if b2 is None else b2, weights.reshape(-1).contiguous(), y, rows, block_expert, block_rows,
        hidden, inter, h.stride(0), w2.stride(0), w2.stride(1), 0 if b2 is None else b2.stride(0),
        y.stride(0), HAS_BIAS=b2 is not None, BLOCK_M=bm, BLOCK_N=down.block_n, BLOCK_K=down.block_k,
        IEEE=ieee, num_warps=down.num_warps, num_stages=down.num_stages,
    )  # fmt: skip
    return y.view(t, k, hidden).sum(dim=1) if k > 1 else y
