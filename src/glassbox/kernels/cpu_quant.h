/* Shared by cpu_quant.c (the block GEMV) and cpu_dequant.c: the block layout's helpers (see cpu_quant.c). */
#ifndef GB_CPU_QUANT_H
#define GB_CPU_QUANT_H
#include "cpu_common.h"
#if defined(__AVX512F__) && defined(__AVX512BW__) && defined(__AVX512VNNI__)
#include <immintrin.h>
#define GB_VNNI 1
#endif

static inline float h2f(uint16_t h) { /* IEEE half to float, exact */
    const uint32_t sign = (uint32_t)(h & 0x8000u) << 16;
    uint32_t exp = (h >> 10) & 0x1fu, man = h & 0x3ffu, u;
    if (exp == 0x1fu) {
        u = sign | 0x7f800000u | (man << 13);
    } else if (exp != 0) {
        u = sign | ((exp + 112u) << 23) | (man << 13);
    } else if (man == 0) {
        u = sign;
    } else { /* subnormal half: normalize */
        exp = 113u;
        while (!(man & 0x400u)) {
            man <<= 1;
            exp--;
        }
        u = sign | (exp << 23) | ((man & 0x3ffu) << 13);
    }
    float f;
    memcpy(&f, &u, 4);
    return f;
}

#define CHUNK 16 /* blocks per interleaved chunk: 512 codes */

/* ``bits`` as the kernels take it: the code width (4, 5 or 8) in the low 4 bits, and GB_NL where 4-bit codes
 * are indices into IQ4_NL's table of 16 int8 values, the code then being the value + 128 (so the offset is
 * -128 d, as Q8_0's). A chunk's codes take 64 * width bytes: 5 bits are 4-bit nibbles as stored at 4 bits
 * (256 bytes), then 8 masks of 64 bits, mask p holding bit 4 of the codes of vector p (see cpu_quant.c). */
#define GB_NL 16
static const int8_t IQ4_NL_VALUES[16] = {-127, -104, -83, -65, -49, -35, -22, -10, 1, 13, 25, 38, 53, 69, 89, 113};
static inline int code_width(int bits) { return bits & 15; }
static inline i64 chunk_bytes(int bits) { return 64 * code_width(bits); }
static inline i64 code_row_bytes(i64 Kp, int bits) { return Kp * code_width(bits) / 8; }

/* Where code k of a row lives (see the layout above): its byte, times 2 plus the nibble (1: high) for 4 bits. */
static inline i64 code_index(i64 k, i64 Kp, int bits) {
    const i64 b = k / 32, pos = k % 32, chunks = Kp / 32 / CHUNK;
    if (b < chunks * CHUNK) {
        const i64 ch = b / CHUNK, j = b % CHUNK, p = pos / 4, t = pos % 4;
        if (bits == 8) return ch * 512 + p * 64 + j * 4 + t;
        return 2 * (ch * 256 + (p % 4) * 64 + j * 4 + t) + p / 4;
    }
    if (bits == 8) return k;
    const i64 tail = k - chunks * CHUNK * 32;
    return 2 * (chunks * 256 + (tail / 64) * 32 + (tail % 32)) + (tail % 64) / 32;
}

#define TILE 16 /* rows per tile */

/* Where element j of row n lies in a tiled array of N rows of L elements whose first ``cut`` come in
 * segments of ``seg`` (cpu_quant.c, quant/blocks/tiles.py): tile t = n / 16 of R = min(16, N - 16 t) rows at
 * 16 t L; in it segment s of its row r at (s R + r) seg, then row r's last L - cut elements at cut R + r (L - cut). */
static inline i64 tiled_index(i64 n, i64 j, i64 N, i64 L, i64 seg, i64 cut) {
    const i64 t = n / TILE, r = n % TILE, R = N - t * TILE < TILE ? N - t * TILE : TILE;
    if (j < cut) return t * TILE * L + ((j / seg) * R + r) * seg + j % seg;
    return t * TILE * L + cut * R + r * (L - cut) + (j - cut);
}

/* One row of tiled block weights: chunk ch's codes at w + ch * wstep, its 16 scales (offsets, zero codes)
 * at d + ch * mstep (o, z); the blocks past the last whole chunk at wt (dt, ot, zt), in order. */
typedef struct {
    const uint8_t *w, *wt, *z, *zt;
    const uint16_t *d, *dt, *o, *ot;
    i64 wstep, mstep;
} block_row;

