"""The one-row kernel for block weights (kernels/triton_block_linear.py has the rest and the host code) and
the helpers both kernels share: a program's rows in the 16-row tiles, and codes made floats in place.

See triton_block_linear.py's docstring for the layout and the arithmetic.
"""

from __future__ import annotations

import triton
import triton.language as tl


@triton.jit
def _e2m1(c):  # type: ignore[no-untyped-def]
    """4-bit E2M1 codes c (in the low bits of an integer) as float32, exact, built from bits (no
    conversion): magnitude code m = c & 7 is 0, 0.5 (m = 1) or (1 + (m & 1) / 2) 2^((m >> 1) - 1); bit 3 the
    sign."""
    c = c.to(tl.int32)
    m = c & 7
    normal = (((m >> 1) + 126) << 23) | ((m & 1) << 22)
    bits = tl.where(m >= 2, normal, tl.where(m == 1, 126 << 23, 0)) | ((c & 8) << 28)
    return bits.to(tl.float32, bitcast=True)


@triton.jit
def _scale(ptrs, OFFSETS: tl.constexpr):  # type: ignore[no-untyped-def]
    """The blocks' scales at ``ptrs`` as float32: float16 (OFFSETS 0-2), an E8M0 byte 2^(e - 127) (3,
    MXFP4; e = 0 reads as 0: 2^-127 is a subnormal the GPU flushes), an E4M3 byte (4, NVFP4's half-block
    scales), all exact."""
    raw = tl.load(ptrs)
    if OFFSETS < 3:
        return raw.to(tl.float32)
    b = raw.to(tl.int32)
    if OFFSETS == 3:
        return (b << 23).to(tl.float32, bitcast=True)
    e = (b >> 3) & 15
    normal = ((((e + 120) << 23) | ((b & 7) << 20)) | ((b & 128) << 24)).to(tl.float32, bitcast=True)
    sub = (b & 7).to(tl.float32) * 0.001953125  # 2^-9 per step below the smallest normal
    return tl.where(e == 0, tl.where(b >= 128, -sub, sub), normal)


@triton.jit
def _block_scale(scales_ptr, sb_ptr, sp, OFFSETS: tl.constexpr):  # type: ignore[no-untyped-def]
    """The scales d (float32) of the blocks at tiled positions sp: ``_scale`` of the stored ones, or for the
    K-quants a super-block's float16 d (``sb_ptr``) times a sub-block's integer scale in float32, exact: 5
    (Q4_K, Q5_K; sp a block's position) d at 2 (sp >> 3) (the super-block's pair d, dmin) times the 6-bit
    sc byte; 6 (Q6_K; sp a half block's position, 2 x its block's + the half) d at sp >> 4 times the int8
    sc."""
    if OFFSETS == 5:
        return tl.load(sb_ptr + 2 * (sp >> 3)).to(tl.float32) * tl.load(scales_ptr + sp).to(tl.float32)
    elif OFFSETS == 6:
        return tl.load(sb_ptr + (sp >> 4)).to(tl.float32) * tl.load(scales_ptr + sp).to(tl.float32)
    else:
        return _scale(scales_ptr + sp, OFFSETS)


@triton.jit
def _block_offset(offs_ptr, sb_ptr, sp, OFFSETS: tl.constexpr):  # type: ignore[no-untyped-def]
    """What ``_dequant`` adds per block at tiled positions sp, float32: the stored offset m (1), the zero
    code z (2), a K-quant's -dmin m (5: the super-block's dmin at 2 (sp >> 3) + 1 times the 6-bit min byte,
    exact); 0 where the kind has none."""
    if OFFSETS == 1 or OFFSETS == 2:
        return tl.load(offs_ptr + sp).to(tl.float32)
    elif OFFSETS == 5:
        return -(tl.load(sb_ptr + 2 * (sp >> 3) + 1).to(tl.float32) * tl.load(offs_ptr + sp).to(tl.float32))
    else:  # one return a kind: the compiler types every return it reaches
        return tl.full(sp.shape, 0.0, tl.float32)


