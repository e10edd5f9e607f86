"""The one-row kernel for block weights (kernels/triton_block_linear.py has the rest and the host code) and
the helpers both kernels share: a program's rows in the 16-row tiles, and codes made floats in place.

See triton_block_linear.py's docstring for the layout and the arithmetic.
"""

from __future__ import annotations

import triton
import triton.language as tl


@triton.jit
def _dequant(c, d, offs_ptrs, offset_factor, OFFSETS: tl.constexpr):  # type: ignore[no-untyped-def]
    """Codes c (0..255, any integer type) of blocks with scales d (float32) and their offsets (from
    ``offs_ptrs``), dequantized in float32: d (q + f) for the constant f (an integer: -8, -128), d (q - z) for
    zero codes z, d q + m for stored offsets m: the reference's d q + o to the bit (q d and o d are exact in
    float32: at most 8 + 11 significant bits, so is their sum). The code becomes a float as the low mantissa
    bits of 2^23 (2^23 + q, exact), less 2^23 and the integer offset in one subtraction: no int-to-float
    conversion instruction (quarter rate on recent GPUs: it would bound a 4-bit GEMV)."""
    f = (c.to(tl.int32) | 0x4B000000).to(tl.float32, bitcast=True)
    if OFFSETS == 0:
        w = (f - (8388608.0 - offset_factor)) * d
    elif OFFSETS == 1:
        w = (f - 8388608.0) * d + tl.load(offs_ptrs).to(tl.float32)
    else:
        w = (f - (8388608.0 + tl.load(offs_ptrs).to(tl.float32))) * d
    return w


@triton.jit
def _field(w, SHIFT: tl.constexpr, BITS: tl.constexpr, OFFSETS: tl.constexpr, offset_factor):  # type: ignore[no-untyped-def]
    """The code q in bits SHIFT.. of words w (SHIFT + BITS <= 16) as q + f (f the integer offset factor,
    OFFSETS 0) or q, in float32, exact: the field masked in place under the exponent of 2^(23 - SHIFT) (so
    that its unit is 1), less 2^(23 - SHIFT): one logic op and one add, no shift, no int-to-float
    conversion (quarter rate on recent GPUs: it would bound a 4-bit GEMV)."""
    mask: tl.constexpr = ((1 << BITS) - 1) << SHIFT
    exponent: tl.constexpr = (150 - SHIFT) << 23
    base: tl.constexpr = float(1 << (23 - SHIFT))
    f = ((w & mask) | exponent).to(tl.float32, bitcast=True)
    if OFFSETS == 0:
        return f - (base - offset_factor)
    return f - base


@triton.jit
def _byte_dot(  # type: ignore[no-untyped-def]
    word,
    SHIFT: tl.constexpr,
    x_ptr,
    k,
    K,
    offset_factor,
    qx,
    xs,
    BITS: tl.constexpr,
    OFFSETS: tl.constexpr,
    MASK_K: tl.constexpr,
):
    """(qx, xs) + (codes x activations, activations) of the byte at bits SHIFT.. (0 or 8) of ``word``: value
    k of a block (4 bits: and value k + 16 in the high nibble), products fused into the running sum."""
    if MASK_K:
        x = tl.load(x_ptr + k, mask=k < K, other=0.0).to(tl.float32)
    else:
        x = tl.load(x_ptr + k).to(tl.float32)
    qx = tl.fma(_field(word, SHIFT, BITS if BITS == 8 else 4, OFFSETS, offset_factor), x, qx)
    xs += x
    if BITS == 4:
        if MASK_K:
            x = tl.load(x_ptr + k + 16, mask=k + 16 < K, other=0.0).to(tl.float32)
        else:
            x = tl.load(x_ptr + k + 16).to(tl.float32)
        qx = tl.fma(_field(word, SHIFT + 4, 4, OFFSETS, offset_factor), x, qx)
        xs += x
    return qx, xs


@triton.jit
def _word_dot(w, x_ptr, k, K, offset_factor, BITS: tl.constexpr, OFFSETS: tl.constexpr, MASK_K: tl.constexpr):  # type: ignore[no-untyped-def]
    """Per word of codes (4 bytes: values k..k+3 of a block; 4 bits: the high nibbles k+16..k+19): the sum
    of its codes (plus the offset factor, OFFSETS 0) times their activations, and the activations' sum
    (``_byte_dot`` per byte; the upper two bytes after one shift of the word)."""
    hi = w >> 16
    qx = tl.zeros(w.shape, dtype=tl.float32)
    xs = tl.zeros(k.shape, dtype=tl.float32)
    qx, xs = _byte_dot(w, 0, x_ptr, k, K, offset_factor, qx, xs, BITS, OFFSETS, MASK_K)
    qx, xs = _byte_dot(w, 8, x_ptr, k + 1, K, offset_factor, qx, xs, BITS, OFFSETS, MASK_K)
    qx, xs = _byte_dot(hi, 0, x_ptr, k + 2, K, offset_factor, qx, xs, BITS, OFFSETS, MASK_K)
    qx, xs = _byte_dot(hi, 8, x_ptr, k + 3, K, offset_factor, qx, xs, BITS, OFFSETS, MASK_K)
    return qx, xs


