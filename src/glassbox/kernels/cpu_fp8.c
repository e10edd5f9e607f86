/* glassbox CPU kernels for FP8 weights kept as the checkpoint stores them (quant/fp8/weights.py), compiled
 * with cpu_kernels.c by glassbox/kernels/native.py.
 *
 * Layout: row n of K weights is K bytes of E4M3 ("e4m3fn": 1 sign, 4 exponent bits of bias 7, 3 mantissa
 * bits; no infinities, S.1111.111 is NaN; the loader refuses NaN codes) and a float32 scale per block of
 * bn rows x bk columns: W[n, k] = e4m3(w[n, k]) * s[(n / bn) * Sk + k / bk], Sk = ceil(K / bk). Per-tensor
 * scales are one block of N x K, per-channel ones N blocks of 1 x K, 128 x 128 blocks the HF "fp8" layout.
 *
 * AVX-512 has no FP8 conversion. bf16 activations (with AVX512-VBMI and -BF16): every E4M3 value is exactly
 * a bf16, which two 128-entry byte lookups build (vpermi2b, see bf16x64), and vdpbf16ps multiplies it with
 * the activations exactly, summing in float32. float32 activations: E4M3 widens to IEEE half with integer
 * ops (sign-extend the byte to 16 bits, shift left by 7, keep bits 15 and 7..13: the exponent field lands in
 * the half's low 4 exponent bits and the mantissa in its top 3, so the half is exactly e4m3 * 2^-8 for every
 * finite code, subnormals included), vcvtph2ps widens it exactly, and the 2^8 goes into the block's scale
 * (s * 256, exact: a power of two). Without AVX-512 a 256-entry table gives each code's value.
 *
 * gb_fp8_gemv: decode rows (y = x W^T + b, float32 sums per scale block, then times the block's scale).
 * gb_fp8_dequant: rows of W dequantized (float32 or bf16, one rounding of w * s), the tiles that prompt
 * rows multiply in a bf16/float32 GEMM on the Python side.
 */
#include "cpu_common.h"
#if defined(__AVX512F__) && defined(__AVX512BW__) && defined(__AVX512VL__)
#include <immintrin.h>
#define GB_FP8_AVX512 1
#endif

static float E4M3[256]; /* code -> value */

__attribute__((constructor)) static void e4m3_table(void) {
    for (int b = 0; b < 256; b++) {
        const int e = (b >> 3) & 15, m = b & 7;
        float v = e ? ldexpf((float)(8 + m), e - 10) : ldexpf((float)m, -9); /* 2^(e-7) (1 + m/8); 2^-6 m/8 */
        if ((b & 0x7f) == 0x7f) v = NAN;
        E4M3[b] = (b & 0x80) ? -v : v;
    }
}

/* x (M x K, dt 0 float32 / 1 bf16) as float32: the caller's pointer, or *owned (free it) */
static const float *float_rows(const void *x, i64 M, i64 K, int dt, float **owned) {
    *owned = NULL;
    if (!dt) return (const float *)x;
    float *f = (float *)malloc((size_t)(M * K) * sizeof(float));
    if (!f) return NULL;
    for (i64 i = 0; i < M * K; i++) f[i] = bf2f(((const uint16_t *)x)[i]);
    *owned = f;
    return f;
}

/* one weight row against M activation rows, plain C: y[m] = sum_blocks s * sum_k e4m3(w) x */
static void row_plain(const uint8_t *w, const float *x, i64 M, i64 K, const float *s_row, i64 bk, float *y) {
    for (i64 m = 0; m < M; m++) {
        float total = 0.0f;
        for (i64 k0 = 0, cb = 0; k0 < K; k0 += bk, cb++) {
            const i64 k1 = k0 + bk < K ? k0 + bk : K;
            float acc = 0.0f;
            for (i64 k = k0; k < k1; k++) acc += E4M3[w[k]] * x[m * K + k];
            total += s_row[cb] * acc;
        }
        y[m] = total;
    }
}