static inline block_row row_at(const uint8_t *w, const uint16_t *d, const uint16_t *o, const uint8_t *z, i64 N,
                               i64 Kp, int bits, i64 n) {
    const i64 nb = Kp / 32, chunks = nb / CHUNK, cb = chunk_bytes(bits), row_bytes = code_row_bytes(Kp, bits);
    const i64 t = n / TILE, r = n % TILE, R = N - t * TILE < TILE ? N - t * TILE : TILE;
    const i64 wa = t * TILE * row_bytes, ma = t * TILE * nb, mt = ma + chunks * CHUNK * R + r * (nb - chunks * CHUNK);
    block_row x;
    x.w = w + wa + r * cb;
    x.wt = w + wa + chunks * cb * R + r * (row_bytes - chunks * cb);
    x.wstep = R * cb;
    x.mstep = R * CHUNK;
    x.d = d + ma + r * CHUNK;
    x.dt = d + mt;
    x.o = o ? o + ma + r * CHUNK : NULL;
    x.ot = o ? o + mt : NULL;
    x.z = z ? z + ma + r * CHUNK : NULL;
    x.zt = z ? z + mt : NULL;
    return x;
}

/* Part r of 16 of [p, p + bytes) into the cache: while a tile's rows are read one by one (each row's
 * chunks a tile's width apart, a pattern the hardware prefetcher misses), the next tile comes in order. */
static inline void prefetch_part(const void *p, i64 bytes, i64 r) {
    const char *c = (const char *)p;
    for (i64 i = (bytes * r / TILE) & ~(i64)63; i < bytes * (r + 1) / TILE; i += 64) __builtin_prefetch(c + i, 0, 3);
}

static inline void store_out(void *out, i64 i, float v, int dt) {
    if (dt)
        ((uint16_t *)out)[i] = f2bf(v);
    else
        ((float *)out)[i] = v;
}

/* Code k of row n of the tiled weights w (N rows), element by element (the plain-C paths): 5 bits take their
 * nibble where 4 bits have it (a chunk 320 bytes apart, a tail pair 40) and bit 4 from the masks after it. */
static inline int code_at(const uint8_t *w, i64 N, i64 n, i64 k, i64 Kp, int bits) {
    const i64 cb = chunk_bytes(bits), chunks = Kp / 32 / CHUNK, cut = chunks * cb, L = code_row_bytes(Kp, bits);
    if (code_width(bits) == 8) return w[tiled_index(n, code_index(k, Kp, 8), N, L, cb, cut)];
    const i64 i = code_index(k, Kp, 4);
    i64 byte = i >> 1, high = -1; /* the byte of its nibble; the bit (byte * 8 + bit) of its fifth bit */
    if (code_width(bits) == 5 && k < chunks * CHUNK * 32) {
        const i64 ch = byte / 256, v = code_index(k, Kp, 8) % 512; /* byte v % 64 of vector v / 64 */
        byte = ch * 320 + byte % 256;
        high = (ch * 320 + 256 + (v / 64) * 8) * 8 + v % 64;
    } else if (code_width(bits) == 5) {
        const i64 tail = k - chunks * CHUNK * 32, pair = cut + (tail / 64) * 40;
        byte = pair + tail % 32;
        high = (pair + 32) * 8 + tail % 64;
    }
    const uint8_t b = w[tiled_index(n, byte, N, L, cb, cut)];
    int q = (i & 1) ? (b >> 4) : (b & 15);
    if (high >= 0) q |= ((w[tiled_index(n, high >> 3, N, L, cb, cut)] >> (high & 7)) & 1) << 4;
    return (bits & GB_NL) ? IQ4_NL_VALUES[q] + 128 : q;
}

/* Where block b of row n's scale (offset, zero code) lies in the tiled per-block arrays. */
static inline i64 meta_at(i64 N, i64 n, i64 b, i64 Kp) {
    const i64 nb = Kp / 32;
    return tiled_index(n, b, N, nb, CHUNK, nb / CHUNK * CHUNK);
}

/* Block b's offset o (see cpu_quant.c): stored (o), -z d for integer zero codes (z), else c d. Exact: a
 * float16 d times an integer below 256 fits float32's 24 bits. */
static inline float block_offset(const uint16_t *o, const uint8_t *z, float c, i64 b, float db) {
    return o ? h2f(o[b]) : z ? -(float)z[b] * db : c * db;
}

