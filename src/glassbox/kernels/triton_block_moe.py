"""Triton fused mixture-of-experts FFN for experts kept in blocks (CUDA): kernels/triton_moe.py's grouped
GEMMs with the weights read as stored and dequantized in registers, as kernels/triton_block_linear.py reads a
linear's.

A layer's experts (GGUF files' in their types, GPTQ/AWQ and compressed-tensors integer checkpoints' but
act-order ones, MXFP4 checkpoints', ``--quantization``'s) are two block weights (quant/blocks/weights.py ``BlockWeights``, quant/blocks/kquant_triton.py,
quant/fp4/triton.py): ``w1`` every expert's gate and up rows stacked by expert (E 2I rows: expert e's at
e 2I + its row), ``w2`` every expert's down rows (E H rows), each in the block kernels' layout (16-row
tiles, interleaved chunks), so an expert's rows are rows of one matrix and the block kernels' loop
(``_block_dot``) reads them. The pairs are laid out by expert as for float experts (triton_moe.align: one
launch for decode batches, no host read); ``_gate_up_kernel`` gathers a block's token rows, runs the gate and
the up rows of its expert (two accumulators), adds the biases, applies the activation ([gate | up] halves
or interleaved rows) and stores the model's dtype; ``_down_kernel`` runs those rows by the expert's down
rows, adds the bias and scales by the routing weight; one sum over each token's k rows (torch). An expert
no pair chose is never read. Checked against the experts' dequantized weights on triton_moe's float
kernels and ``MoEExperts.reference`` under Triton's interpreter (tests/kernels/test_triton_block_moe.py).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import triton
import triton.language as tl

from glassbox.kernels.attention_tiles import device_capability
from glassbox.kernels.triton_block_gemv import _rows_at
from glassbox.kernels.triton_block_linear import BlockArgs, _block_dot
from glassbox.kernels.triton_moe import ACTIVATIONS, _block_rows, _glu, align


@triton.jit
def _gate_up_kernel(  # type: ignore[no-untyped-def]
    x_ptr,
    codes_ptr,
    scales_ptr,
    offs_ptr,
    sb_ptr,
    rs_ptr,
    bias_ptr,
    h_ptr,
    pairs_ptr,
    block_expert_ptr,
    block_rows_ptr,
    hidden,
    inter,
    N,  # E 2I: w1's rows
    L,
    LS,
    chunks,
    tail_pairs,
    offset_factor,
    stride_xt,
    stride_hm,
    alpha,
    limit,
    TOP_K: tl.constexpr,
    ACT: tl.constexpr,
    INTERLEAVED: tl.constexpr,  # gate and up rows 2j, 2j + 1 (else [gate | up] halves)
    HAS_BIAS: tl.constexpr,
    HAS_ROW_SCALE: tl.constexpr,
    BITS: tl.constexpr,
    OFFSETS: tl.constexpr,
    BLOCK_M: tl.constexpr,
    BLOCK_N: tl.constexpr,
    STEP: tl.constexpr,
    IEEE: tl.constexpr,
) -> None:
    # grid (blocks, cdiv(I, BLOCK_N)): BLOCK_M rows of one expert by BLOCK_N of its I outputs
    blk = tl.program_id(0)
    expert = tl.load(block_expert_ptr + blk)
    if expert < 0:  # past the blocks in use
        return
    rows, live, pair = _block_rows(pairs_ptr, block_rows_ptr, blk, BLOCK_M)
    x_row = x_ptr + (pair // TOP_K).to(tl.int64)[:, None] * stride_xt
    n = tl.program_id(1) * BLOCK_N + tl.arange(0, BLOCK_N)
    nc = tl.minimum(n, inter - 1)  # in bounds: the rows past I are computed, not stored
    if INTERLEAVED:
        gate_rows, up_rows = 2 * nc, 2 * nc + 1
    else:
        gate_rows, up_rows = nc, inter + nc
    base = expert.to(tl.int64) * 2 * inter
    SEG: tl.constexpr = 256 if BITS == 4 else 512
    steps = chunks * (SEG // STEP)
    cbase, sbase, r, height = _rows_at(base + gate_rows, N, L, LS)
    acc_g = _block_dot(
        tl.zeros([BLOCK_M, BLOCK_N], tl.float32), x_row, live, codes_ptr, scales_ptr, offs_ptr, sb_ptr,
        cbase, sbase, r, height, hidden, L, LS, chunks, tail_pairs, offset_factor, 0, steps, True, BITS,
        OFFSETS, STEP, IEEE,
    )  # fmt: skip
    cbase, sbase, r, height = _rows_at(base + up_rows, N, L, LS)
    acc_u = _block_dot(
        tl.zeros([BLOCK_M, BLOCK_N], tl.float32), x_row, live, codes_ptr, scales_ptr, offs_ptr, sb_ptr,
        cbase, sbase, r, height, hidden, L, LS, chunks, tail_pairs, offset_factor, 0, steps, True, BITS,
        OFFSETS, STEP, IEEE,
    )  # fmt: skip
    if HAS_ROW_SCALE:  # NVFP4's tensor scale, per row
        acc_g *= tl.load(rs_ptr + base + gate_rows)[None, :]
        acc_u *= tl.load(rs_ptr + base + up_rows)[None, :]
    if HAS_BIAS:  # (E, 2I) float32, in the rows' order
        acc_g += tl.load(bias_ptr + base + gate_rows)[None, :]
        acc_u += tl.load(bias_ptr + base + up_rows)[None, :]
    out = _glu(acc_g, acc_u, alpha, limit, ACT)
    h = h_ptr + rows[:, None] * stride_hm + n[None, :]
    tl.store(h, out.to(h_ptr.dtype.element_ty), mask=live[:, None] & (n < inter)[None, :])


@triton.jit
def _down_kernel(  # type: ignore[no-untyped-def]
    h_ptr,
    codes_ptr,
    scales_ptr,
    offs_ptr,
    sb_ptr,
    rs_ptr,
    bias_ptr,
    route_ptr,
    y_ptr,
    pairs_ptr,
    block_expert_ptr,
    block_rows_ptr,
    hidden,
    inter,
    N,  # E H: w2's rows
    L,
    LS,
    chunks,
    tail_pairs,
    offset_factor,
    stride_hm,
    stride_ym,
    HAS_BIAS: tl.constexpr,
    HAS_ROW_SCALE: tl.constexpr,
    BITS: tl.constexpr,
    OFFSETS: tl.constexpr,
    BLOCK_M: tl.constexpr,
    BLOCK_N: tl.constexpr,
    STEP: tl.constexpr,
    IEEE: tl.constexpr,
) -> None:
    # grid (blocks, cdiv(H, BLOCK_N)): the block's activations by BLOCK_N rows of the expert's down matrix
    blk = tl.program_id(0)
    expert = tl.load(block_expert_ptr + blk)
    if expert < 0:
        return
    rows, live, pair = _block_rows(pairs_ptr, block_rows_ptr, blk, BLOCK_M)
    n = tl.program_id(1) * BLOCK_N + tl.arange(0, BLOCK_N)
    w_rows = expert.to(tl.int64) * hidden + tl.minimum(n, hidden - 1)
    SEG: tl.constexpr = 256 if BITS == 4 else 512
    cbase, sbase, r, height = _rows_at(w_rows, N, L, LS)
    acc = _block_dot(
        tl.zeros([BLOCK_M, BLOCK_N], tl.float32), h_ptr + rows[:, None] * stride_hm, live, codes_ptr,
        scales_ptr, offs_ptr, sb_ptr, cbase, sbase, r, height, inter, L, LS, chunks, tail_pairs,
        offset_factor, 0, chunks * (SEG // STEP), True, BITS, OFFSETS, STEP, IEEE,
    )  # fmt: skip
    if HAS_ROW_SCALE:
        acc *= tl.load(rs_ptr + w_rows)[None, :]
    if HAS_BIAS:  # (E, H) float32
        acc += tl.load(bias_ptr + w_rows)[None, :]
    acc *= tl.load(route_ptr + pair, mask=live, other=0.0).to(tl.float32)[:, None]
    y = y_ptr + pair.to(tl.int64)[:, None] * stride_ym + n[None, :]
    tl.store(y, acc.to(y_ptr.dtype.element_ty), mask=live[:, None] & (n < hidden)[None, :])


# -- host side ----------------------------------------------------------------------------------------
@dataclass(frozen=True)
class BlockMoeTiles:
    block_m: int  # rows per block: each expert's rows padded to a multiple
    gate_up_n: int  # weight rows per program (multiples of 16: whole row tiles)
    down_n: int
    step: int  # code bytes per row per step (4-bit weights: at most 64)
    num_warps: int
    num_stages: int


def block_moe_tiles(
    pairs: int, num_experts: int, bits: int, dtype: torch.dtype, capability: tuple[int, int]
) -> BlockMoeTiles:
    """Decode batches (16 rows per expert or fewer on average): 16-row blocks by 32 weight rows, the block
    linears' decode steps; more rows 64-row blocks by 64 (32 for gate_up on a DGX Spark, sm_121: its two
    accumulators at 64 spilled there); float32 (the tests' exact dot) small tiles. Compiled for sm_90 and
    sm_121 without spills (tests/kernels/test_triton_compile_moe.py)."""
    if dtype.itemsize > 2:
        return BlockMoeTiles(16, 32, 32, 32, 8, 1)
    if pairs <= 16 * num_experts:
        return BlockMoeTiles(16, 32, 32, 64 if bits == 4 else 128, 4, 3)
    return BlockMoeTiles(64, 64 if capability[0] == 9 else 32, 64, 64, 8, 3)


def block_fused_moe(
    x: torch.Tensor,  # (T, H)
    ids: torch.Tensor,  # (T, k) expert ids
    weights: torch.Tensor,  # (T, k) routing weights
    w1: BlockArgs,  # E 2I rows
    w2: BlockArgs,  # E H rows
    num_experts: int,
    b1: torch.Tensor | None = None,  # (E, 2I) float32
    b2: torch.Tensor | None = None,  # (E, H) float32
    act: str = "silu",
    interleaved: bool = False,  # gate and up rows 2j, 2j + 1 (else [gate | up] halves)
    alpha: float = 0.0,
    limit: float = 0.0,
    reads: torch.Tensor | None = None,  # an int64 scalar on the device: the experts read are added to it
) -> torch.Tensor:  # (T, H) in x's dtype
    """sum_j weights[t, j] * expert_{ids[t, j]}(x[t]) for every token t, the experts' weights read in their
    blocks, without a host synchronization."""
    if act not in ACTIVATIONS:
        raise ValueError(f"fused MoE activation {act!r} is not one of {ACTIVATIONS}")
    t, hidden = x.shape
    k = ids.shape[1]
    inter = w1.rows // (2 * num_experts)
    assert w1.rows == 2 * inter * num_experts and w2.rows == hidden * num_experts
    assert w1.in_features == hidden and w2.in_features == inter
    x = x.contiguous()
    pairs = t * k
    if pairs == 0:
        return torch.zeros_like(x)
    capability = device_capability(x.device)
    tiles = block_moe_tiles(pairs, num_experts, max(w1.bits, w2.bits), x.dtype, capability)
    bm = tiles.block_m
    rows, block_expert, block_rows = align(ids, num_experts, bm, reads)
    nblocks, dev = block_expert.shape[0], x.device
    ieee = x.dtype == torch.float32
    h = torch.empty(nblocks * bm, inter, dtype=x.dtype, device=dev)
    launch = dict(BLOCK_M=bm, IEEE=ieee, num_warps=tiles.num_warps, num_stages=tiles.num_stages)
    _gate_up_kernel[(nblocks, triton.cdiv(inter, tiles.gate_up_n))](
        x, w1.codes, w1.scales, w1.offs, w1.sb, w1.rs, w1.scales if b1 is None else b1, h, rows, block_expert,
        block_rows, hidden, inter, w1.rows, *w1.shape_args(), w1.offset_factor, x.stride(0), h.stride(0),
        alpha, limit, TOP_K=k, ACT=act, INTERLEAVED=interleaved, HAS_BIAS=b1 is not None,
        HAS_ROW_SCALE=w1.has_row_scale, BITS=w1.bits, OFFSETS=w1.kind,
        BLOCK_N=tiles.gate_up_n, STEP=min(tiles.step, 64) if w1.bits == 4 else tiles.step, **launch,
    )  # fmt: skip
    y = torch.empty(pairs, hidden, dtype=x.dtype, device=dev)
    _down_kernel[(nblocks, triton.cdiv(hidden, tiles.down_n))](
        h, w2.codes, w2.scales, w2.offs, w2.sb, w2.rs, w2.scales if b2 is None else b2,
        weights.reshape(-1).contiguous(), y, rows, block_expert, block_rows, hidden, inter, w2.rows,
        *w2.shape_args(), w2.offset_factor, h.stride(0), y.stride(0), HAS_BIAS=b2 is not None,
        HAS_ROW_SCALE=w2.has_row_scale, BITS=w2.bits, OFFSETS=w2.kind,
        BLOCK_N=tiles.down_n, STEP=min(tiles.step, 64) if w2.bits == 4 else tiles.step, **launch,
    )  # fmt: skip
    return y.view(t, k, hidden).sum(dim=1) if k > 1 else y