#ifdef GB_FP8_AVX512
/* codes p[0..31] as two vectors of e4m3 * 2^-8 (see the header); ``mask``: which of the 32 bytes to read */
static inline void halves32(const uint8_t *p, __mmask32 mask, __m512 *lo, __m512 *hi) {
    const __m256i b = _mm256_maskz_loadu_epi8(mask, (const void *)p);
    const __m512i h = _mm512_and_si512(_mm512_slli_epi16(_mm512_cvtepi8_epi16(b), 7), _mm512_set1_epi16((short)0xBF80));
    *lo = _mm512_cvtph_ps(_mm512_castsi512_si256(h));
    *hi = _mm512_cvtph_ps(_mm512_extracti64x4_epi64(h, 1));
}

static inline __mmask32 first_bits32(i64 r) { return r >= 32 ? (__mmask32)0xffffffffu : (__mmask32)((1u << r) - 1u); }
static inline __mmask16 first_bits16(i64 r) {
    return r >= 16 ? (__mmask16)0xffff : r <= 0 ? (__mmask16)0 : (__mmask16)((1u << r) - 1u);
}

/* one weight row against one activation row: four chains of FMAs per block, the block's sum times 256 s */
static float row_dot1(const uint8_t *w, const float *x, i64 K, const float *s_row, i64 bk) {
    __m512 total = _mm512_setzero_ps();
    for (i64 k0 = 0, cb = 0; k0 < K; k0 += bk, cb++) {
        const i64 k1 = k0 + bk < K ? k0 + bk : K;
        __m512 a0 = _mm512_setzero_ps(), a1 = _mm512_setzero_ps(), a2 = _mm512_setzero_ps(), a3 = _mm512_setzero_ps();
        __m512 lo, hi, lo2, hi2;
        i64 k = k0;
        for (; k + 64 <= k1; k += 64) {
            halves32(w + k, 0xffffffffu, &lo, &hi);
            halves32(w + k + 32, 0xffffffffu, &lo2, &hi2);
            a0 = _mm512_fmadd_ps(lo, _mm512_loadu_ps(x + k), a0);
            a1 = _mm512_fmadd_ps(hi, _mm512_loadu_ps(x + k + 16), a1);
            a2 = _mm512_fmadd_ps(lo2, _mm512_loadu_ps(x + k + 32), a2);
            a3 = _mm512_fmadd_ps(hi2, _mm512_loadu_ps(x + k + 48), a3);
        }
        for (; k < k1; k += 32) { /* the last 1..63 columns of the block: masked */
            halves32(w + k, first_bits32(k1 - k), &lo, &hi);
            a0 = _mm512_fmadd_ps(lo, _mm512_maskz_loadu_ps(first_bits16(k1 - k), x + k), a0);
            a1 = _mm512_fmadd_ps(hi, _mm512_maskz_loadu_ps(first_bits16(k1 - k - 16), x + k + 16), a1);
        }
        const __m512 sum = _mm512_add_ps(_mm512_add_ps(a0, a1), _mm512_add_ps(a2, a3));
        total = _mm512_fmadd_ps(sum, _mm512_set1_ps(s_row[cb] * 256.0f), total);
    }
    return _mm512_reduce_add_ps(total);
}