#ifdef GB_VNNI
/* The offsets of blocks b .. b + 15 of one row, whose scales are dv (as block_offset). */
static inline __m512 block_offsets16(const uint16_t *o, const uint8_t *z, float c, i64 b, __m512 dv) {
    if (o) return _mm512_cvtph_ps(_mm256_loadu_si256((const __m256i *)(o + b)));
    if (z) {
        const __m512 zf = _mm512_cvtepi32_ps(_mm512_cvtepu8_epi32(_mm_loadu_si128((const __m128i *)(z + b))));
        return _mm512_mul_ps(zf, _mm512_sub_ps(_mm512_setzero_ps(), dv));
    }
    return _mm512_mul_ps(dv, _mm512_set1_ps(c));
}

/* Code vector p (0..7) of a chunk whose codes start at w: its 64 codes, 4 of each of the chunk's 16 blocks
 * (cpu_quant.c), unsigned bytes. Inlined where ``bits`` is a constant. */
static inline __attribute__((always_inline)) __m512i chunk_vector(const uint8_t *w, int bits, int p) {
    if (code_width(bits) == 8) return _mm512_loadu_si512((const void *)(w + p * 64));
    const __m512i raw = _mm512_loadu_si512((const void *)(w + (p % 4) * 64)), m15 = _mm512_set1_epi8(15);
    __m512i v = _mm512_and_si512(p < 4 ? raw : _mm512_srli_epi16(raw, 4), m15);
    if (code_width(bits) == 5) {
        uint64_t high;
        memcpy(&high, w + 256 + 8 * p, 8);
        v = _mm512_mask_add_epi8(v, _cvtu64_mask64(high), v, _mm512_set1_epi8(16));
    }
    if (bits & GB_NL) {
        const __m128i t = _mm_add_epi8(_mm_loadu_si128((const __m128i *)IQ4_NL_VALUES), _mm_set1_epi8(-128));
        v = _mm512_shuffle_epi8(_mm512_broadcast_i32x4(t), v);
    }
    return v;
}

/* A tail pair's codes (blocks b and b + 1 past the last whole chunk, at w: 4 bits 32 bytes, 5 bits 40, 8 bits
 * 64) as two vectors of 32 unsigned codes in value order. */
static inline void tail_pair(const uint8_t *w, int bits, __m256i *c0, __m256i *c1) {
    if (code_width(bits) == 8) {
        *c0 = _mm256_loadu_si256((const __m256i *)w);
        *c1 = _mm256_loadu_si256((const __m256i *)(w + 32));
        return;
    }
    const __m256i v = _mm256_loadu_si256((const __m256i *)w), m15 = _mm256_set1_epi8(15);
    *c0 = _mm256_and_si256(v, m15);
    *c1 = _mm256_and_si256(_mm256_srli_epi16(v, 4), m15);
    if (code_width(bits) == 5) {
        uint64_t high;
        memcpy(&high, w + 32, 8);
        const __m256i b4 = _mm256_set1_epi8(16);
        *c0 = _mm256_mask_add_epi8(*c0, (__mmask32)(uint32_t)high, *c0, b4);
        *c1 = _mm256_mask_add_epi8(*c1, (__mmask32)(uint32_t)(high >> 32), *c1, b4);
    }
    if (bits & GB_NL) {
        const __m128i t = _mm_add_epi8(_mm_loadu_si128((const __m128i *)IQ4_NL_VALUES), _mm_set1_epi8(-128));
        const __m256i t2 = _mm256_broadcastsi128_si256(t);
        *c0 = _mm256_shuffle_epi8(t2, *c0);
        *c1 = _mm256_shuffle_epi8(t2, *c1);
    }
}

/* (cpu_quant.c's GEMV and cpu_quant_gemm.c's GEMM) A row's blocks past the last whole chunk (rw.wt ..., in order, an even count below 16 from b0) against one
 * activation row: a vector whose lanes sum to sum_b dx d ip + o cx. Each pair of blocks in one 512-bit VNNI
 * product (lanes 0-7 block b, 8-15 block b + 1), times its blocks' scales dx d; the offsets' o cx in one. */