@triton.jit
def _rows(n0, N, L, LS, BLOCK_N: tl.constexpr):  # type: ignore[no-untyped-def]
    """The program's BLOCK_N rows (clamped into the weight, so that every load is in bounds): each row's
    first code byte and first scale (as in chunk 0) and its tile's height R (16, less in a last tile)."""
    n = tl.minimum(n0 + tl.arange(0, BLOCK_N), N - 1)
    tile = (n // 16) * 16
    r = n % 16
    height = tl.minimum(N - tile, 16)
    return tile.to(tl.int64) * L, tile.to(tl.int64) * LS, r, height


@triton.jit
def _block_gemv_kernel(  # type: ignore[no-untyped-def]
    x_ptr,
    codes_ptr,
    scales_ptr,
    offs_ptr,
    bias_ptr,
    out_ptr,
    ws_ptr,
    N,
    K,
    L,
    LS,
    chunks,
    tail_pairs,
    offset_factor,
    BITS: tl.constexpr,
    OFFSETS: tl.constexpr,
    HAS_BIAS: tl.constexpr,
    BLOCK_N: tl.constexpr,
    VECS: tl.constexpr,  # 64-byte vectors of a chunk per step (a chunk has 4 at 4 bits, 8 at 8)
    MASK_K: tl.constexpr,  # K ends inside the whole chunks (K < 512 x chunks): mask the activations
) -> None:
    # grid (N / BLOCK_N, splits): one activation row. A step reads VECS 64-byte vectors of each row's chunk
    # as 32-bit words: word j of vector p holds block j's values 4p..4p+3 (one a byte; 4 bits: the high
    # nibbles 16 + 4p..), so (BLOCK_N, VECS, 16) words are (row, p, block) and each word's codes sum with
    # their activations in float32 before the block's scale multiplies them (``_word_dot``).
    pid_n = tl.program_id(0)
    pid_k = tl.program_id(1)
    splits = tl.num_programs(1)
    SEG: tl.constexpr = 256 if BITS == 4 else 512
    cbase, sbase, r, height = _rows(pid_n * BLOCK_N, N, L, LS, BLOCK_N)
    words_ptr = codes_ptr.to(tl.pointer_type(tl.int32))  # rows and chunks start on 32-byte boundaries
    v = tl.arange(0, VECS)[None, :, None]
    j = tl.arange(0, 16)[None, None, :]
    per_chunk = SEG // (64 * VECS)
    steps = chunks * per_chunk
    per = tl.cdiv(steps, splits)
    acc = tl.zeros([BLOCK_N, VECS, 16], dtype=tl.float32)
    for step in range(pid_k * per, tl.minimum(steps, pid_k * per + per)):
        s = step // per_chunk
        vec = (step % per_chunk) * VECS + v  # the step's vectors p
        w = tl.load(words_ptr + ((cbase + (s * height + r) * SEG) // 4)[:, None, None] + vec * 16 + j)
        k = s * 512 + j * 32 + vec * 4  # (1, VECS, 16): value 4p of block j
        qx, xs = _word_dot(w, x_ptr, k, K, offset_factor, BITS, OFFSETS, MASK_K)
        sp = (sbase + (s * height + r) * 16)[:, None, None] + j  # (BLOCK_N, 1, 16)
        d = tl.load(scales_ptr + sp).to(tl.float32)
        if OFFSETS == 0:  # d (q + f): the factor is in the codes
            acc = tl.fma(qx, d, acc)
        elif OFFSETS == 1:  # + the block's offset times its activations' sum
            acc = tl.fma(qx, d, tl.fma(tl.load(offs_ptr + sp).to(tl.float32), xs, acc))
        else:
            acc = tl.fma(qx - tl.load(offs_ptr + sp).to(tl.float32) * xs, d, acc)
    y = tl.sum(tl.sum(acc, 2), 1)
    if pid_k == splits - 1:  # the blocks past the last whole chunk, in pairs
        TB: tl.constexpr = 32 if BITS == 4 else 64
        i = tl.arange(0, TB)
        ctail = cbase + chunks * SEG * height + r * (L - chunks * SEG)
        stail = sbase + chunks * 16 * height + r * (LS - chunks * 16)
        for a in range(tail_pairs):
            c = tl.load(codes_ptr + (ctail + a * TB)[:, None] + i[None, :])
            k = chunks * 512 + a * 64 + i
            x = tl.load(x_ptr + k, mask=k < K, other=0.0).to(tl.float32)[None, :]
            if BITS == 4:  # low nibbles: block 2a, high: block 2a + 1
                x_hi = tl.load(x_ptr + k + 32, mask=k + 32 < K, other=0.0).to(tl.float32)[None, :]
                sp = (stail + 2 * a)[:, None]
                d = tl.load(scales_ptr + sp).to(tl.float32)
                w = _dequant(c & 15, d, offs_ptr + sp, offset_factor, OFFSETS) * x
                d = tl.load(scales_ptr + sp + 1).to(tl.float32)
                w += _dequant(c >> 4, d, offs_ptr + sp + 1, offset_factor, OFFSETS) * x_hi
            else:
                sp = (stail + 2 * a)[:, None] + (i // 32)[None, :]
                d = tl.load(scales_ptr + sp).to(tl.float32)
                w = _dequant(c, d, offs_ptr + sp, offset_factor, OFFSETS) * x
            y += tl.sum(w, 1)
    n = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    _finish_row(y, n, N, bias_ptr, out_ptr, ws_ptr, pid_k, splits, HAS_BIAS)


@triton.jit
def _finish_row(y, n, N, bias_ptr, out_ptr, ws_ptr, pid_k, splits, HAS_BIAS: tl.constexpr):  # type: ignore[no-untyped-def]
    """A GEMV's one row (triton_block_linear._finish for tiles): with one split the output (+ bias) in its
    dtype; with more this split's float32 partial sums."""
    if splits == 1:
        if HAS_BIAS:
            y += tl.load(bias_ptr + n, mask=n < N, other=0.0)
        tl.store(out_ptr + n, y.to(out_ptr.dtype.element_ty), mask=n < N)
    else:
        tl.store(ws_ptr + pid_k.to(tl.int64) * N + n, y, mask=n < N)