/* one weight row against R (<= 4) float32 activation rows (row stride K): codes widened once per 32 for all R */
static inline __attribute__((always_inline)) void rows_f32(const uint8_t *w, const float *x, i64 K, const float *s_row,
                                                           i64 bk, int R, float *y) {
    __m512 total[4], a[4], b[4];
    for (int r = 0; r < R; r++) total[r] = _mm512_setzero_ps();
    for (i64 k0 = 0, cb = 0; k0 < K; k0 += bk, cb++) {
        const i64 k1 = k0 + bk < K ? k0 + bk : K;
        for (int r = 0; r < R; r++) a[r] = b[r] = _mm512_setzero_ps();
        for (i64 k = k0; k < k1; k += 32) {
            __m512 lo, hi;
            halves32(w + k, first_bits32(k1 - k), &lo, &hi);
            const __mmask16 m0 = first_bits16(k1 - k), m1 = first_bits16(k1 - k - 16);
            for (int r = 0; r < R; r++) {
                a[r] = _mm512_fmadd_ps(lo, _mm512_maskz_loadu_ps(m0, x + r * K + k), a[r]);
                b[r] = _mm512_fmadd_ps(hi, _mm512_maskz_loadu_ps(m1, x + r * K + k + 16), b[r]);
            }
        }
        const __m512 sv = _mm512_set1_ps(s_row[cb] * 256.0f);
        for (int r = 0; r < R; r++) total[r] = _mm512_fmadd_ps(_mm512_add_ps(a[r], b[r]), sv, total[r]);
    }
    for (int r = 0; r < R; r++) y[r] = _mm512_reduce_add_ps(total[r]);
}

/* one weight row against R (1..4) float32 activation rows */
static void group_f32(const uint8_t *w, const float *x, i64 K, const float *s_row, i64 bk, int R, float *y) {
    switch (R) {
    case 1: y[0] = row_dot1(w, x, K, s_row, bk); break;
    case 2: rows_f32(w, x, K, s_row, bk, 2, y); break;
    case 3: rows_f32(w, x, K, s_row, bk, 3, y); break;
    default: rows_f32(w, x, K, s_row, bk, 4, y); break;
    }
}
#endif

#if defined(GB_FP8_AVX512) && defined(__AVX512VBMI__) && defined(__AVX512BF16__)
/* bf16 activations: every E4M3 value is a bf16 (3 mantissa bits, exponents 2^-9 .. 2^8), so the codes become
 * bf16 weights by two 128-entry byte lookups (vpermi2b: the bf16's low and high bytes of each magnitude; the
 * sign bit ORed in) and the products run on vdpbf16ps, exact, summed in float32. Unpacking the byte pairs
 * works within 128-bit lanes: of 64 codes, the first vector holds codes 16j .. 16j+7 of each lane j, the
 * second 16j+8 .. 16j+15; the activations are laid out in that order once per call (bf16_rows). */
#define GB_FP8_BF16DOT 1
static uint8_t BF16_BYTES[256] __attribute__((aligned(64))); /* 128 low bytes, then 128 high bytes */

__attribute__((constructor)) static void bf16_bytes(void) {
    for (int c = 0; c < 128; c++) {
        const int e = (c >> 3) & 15, m = c & 7;
        const float v = c == 127 ? 0.0f : e ? ldexpf((float)(8 + m), e - 10) : ldexpf((float)m, -9); /* as E4M3 */
        uint32_t u;
        memcpy(&u, &v, 4);
        BF16_BYTES[c] = (uint8_t)((u >> 16) & 0xff);
        BF16_BYTES[128 + c] = (uint8_t)(u >> 24);
    }
}

static inline void bf16x64(__m512i codes, const __m512i t[4], __m512i *w0, __m512i *w1) {
    const __m512i lo = _mm512_permutex2var_epi8(t[0], codes, t[1]);
    __m512i hi = _mm512_permutex2var_epi8(t[2], codes, t[3]);
    hi = _mm512_ternarylogic_epi32(hi, codes, _mm512_set1_epi8((char)0x80), 0xF8); /* hi | (codes & 0x80) */
    *w0 = _mm512_unpacklo_epi8(lo, hi);
    *w1 = _mm512_unpackhi_epi8(lo, hi);
}

static inline __mmask64 first_bits64(i64 r) { return r >= 64 ? ~(__mmask64)0 : (((__mmask64)1 << r) - 1); }

/* x (M x K bf16) in the order bf16x64 leaves the weights: per 64 columns, the 32 values paired with the first
 * vector, then the 32 of the second; Kc = K rounded up to 64, zeros past K */