static inline __attribute__((always_inline)) __m512 tail_vnni(const block_row *rw, float c, i64 Kp, int bits,
                                                              const int8_t *a, const float *dx, const float *cx,
                                                              i64 b0) {
    const i64 nt = Kp / 32 - b0;
    const __mmask16 km = (__mmask16)((1u << nt) - 1u);
    const __m512 dv = _mm512_cvtph_ps(_mm256_maskz_loadu_epi16(km, rw->dt));
    const __m512 sv = _mm512_mul_ps(dv, _mm512_maskz_loadu_ps(km, dx + b0));
    __m512 ov;
    if (rw->ot)
        ov = _mm512_cvtph_ps(_mm256_maskz_loadu_epi16(km, rw->ot));
    else if (rw->zt)
        ov = _mm512_mul_ps(_mm512_cvtepi32_ps(_mm512_cvtepu8_epi32(_mm_maskz_loadu_epi8(km, rw->zt))),
                           _mm512_sub_ps(_mm512_setzero_ps(), dv));
    else
        ov = _mm512_mul_ps(dv, _mm512_set1_ps(c));
    __m512 acc = _mm512_mul_ps(ov, _mm512_maskz_loadu_ps(km, cx + b0));
    const __m512i pair = _mm512_setr_epi32(0, 0, 0, 0, 0, 0, 0, 0, 1, 1, 1, 1, 1, 1, 1, 1);
    for (i64 i = 0; i < nt; i += 2) {
        __m256i c0, c1;
        tail_pair(rw->wt + i * 4 * code_width(bits), bits, &c0, &c1); /* a pair's 8 * width bytes */
        const __m512i cc = _mm512_inserti64x4(_mm512_castsi256_si512(c0), c1, 1);
        const __m512i ip = _mm512_dpbusd_epi32(_mm512_setzero_si512(), cc, _mm512_loadu_si512((const void *)(a + (b0 + i) * 32)));
        const __m512 s = _mm512_permutexvar_ps(_mm512_add_epi32(pair, _mm512_set1_epi32((int)i)), sv);
        acc = _mm512_fmadd_ps(_mm512_cvtepi32_ps(ip), s, acc);
    }
    return acc;
}

/* Lane r of the result: the sum of the 16 lanes of v[r] (16 vectors in, one out: a tree of permute-adds);
 * the 16-row batch-1 GEMVs of cpu_quant.c and cpu_kquant.c. */
static inline __m512 sum_lanes16(__m512 v[16]) {
    const __m512i lo = _mm512_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7, 16, 17, 18, 19, 20, 21, 22, 23);
    const __m512i hi = _mm512_setr_epi32(8, 9, 10, 11, 12, 13, 14, 15, 24, 25, 26, 27, 28, 29, 30, 31);
    const __m512i lo2 = _mm512_setr_epi32(0, 1, 2, 3, 16, 17, 18, 19, 8, 9, 10, 11, 24, 25, 26, 27);
    const __m512i hi2 = _mm512_setr_epi32(4, 5, 6, 7, 20, 21, 22, 23, 12, 13, 14, 15, 28, 29, 30, 31);
    const __m512i lo3 = _mm512_setr_epi32(0, 1, 16, 17, 4, 5, 20, 21, 8, 9, 24, 25, 12, 13, 28, 29);
    const __m512i hi3 = _mm512_setr_epi32(2, 3, 18, 19, 6, 7, 22, 23, 10, 11, 26, 27, 14, 15, 30, 31);
    const __m512i lo4 = _mm512_setr_epi32(0, 16, 2, 18, 4, 20, 6, 22, 8, 24, 10, 26, 12, 28, 14, 30);
    const __m512i hi4 = _mm512_setr_epi32(1, 17, 3, 19, 5, 21, 7, 23, 9, 25, 11, 27, 13, 29, 15, 31);
    __m512 a[8], b[4], e[2];
    /* pair (r, r + 8): halves 8 lanes wide; then 4, 2, 1 */
    for (int i = 0; i < 8; i++)
        a[i] = _mm512_add_ps(_mm512_permutex2var_ps(v[i], lo, v[i + 8]), _mm512_permutex2var_ps(v[i], hi, v[i + 8]));
    for (int i = 0; i < 4; i++)
        b[i] = _mm512_add_ps(_mm512_permutex2var_ps(a[i], lo2, a[i + 4]), _mm512_permutex2var_ps(a[i], hi2, a[i + 4]));
    for (int i = 0; i < 2; i++)
        e[i] = _mm512_add_ps(_mm512_permutex2var_ps(b[i], lo3, b[i + 2]), _mm512_permutex2var_ps(b[i], hi3, b[i + 2]));
    return _mm512_add_ps(_mm512_permutex2var_ps(e[0], lo4, e[1]), _mm512_permutex2var_ps(e[0], hi4, e[1]));
}
#endif

#endif