@triton.jit
def _dequant(c, d, o, offset_factor, OFFSETS: tl.constexpr):  # type: ignore[no-untyped-def]
    """Codes c (0..255, any integer type) of blocks with scales d (float32) and their ``_block_offset`` o,
    dequantized in float32: d (q + f) for the constant f (an integer: -8, -128; Q6_K's -32), d (q - z) for
    zero codes z, d q + m for stored offsets m (and a K-quant's -dmin m): the reference's d q + o to the bit
    (q d is exact in float32: at most 8 + 17 significant bits but for Q6_K's (q - 32) d, rounded once as
    the reference rounds it; the sum rounds once). The code becomes a float as the low mantissa bits of
    2^23 (2^23 + q, exact), less 2^23 and the integer offset in one subtraction: no int-to-float
    conversion instruction (quarter rate on recent GPUs: it would bound a 4-bit GEMV)."""
    if OFFSETS == 3 or OFFSETS == 4:  # E2M1 codes (MXFP4, NVFP4): the value times its scale, exact
        return _e2m1(c) * d
    f = (c.to(tl.int32) | 0x4B000000).to(tl.float32, bitcast=True)
    if OFFSETS == 0 or OFFSETS == 6:
        w = (f - (8388608.0 - offset_factor)) * d
    elif OFFSETS == 1 or OFFSETS == 5:
        w = (f - 8388608.0) * d + o
    else:
        w = (f - (8388608.0 + o)) * d
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
    if OFFSETS == 0 or OFFSETS == 6:
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
    k of a block (4 bits: and value k + 16 in the high nibble), products fused into the running sum. E2M1
    codes (OFFSETS 3, 4): (low nibbles' values x activations, high nibbles' values x activations), which
    NVFP4 scales apart."""
    if MASK_K:
        x = tl.load(x_ptr + k, mask=k < K, other=0.0).to(tl.float32)
    else:
        x = tl.load(x_ptr + k).to(tl.float32)
    if OFFSETS == 3 or OFFSETS == 4:  # E2M1: qx sums the low nibbles (a block's first 16 values), xs the high
        qx = tl.fma(_e2m1(word >> SHIFT), x, qx)
    else:
        qx = tl.fma(_field(word, SHIFT, BITS if BITS == 8 else 4, OFFSETS, offset_factor), x, qx)
        xs += x
    if BITS == 4:
        if MASK_K:
            x = tl.load(x_ptr + k + 16, mask=k + 16 < K, other=0.0).to(tl.float32)
        else:
            x = tl.load(x_ptr + k + 16).to(tl.float32)
        if OFFSETS == 3 or OFFSETS == 4:
            xs = tl.fma(_e2m1(word >> (SHIFT + 4)), x, xs)
        else:
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
    return _rows_at(tl.minimum(n0 + tl.arange(0, BLOCK_N), N - 1), N, L, LS)


@triton.jit
def _rows_at(n, N, L, LS):  # type: ignore[no-untyped-def]
    """``_rows`` of the rows n (in bounds) of a weight of N rows."""
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
    rs_ptr,  # NVFP4's per-row tensor scales (HAS_ROW_SCALE)
    sb_ptr,  # the K-quants' super-block scales (OFFSETS 5, 6)
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
    HAS_ROW_SCALE: tl.constexpr,
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
        if OFFSETS == 6:  # Q6_K's scale per half block: a step's vectors lie in one half (values 4p.., p < 4)
            tl.static_assert(4 % VECS == 0)
            d = _block_scale(scales_ptr, sb_ptr, 2 * sp + (step % per_chunk) * VECS // 4, OFFSETS)
        else:
            d = _block_scale(scales_ptr, sb_ptr, sp, OFFSETS)
        if OFFSETS == 3 or OFFSETS == 4:  # E2M1: the first halves by d, the second by NVFP4's other scale
            acc = tl.fma(xs, _scale(offs_ptr + sp, OFFSETS) if OFFSETS == 4 else d, tl.fma(qx, d, acc))
        elif OFFSETS == 0 or OFFSETS == 6:  # d (q + f): the factor is in the codes
            acc = tl.fma(qx, d, acc)
        elif OFFSETS == 1 or OFFSETS == 5:  # + the block's offset times its activations' sum
            acc = tl.fma(qx, d, tl.fma(_block_offset(offs_ptr, sb_ptr, sp, OFFSETS), xs, acc))
        else:
            acc = tl.fma(qx - _block_offset(offs_ptr, sb_ptr, sp, OFFSETS) * xs, d, acc)
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
                d = _tail_scale(scales_ptr, offs_ptr, sb_ptr, sp, i, OFFSETS)
                o = _block_offset(offs_ptr, sb_ptr, sp, OFFSETS)
                w = _dequant(c & 15, d, o, offset_factor, OFFSETS) * x
                d = _tail_scale(scales_ptr, offs_ptr, sb_ptr, sp + 1, i, OFFSETS)
                o = _block_offset(offs_ptr, sb_ptr, sp + 1, OFFSETS)
                w += _dequant(c >> 4, d, o, offset_factor, OFFSETS) * x_hi
            else:
                sp = (stail + 2 * a)[:, None] + (i // 32)[None, :]
                d = _tail_scale(scales_ptr, offs_ptr, sb_ptr, sp, i % 32, OFFSETS)
                w = _dequant(c, d, _block_offset(offs_ptr, sb_ptr, sp, OFFSETS), offset_factor, OFFSETS) * x
            y += tl.sum(w, 1)
    n = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    if HAS_ROW_SCALE:  # NVFP4's tensor scale, per row
        y *= tl.load(rs_ptr + n, mask=n < N, other=0.0)
    _finish_row(y, n, N, bias_ptr, out_ptr, ws_ptr, pid_k, splits, HAS_BIAS)


@triton.jit
def _tail_scale(scales_ptr, offs_ptr, sb_ptr, sp, i, OFFSETS: tl.constexpr):  # type: ignore[no-untyped-def]
    """The scales of tail codes, values i (0..31, a row vector) of the blocks at ``sp``: the block's, or the
    half block's for NVFP4 (the first half's from the scales, the second's from ``offs_ptr``) and Q6_K."""
    if OFFSETS == 6:
        return _block_scale(scales_ptr, sb_ptr, 2 * sp + (i // 16)[None, :], OFFSETS)
    d = _block_scale(scales_ptr, sb_ptr, sp, OFFSETS)
    if OFFSETS == 4:
        d = tl.where((i < 16)[None, :], d, _scale(offs_ptr + sp, OFFSETS))
    return d


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