static uint16_t *bf16_rows(const uint16_t *x, i64 M, i64 K, i64 Kc) {
    uint16_t *p = (uint16_t *)malloc((size_t)(M * Kc) * 2);
    if (!p) return NULL;
    for (i64 m = 0; m < M; m++)
        for (i64 c = 0; c < Kc; c += 64)
            for (int q = 0; q < 64; q++) {
                const int half = q / 32, i = q % 32;
                const i64 k = c + 16 * (i / 8) + 8 * half + i % 8;
                p[m * Kc + c + q] = k < K ? x[m * K + k] : 0;
            }
    return p;
}

/* one weight row against R (<= 4) activation rows in bf16x64 order (row stride Kc); R == 1 keeps 4 chains */
static inline __attribute__((always_inline)) void rows_bf16(const uint8_t *w, const uint16_t *xp, i64 Kc, i64 K,
                                                            const float *s_row, i64 bk, int R, float *y,
                                                            const __m512i t[4]) {
    __m512 total[4], a[4], b[4], c = _mm512_setzero_ps(), d = _mm512_setzero_ps();
    for (int r = 0; r < R; r++) total[r] = _mm512_setzero_ps();
    for (i64 k0 = 0, cb = 0; k0 < K; k0 += bk, cb++) {
        const i64 k1 = k0 + bk < K ? k0 + bk : K;
        for (int r = 0; r < R; r++) a[r] = b[r] = _mm512_setzero_ps();
        i64 k = k0;
        __m512i w0, w1, w2, w3;
        if (R == 1) {
            c = d = _mm512_setzero_ps();
            for (; k + 128 <= k1; k += 128) {
                bf16x64(_mm512_loadu_si512((const void *)(w + k)), t, &w0, &w1);
                bf16x64(_mm512_loadu_si512((const void *)(w + k + 64)), t, &w2, &w3);
                a[0] = _mm512_dpbf16_ps(a[0], (__m512bh)w0, (__m512bh)_mm512_loadu_si512((const void *)(xp + k)));
                b[0] = _mm512_dpbf16_ps(b[0], (__m512bh)w1, (__m512bh)_mm512_loadu_si512((const void *)(xp + k + 32)));
                c = _mm512_dpbf16_ps(c, (__m512bh)w2, (__m512bh)_mm512_loadu_si512((const void *)(xp + k + 64)));
                d = _mm512_dpbf16_ps(d, (__m512bh)w3, (__m512bh)_mm512_loadu_si512((const void *)(xp + k + 96)));
            }
        }
        for (; k < k1; k += 64) {
            bf16x64(_mm512_maskz_loadu_epi8(first_bits64(k1 - k), (const void *)(w + k)), t, &w0, &w1);
            for (int r = 0; r < R; r++) {
                const uint16_t *xr = xp + r * Kc + k;
                a[r] = _mm512_dpbf16_ps(a[r], (__m512bh)w0, (__m512bh)_mm512_loadu_si512((const void *)xr));
                b[r] = _mm512_dpbf16_ps(b[r], (__m512bh)w1, (__m512bh)_mm512_loadu_si512((const void *)(xr + 32)));
            }
        }
        const __m512 sv = _mm512_set1_ps(s_row[cb]);
        if (R == 1) a[0] = _mm512_add_ps(a[0], _mm512_add_ps(c, d));
        for (int r = 0; r < R; r++) total[r] = _mm512_fmadd_ps(_mm512_add_ps(a[r], b[r]), sv, total[r]);
    }
    for (int r = 0; r < R; r++) y[r] = _mm512_reduce_add_ps(total[r]);
}

