"""Triton linears for block weights (quant/blocks/weights.py ``BlockWeights``) on CUDA: y = x W^T + b with W
read as stored, 4 or 8 bits a weight, dequantized in registers (W4A16, W8A16: no dequantized copy).

The kernels read the CPU's own bytes, moved to the device as they are: rows in 16-row tiles, each 16-block
chunk's codes interleaved (quant/blocks/tiles.py, block_quant._interleave). A program takes 16 x T rows (T
whole tiles), so each (tile, chunk) it reads is one contiguous span (4 KiB of codes at 4 bits, 8 KiB at 8,
512 bytes of scales): loads as coalesced as a row-major layout's, no repack at load and one copy of the
bytes. The interleave costs index arithmetic on the activation side only: within a chunk, byte b holds
(vector p = b // 64, lane j = (b % 64) // 4, t = b % 4) value 32 j + 4 p + t of block j (4 bits: the low
nibble; the high nibble is value + 16), so the activations are loaded in that order (from L1/L2: a step's
activations are a few KiB). Blocks past the last whole chunk (K not a multiple of 512) follow row after row
in pairs (4 bits: byte i of pair a holds block 2a's code i low, block 2a + 1's high; 8 bits: in order).

Both kernels make each code a float32 without an int-to-float conversion (quarter rate on recent GPUs: two
a byte bounded a 4-bit GEMV below the H100's bandwidth): the code masked in place under a float's exponent,
less that float (``_field``, ``_dequant``; exact). ``_block_gemv_kernel`` takes one activation row
(batch-1 decode): it reads the codes as 32-bit words (word j of a 64-byte vector p: block j's values
4p..4p+3, and 16 + 4p.. in the high nibbles), sums each word's codes times their activations in float32
(fused multiply-adds), then times the block's scale; the weight is never rounded. ``_block_mm_kernel``
takes more rows: each step's weights dequantized in float32 (d q + o to the bit), rounded to the
activations' dtype, then a tensor-core dot (the reference path's arithmetic). Either splits K over
programs when there are few rows (enough programs for 4 per SM): the splits' float32 partial sums go to a
workspace that ``_split_sum_kernel`` adds in a fixed order (deterministic) with the bias. No launch reads
a host value (CUDA graphs capture them).

Instructions in the sm_90 SASS of the main loops (cuobjdump; per weight per thread): the GEMV 5.1 at 4
bits, 6.0 at 8 (with two int-to-float conversions a byte it took 8.6 at 4 bits); the decode dot kernel 11.2
at 4 bits, 17.4 at 8. An H100 SXM streams ~12.8 bytes a cycle per SM and issues 128 thread-instructions,
so a 4-bit GEMV keeps up with its memory at up to ~5 instructions a weight: the GEMV is near that line, the
decode dot kernel (2-16 rows) is issue-bound at roughly half the bandwidth (a DGX Spark's 273 GB/s leaves
either far from it). Estimates from the SASS, not measurements: benchmarks/gpu_bench.py's block_kernels
part times them. Tiles (``GEMV_TILES``, ``mm_tiles``) compile for sm_90 and sm_121 in every variant
(bits, offsets, bias, bf16/float16/float32) without a spill and within shared memory
(tests/helpers/triton_linear_launches.py's sweep; a subset in tests/kernels/test_triton_compile.py), registers:
| kernel, tiles (rows x weight rows) | sm_90 (H100) | sm_121 (DGX Spark) | shared memory |
|---|---|---|---|
| GEMV, 1 x 32, 4 warps | 94-167 | 96-160 | 8 KiB |
| dot, 16 x 64 (decode), 4 warps | 106-154 | 107-152 | 24-36 KiB |
| dot, 64 x 128, 8 warps | 109-184 | 142-210 | 48-84 KiB |
| dot, 128 x 128, 8 warps | 158-172 | 174-247 | 64-128 KiB |
| dot, float32 16 x 32, 8 warps | 52-74 | 52-74 | |

Offsets (constexpr OFFSETS): 0 a constant times the scale (Q4_0, Q8_0, int4/int8), 1 stored float16 (Q4_1),
2 uint8 zero codes, o = -z d (GPTQ, AWQ). 4-bit floats (quant/fp4/triton.py) take the same kernels with
E2M1 codes (a value built from the code's bits, ``_e2m1``) and byte scales decoded in registers
(``_scale``): 3 MXFP4 (an E8M0 byte per block), 4 NVFP4 (an E4M3 byte per half block: the low nibbles are a
block's first 16 values, the high ones its second 16, so each nibble has its own scale; the tensor scale,
per row, multiplies the sums). GGUF's K-quants (quant/blocks/kquant_triton.py) take them too: 5 Q4_K (4 bits) and
Q5_K (8), a block's scale d sc and offset -dmin m formed in float32 from its 6-bit sc and m bytes and its
super-block's float16 d and dmin (``_block_scale``, ``_block_offset``; the super-block arrays are tiled so
that a block's super-block sits at its position >> 3); 6 Q6_K (8 bits, codes less 32), an int8 scale per
half block (two a block, at 2 x the block's position + the half: a step's bytes lie in one half). Register
figures of the K-quant variants (tests/helpers/triton_linear_launches.py ... kquant): within the table's ranges
but the 128 x 128 Q4_K dot tiles on sm_121 (246). As in triton_attention.py, the @triton.jit parameters
carry no annotations (the compiler rejects any that is not a constexpr), and a helper with returns for
several constexpr kinds returns from if/elif/else branches (the compiler types every return it reaches).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import triton
import triton.language as tl

from glassbox.kernels.triton_attention import num_sms
from glassbox.kernels.triton_block_gemv import (
    _block_gemv_kernel,
    _block_offset,
    _block_scale,
    _dequant,
    _rows,
    _scale,
    _tail_scale,
)

BLOCK = 32


@triton.jit
def _chunk_value(b):  # type: ignore[no-untyped-def]
    """The value (within its chunk) of the code at byte b: 32 j + 4 p + t (4 bits: the low nibble's)."""
    return ((b % 64) // 4) * 32 + (b // 64) * 4 + b % 4


@triton.jit
def _block_mm_kernel(  # type: ignore[no-untyped-def]
    x_ptr,
    codes_ptr,
    scales_ptr,
    offs_ptr,
    bias_ptr,
    rs_ptr,  # NVFP4's per-row tensor scales (HAS_ROW_SCALE)
    sb_ptr,  # the K-quants' super-block scales (OFFSETS 5, 6)
    out_ptr,
    ws_ptr,
    M,
    N,
    K,
    stride_xm,
    stride_om,
    L,  # code bytes per row
    LS,  # blocks per row (Kp / 32)
    chunks,  # whole 16-block chunks per row
    tail_pairs,  # block pairs past them
    offset_factor,
    BITS: tl.constexpr,
    OFFSETS: tl.constexpr,
    HAS_BIAS: tl.constexpr,
    HAS_ROW_SCALE: tl.constexpr,
    BLOCK_M: tl.constexpr,
    BLOCK_N: tl.constexpr,
    STEP: tl.constexpr,  # code bytes per row per step: 64, 128, 256 (4 bits) or 512 (8 bits)
    IEEE: tl.constexpr,
) -> None:
    # grid (M / BLOCK_M, N / BLOCK_N, splits): rows x weight rows x a share of K's steps
    pid_m = tl.program_id(0)
    pid_n = tl.program_id(1)
    pid_k = tl.program_id(2)
    splits = tl.num_programs(2)
    SEG: tl.constexpr = 256 if BITS == 4 else 512  # a chunk's code bytes per row
    m = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
    m_mask = m < M
    x_row = x_ptr + m.to(tl.int64)[:, None] * stride_xm
    cbase, sbase, r, height = _rows(pid_n * BLOCK_N, N, L, LS, BLOCK_N)
    steps = chunks * (SEG // STEP)
    per = tl.cdiv(steps, splits)
    acc = tl.zeros([BLOCK_M, BLOCK_N], dtype=tl.float32)
    acc = _block_dot(
        acc, x_row, m_mask, codes_ptr, scales_ptr, offs_ptr, sb_ptr, cbase, sbase, r, height, K, L, LS,
        chunks, tail_pairs, offset_factor, pid_k * per, tl.minimum(steps, pid_k * per + per),
        pid_k == splits - 1, BITS, OFFSETS, STEP, IEEE,
    )  # fmt: skip
    n = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    if HAS_ROW_SCALE:  # NVFP4's tensor scale, per row
        acc *= tl.load(rs_ptr + n, mask=n < N, other=0.0)[None, :]
    _finish(acc, m, n, M, N, bias_ptr, out_ptr, ws_ptr, stride_om, pid_k, splits, HAS_BIAS)


@triton.jit
def _block_dot(  # type: ignore[no-untyped-def]
    acc,
    x_row,  # (BLOCK_M, 1) pointers: each activation row's first value
    m_mask,  # (BLOCK_M,): the live rows
    codes_ptr,
    scales_ptr,
    offs_ptr,
    sb_ptr,
    cbase,  # the weight rows' tiles (_rows, _rows_at)
    sbase,
    r,
    height,
    K,
    L,
    LS,
    chunks,
    tail_pairs,
    offset_factor,
    lo,  # the steps of the whole chunks to run: [lo, hi)
    hi,
    tail,  # and the blocks past them
    BITS: tl.constexpr,
    OFFSETS: tl.constexpr,
    STEP: tl.constexpr,
    IEEE: tl.constexpr,
):
    """acc + the activation rows times the weight rows^T over steps [lo, hi) of the whole chunks (and the
    tail blocks if ``tail``): each step's weights dequantized in float32, rounded to the activations'
    dtype, a dot (float32 sums). _block_mm_kernel's loop, and kernels/triton_block_moe.py's."""
    SEG: tl.constexpr = 256 if BITS == 4 else 512  # a chunk's code bytes per row
    b = tl.arange(0, STEP)
    per_chunk = SEG // STEP
    for step in range(lo, hi):
        s = step // per_chunk
        bb = (step % per_chunk) * STEP + b  # bytes within the chunk
        c = tl.load(codes_ptr + (cbase + (s * height + r) * SEG)[:, None] + bb[None, :])
        blk = (s * height + r) * 16
        sp = (sbase + blk)[:, None] + ((bb % 64) // 4)[None, :]
        if OFFSETS == 6:  # Q6_K's scale per half block: a step's bytes lie in one half (values 4p.., p < 4)
            tl.static_assert(256 % STEP == 0)
            d = _block_scale(scales_ptr, sb_ptr, 2 * sp + (step % per_chunk) * STEP // 256, OFFSETS)
        else:
            d = _block_scale(scales_ptr, sb_ptr, sp, OFFSETS)
        o = _block_offset(offs_ptr, sb_ptr, sp, OFFSETS)
        k = s * 512 + _chunk_value(bb)
        x = tl.load(x_row + k[None, :], mask=m_mask[:, None] & (k < K)[None, :], other=0.0)
        if BITS == 4:
            w = _dequant(c & 15, d, o, offset_factor, OFFSETS).to(x.dtype)
            acc = _dot(x, w, acc, IEEE)
            x = tl.load(x_row + (k + 16)[None, :], mask=m_mask[:, None] & (k + 16 < K)[None, :], other=0.0)
            if OFFSETS == 4:  # NVFP4: the high nibbles are the blocks' second halves
                d = _scale(offs_ptr + sp, OFFSETS)
            w = _dequant(c >> 4, d, o, offset_factor, OFFSETS).to(x.dtype)
        else:
            w = _dequant(c, d, o, offset_factor, OFFSETS).to(x.dtype)
        acc = _dot(x, w, acc, IEEE)
    if tail:  # the blocks past the last whole chunk, in pairs
        TB: tl.constexpr = 32 if BITS == 4 else 64  # code bytes per pair per row
        i = tl.arange(0, TB)
        ctail = cbase + chunks * SEG * height + r * (L - chunks * SEG)
        stail = sbase + chunks * 16 * height + r * (LS - chunks * 16)
        for a in range(tail_pairs):
            c = tl.load(codes_ptr + (ctail + a * TB)[:, None] + i[None, :])
            k = chunks * 512 + a * 64 + i
            x = tl.load(x_row + k[None, :], mask=m_mask[:, None] & (k < K)[None, :], other=0.0)
            if BITS == 4:  # low nibbles: block 2a, high: block 2a + 1
                sp = (stail + 2 * a)[:, None]
                d = _tail_scale(scales_ptr, offs_ptr, sb_ptr, sp, i, OFFSETS)
                w = _dequant(c & 15, d, _block_offset(offs_ptr, sb_ptr, sp, OFFSETS), offset_factor, OFFSETS)
                acc = _dot(x, w.to(x.dtype), acc, IEEE)
                x = tl.load(
                    x_row + (k + 32)[None, :], mask=m_mask[:, None] & (k + 32 < K)[None, :], other=0.0
                )
                d = _tail_scale(scales_ptr, offs_ptr, sb_ptr, sp + 1, i, OFFSETS)
                o = _block_offset(offs_ptr, sb_ptr, sp + 1, OFFSETS)
                acc = _dot(x, _dequant(c >> 4, d, o, offset_factor, OFFSETS).to(x.dtype), acc, IEEE)
            else:
                sp = (stail + 2 * a)[:, None] + (i // 32)[None, :]
                d = _tail_scale(scales_ptr, offs_ptr, sb_ptr, sp, i % 32, OFFSETS)
                w = _dequant(c, d, _block_offset(offs_ptr, sb_ptr, sp, OFFSETS), offset_factor, OFFSETS)
                acc = _dot(x, w.to(x.dtype), acc, IEEE)
    return acc


@triton.jit
def _dot(x, w, acc, IEEE: tl.constexpr):  # type: ignore[no-untyped-def]
    """acc + x w^T (x (BLOCK_M, S), w (BLOCK_N, S) dequantized), float32 products summed in float32."""
    if IEEE:
        return tl.dot(x, tl.trans(w), acc, input_precision="ieee")
    return tl.dot(x, tl.trans(w), acc)


@triton.jit
def _finish(acc, m, n, M, N, bias_ptr, out_ptr, ws_ptr, stride_om, pid_k, splits, HAS_BIAS: tl.constexpr):  # type: ignore[no-untyped-def]
    """One split: the output (+ bias) in its dtype; more: this split's float32 partial sums."""
    mask = (m < M)[:, None] & (n < N)[None, :]
    if splits == 1:
        if HAS_BIAS:
            acc += tl.load(bias_ptr + n, mask=n < N, other=0.0)[None, :]
        out_ptrs = out_ptr + m.to(tl.int64)[:, None] * stride_om + n[None, :]
        tl.store(out_ptrs, acc.to(out_ptr.dtype.element_ty), mask=mask)
    else:
        ws_ptrs = ws_ptr + (pid_k * M + m).to(tl.int64)[:, None] * N + n[None, :]
        tl.store(ws_ptrs, acc, mask=mask)


@triton.jit
def _split_sum_kernel(  # type: ignore[no-untyped-def]
    ws_ptr,
    bias_ptr,
    out_ptr,
    M,
    N,
    stride_om,
    splits,
    HAS_BIAS: tl.constexpr,
    BLOCK: tl.constexpr,
) -> None:
    # grid (M, N / BLOCK): the splits' partial sums in order, + bias, in the output's dtype
    m = tl.program_id(0)
    n = tl.program_id(1) * BLOCK + tl.arange(0, BLOCK)
    mask = n < N
    acc = tl.zeros([BLOCK], dtype=tl.float32)
    for k in range(splits):
        acc += tl.load(ws_ptr + (k * M + m).to(tl.int64) * N + n, mask=mask, other=0.0)
    if HAS_BIAS:
        acc += tl.load(bias_ptr + n, mask=mask, other=0.0)
    tl.store(out_ptr + m.to(tl.int64) * stride_om + n, acc.to(out_ptr.dtype.element_ty), mask=mask)


# -- host side -----------------------------------------------------------------------------------------
MAX_SPLITS = 16
DECODE_ROWS = 16  # up to this many rows (a decode step) take the split-K tiles


@dataclass(frozen=True)
class MmTiles:
    block_m: int
    block_n: int  # a multiple of 16: whole row tiles
    step: int  # code bytes per row per step
    num_warps: int
    num_stages: int


@dataclass(frozen=True)
class GemvTiles:
    block_n: int
    vecs: int  # 64-byte vectors per step
    num_warps: int
    num_stages: int


# One activation row: 32 weight rows (2 tiles) x a 4-bit chunk or half an 8-bit one per step (8 KiB), 4
# warps: 94-167 registers (64 rows on 4 warps spilled Q4_1's on sm_90 at 168)
GEMV_TILES = GemvTiles(32, 4, 4, 3)


def mm_tiles(rows: int, bits: int, dtype: torch.dtype, kind: int = 0) -> MmTiles:
    """The dot kernel's tiles for ``rows`` activation rows of ``dtype`` (and OFFSETS ``kind``). float32 (the
    exact FMA dot, its operands in registers; the tests' dtype): 16 x 32 tiles, 32-byte steps, 8 warps (32 x
    32 put 8-40 bytes on the stack in some variants on both targets). MXFP4 keeps 64-row tiles past 64 rows
    (its 128 x 128 tiles spilled 160 bytes on sm_121)."""
    if dtype.itemsize > 2:
        return MmTiles(16, 32, 32, 8, 1)
    if rows <= DECODE_ROWS:
        return MmTiles(16, 64, 64 if bits == 4 else 128, 4, 3)
    return MmTiles(64 if rows <= 64 or kind == 3 else 128, 128, 64, 8, 3)


def _splits(programs: int, steps: int, device: torch.device) -> int:
    """K splits: enough programs for 4 per SM, at most one per step (a fixed function of the shapes, so a
    captured CUDA graph keeps its launch valid)."""
    want = -(-4 * num_sms(device) // max(1, programs))
    return max(1, min(MAX_SPLITS, steps, want))


@dataclass(frozen=True)
class BlockArgs:
    """A block weight's device arrays and kind as the kernels take them, made by each layout
    (``triton_args``: quant/blocks/weights.py, quant/blocks/kquant_triton.py, quant/fp4/triton.py): ``offs`` the
    stored offsets, zero codes, K-quant mins or NVFP4's second-half scales (else ``scales``), ``sb`` the
    K-quants' super-block scales and ``rs`` NVFP4's row scales (else ``scales``)."""

    codes: torch.Tensor  # (N, L) uint8, tiled
    scales: torch.Tensor  # (N, Kp / 32) (Q6_K: two a block), tiled
    offs: torch.Tensor
    sb: torch.Tensor
    rs: torch.Tensor
    bits: int
    kind: int  # the kernels' OFFSETS
    offset_factor: float
    in_features: int
    has_row_scale: bool

    def __post_init__(self) -> None:
        blocks = self.shape_args()[1]
        assert (
            self.scales.shape[1] == blocks * (2 if self.kind == 6 else 1)
            and blocks * BLOCK >= self.in_features
        )
        assert self.kind or self.offset_factor == int(self.offset_factor), "_dequant folds an integer factor"

    @property
    def rows(self) -> int:
        return int(self.codes.shape[0])

    def shape_args(self) -> tuple[int, int, int, int]:
        """(L code bytes a row, LS blocks a row, whole chunks, block pairs past them)."""
        length = int(self.codes.shape[1])
        blocks = length * (8 // self.bits) // BLOCK
        return length, blocks, blocks // 16, (blocks - blocks // 16 * 16) // 2


def block_matmul(
    x: torch.Tensor,  # (M, K), contiguous rows
    w: BlockArgs,
    bias: torch.Tensor | None,  # (N,) float32
    decode: bool,  # a decode step: one row takes the GEMV, up to DECODE_ROWS the split-K tiles
    splits: int | None = None,  # K splits (None: from the SMs; tests force them)
) -> torch.Tensor:
    """x W^T + bias, (M, N) in x's dtype."""
    m, k = x.shape
    n = w.rows
    length, blocks, chunks, tail_pairs = w.shape_args()
    assert x.stride(1) == 1 and k == w.in_features
    bias_arg = bias if bias is not None else w.scales
    out = torch.empty(m, n, dtype=x.dtype, device=x.device)
    seg = 256 if w.bits == 4 else 512
    if decode and m == 1:
        gt = GEMV_TILES
        programs = triton.cdiv(n, gt.block_n)
        steps = chunks * seg // (64 * gt.vecs)
        s = splits or _splits(programs, steps, x.device)
        ws = torch.empty(s, 1, n, dtype=torch.float32, device=x.device) if s > 1 else out
        _block_gemv_kernel[(programs, s)](
            x, w.codes, w.scales, w.offs, bias_arg, w.rs, w.sb, out, ws, n, k, length, blocks, chunks, tail_pairs,
            w.offset_factor, BITS=w.bits, OFFSETS=w.kind, HAS_BIAS=bias is not None,
            HAS_ROW_SCALE=w.has_row_scale, BLOCK_N=gt.block_n, VECS=gt.vecs, MASK_K=k < chunks * 512,
            num_warps=gt.num_warps, num_stages=gt.num_stages,
        )  # fmt: skip
    else:
        t = mm_tiles(m, w.bits, x.dtype, w.kind)
        grid_mn = triton.cdiv(m, t.block_m) * triton.cdiv(n, t.block_n)
        one_split = not decode or m > DECODE_ROWS
        s = 1 if one_split else splits or _splits(grid_mn, chunks * seg // t.step, x.device)
        ws = torch.empty(s, m, n, dtype=torch.float32, device=x.device) if s > 1 else out
        _block_mm_kernel[(triton.cdiv(m, t.block_m), triton.cdiv(n, t.block_n), s)](
            x, w.codes, w.scales, w.offs, bias_arg, w.rs, w.sb, out, ws, m, n, k, x.stride(0), out.stride(0),
            length, blocks, chunks, tail_pairs, w.offset_factor, BITS=w.bits, OFFSETS=w.kind,
            HAS_BIAS=bias is not None, HAS_ROW_SCALE=w.has_row_scale, BLOCK_M=t.block_m, BLOCK_N=t.block_n,
            STEP=t.step, IEEE=x.dtype == torch.float32, num_warps=t.num_warps, num_stages=t.num_stages,
        )  # fmt: skip
    if s > 1:
        _split_sum_kernel[(m, triton.cdiv(n, 1024))](
            ws, bias_arg, out, m, n, out.stride(0), s, HAS_BIAS=bias is not None, BLOCK=1024, num_warps=4
        )
    return out