/* one weight row against R (1..4) activation rows in bf16x64 order */
static void group_bf16(const uint8_t *w, const uint16_t *xp, i64 Kc, i64 K, const float *s_row, i64 bk, int R,
                       float *y, const __m512i t[4]) {
    switch (R) {
    case 1: rows_bf16(w, xp, Kc, K, s_row, bk, 1, y, t); break;
    case 2: rows_bf16(w, xp, Kc, K, s_row, bk, 2, y, t); break;
    case 3: rows_bf16(w, xp, Kc, K, s_row, bk, 3, y, t); break;
    default: rows_bf16(w, xp, Kc, K, s_row, bk, 4, y, t); break;
    }
}
#endif

static inline void store_y(void *out, i64 m, i64 N, i64 n, float v, int dt) {
    if (dt)
        ((uint16_t *)out)[m * N + n] = f2bf(v);
    else
        ((float *)out)[m * N + n] = v;
}

/* Weight rows go in tiles of about TILE_BYTES, which stay in L2 while each group of up to 4 activation rows
 * (in L1) passes over them: the weights come from memory once, the activations from L1. */
#define TILE_BYTES (96 << 10)

/* M <= 64 activation rows */
static void gemv(const void *x, i64 M, i64 K, const uint8_t *w, const float *s, i64 bn, i64 bk, i64 Sk,
                 const float *bias, i64 N, void *out, int dt, int threads, int generic) {
    const i64 nt = K >= TILE_BYTES ? 1 : TILE_BYTES / K, tiles = (N + nt - 1) / nt;
#ifdef GB_FP8_BF16DOT
    if (!generic && dt && (bk % 64 == 0 || bk >= K)) { /* scale blocks start at multiples of 64 columns */
        const i64 Kc = (K + 63) / 64 * 64;
        uint16_t *xp = bf16_rows((const uint16_t *)x, M, K, Kc);
        if (!xp) return;
#pragma omp parallel for schedule(static) num_threads(threads) if (N * K >= (1 << 16))
        for (i64 tile = 0; tile < tiles; tile++) {
            __m512i t[4];
            for (int i = 0; i < 4; i++) t[i] = _mm512_load_si512((const void *)(BF16_BYTES + 64 * i));
            const i64 n1 = (tile + 1) * nt < N ? (tile + 1) * nt : N;
            for (i64 m0 = 0; m0 < M; m0 += 4) {
                const int R = M - m0 < 4 ? (int)(M - m0) : 4;
                for (i64 n = tile * nt; n < n1; n++) {
                    float y[4];
                    group_bf16(w + n * K, xp + m0 * Kc, Kc, K, s + (n / bn) * Sk, bk, R, y, t);
                    for (int r = 0; r < R; r++) store_y(out, m0 + r, N, n, y[r] + (bias ? bias[n] : 0.0f), dt);
                }
            }
        }
        free(xp);
        return;
    }
#endif
    float *owned;
    const float *xf = float_rows(x, M, K, dt, &owned);
    if (!xf) return;
#pragma omp parallel for schedule(static) num_threads(threads) if (N * K >= (1 << 16))
    for (i64 tile = 0; tile < tiles; tile++) {
        const i64 n1 = (tile + 1) * nt < N ? (tile + 1) * nt : N;
        for (i64 m0 = 0; m0 < M; m0 += 4) {
            const int R = M - m0 < 4 ? (int)(M - m0) : 4;
            for (i64 n = tile * nt; n < n1; n++) {
                float y[4];
                const uint8_t *wn = w + n * K;
                const float *s_row = s + (n / bn) * Sk;
#ifdef GB_FP8_AVX512
                if (!generic)
                    group_f32(wn, xf + m0 * K, K, s_row, bk, R, y);
                else
#endif
                    row_plain(wn, xf + m0 * K, R, K, s_row, bk, y);
                for (int r = 0; r < R; r++) store_y(out, m0 + r, N, n, y[r] + (bias ? bias[n] : 0.0f), dt);
            }
        }
    }
    free(owned);
}

/* 64 activation rows at a time (each weight row is read once per 64) */
static void gemv_rows(const void *x, i64 M, i64 K, const uint8_t *w, const float *s, i64 bn, i64 bk, i64 Sk,
                      const float *bias, i64 N, void *out, int dt, int threads, int generic) {
    const i64 es = dt ? 2 : 4;
    for (i64 m0 = 0; m0 < M; m0 += 64)
        gemv((const char *)x + m0 * K * es, M - m0 < 64 ? M - m0 : 64, K, w, s, bn, bk, Sk, bias, N,
             (char *)out + m0 * N * es, dt, threads, generic);
}

/* out (M x N, x's dtype: dt 0 float32 / 1 bf16) = x (M x K) W^T + bias (float32 or NULL) */
void gb_fp8_gemv(const void *x, i64 M, i64 K, const uint8_t *w, const float *s, i64 bn, i64 bk, i64 Sk,
                 const float *bias, i64 N, void *out, int dt, int threads) {
    gemv_rows(x, M, K, w, s, bn, bk, Sk, bias, N, out, dt, threads, 0);
}

/* the same on the plain-C path alone (the vector path's reference) */
void gb_fp8_gemv_generic(const void *x, i64 M, i64 K, const uint8_t *w, const float *s, i64 bn, i64 bk, i64 Sk,
                         const float *bias, i64 N, void *out, int dt, int threads) {
    gemv_rows(x, M, K, w, s, bn, bk, Sk, bias, N, out, dt, threads, 1);
}

/* rows n0 .. n1-1 of W into out ((n1 - n0) x K, dt 0 float32 / 1 bf16): e4m3(w) * s, rounded once */
void gb_fp8_dequant(const uint8_t *w, const float *s, i64 bn, i64 bk, i64 Sk, i64 K, i64 n0, i64 n1, void *out,
                    int dt, int threads) {
#pragma omp parallel for schedule(static) num_threads(threads) if ((n1 - n0) * K >= (1 << 16))
    for (i64 n = n0; n < n1; n++) {
        const uint8_t *wn = w + n * K;
        const float *s_row = s + (n / bn) * Sk;
        const i64 r = n - n0;
        for (i64 k0 = 0, cb = 0; k0 < K; k0 += bk, cb++) {
            const i64 k1 = k0 + bk < K ? k0 + bk : K;
            i64 k = k0;
#ifdef GB_FP8_AVX512
            const __m512 sv = _mm512_set1_ps(s_row[cb] * 256.0f);
            for (; k < k1; k += 32) {
                __m512 lo, hi;
                halves32(wn + k, first_bits32(k1 - k), &lo, &hi);
                lo = _mm512_mul_ps(lo, sv);
                hi = _mm512_mul_ps(hi, sv);
                const __mmask16 m0 = first_bits16(k1 - k), m1 = first_bits16(k1 - k - 16);
                if (dt) {
#ifdef __AVX512BF16__
                    uint16_t *o = (uint16_t *)out + r * K + k;
                    _mm256_mask_storeu_epi16(o, m0, (__m256i)_mm512_cvtneps_pbh(lo));
                    _mm256_mask_storeu_epi16(o + 16, m1, (__m256i)_mm512_cvtneps_pbh(hi));
#else
                    float t[32];
                    _mm512_storeu_ps(t, lo);
                    _mm512_storeu_ps(t + 16, hi);
                    for (i64 j = 0; j < 32 && k + j < k1; j++) ((uint16_t *)out)[r * K + k + j] = f2bf(t[j]);
#endif
                } else {
                    float *o = (float *)out + r * K + k;
                    _mm512_mask_storeu_ps(o, m0, lo);
                    _mm512_mask_storeu_ps(o + 16, m1, hi);
                }
            }
#endif
            const float sb = s_row[cb];
            for (; k < k1; k++) {
                const float v = E4M3[wn[k]] * sb;
                if (dt)
                    ((uint16_t *)out)[r * K + k] = f2bf(v);
                else
                    ((float *)out)[r * K + k] = v;
            }
        }
    }
}
