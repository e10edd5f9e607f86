/* glassbox CPU kernels for weights kept in 32-value blocks of 4 or 8 bits (GGUF Q4_0, Q4_1, Q8_0, and
 * --quantization int4/int8), compiled with cpu_kernels.c by glassbox/kernels/native.py.
 *
 * One weight layout for every format (repacked at load by layers/block_quant.py): row n of K values
 * (K padded to Kp, a multiple of 64) holds unsigned codes q, and per 32-value block b a float16 scale
 * d[n,b] and an offset o[n,b]:  W[n,k] = d[n,b] * q[n,k] + o[n,b],  b = k / 32.  The offset is either
 * stored (float16, Q4_1: the block's min m) or c d[n,b] for one constant c (o16 == NULL):
 *   Q4_0 and int4: q in 0..15, c = -8.   Q8_0 and int8: q = s + 128 (s the int8), c = -128.
 * So a Q4_0 row costs 4.5 bits per weight, Q4_1 5, Q8_0 8.5: the file's own sizes.
 * 4-bit codes: each 32-byte group holds 64 codes, the low nibbles codes 0..31, the high nibbles 32..63.
 * 8-bit codes: one byte each, in order.
 *
 * Decode rows (a few at a time) take llama.cpp's route: the activations are quantized to int8 per
 * 32-value block (scale dx = max|x| / 127, codes qx summing to sx; cx = dx sx), and
 *   y[m,n] = sum_b dx[m,b] d[n,b] sum_k q[n,k] qx[m,k]  +  sum_b o[n,b] cx[m,b]
 * with the inner sums exact in int32 (AVX-512 VNNI: 64 u8 x s8 products per instruction).
 * Other rows (prefill) dequantize the weight and use a float GEMM on the Python side.
 */
#include <math.h>
#include <stdint.h>
#include <string.h>
#if defined(__AVX512F__) && defined(__AVX512BW__) && defined(__AVX512VNNI__)
#include <immintrin.h>
#define GB_VNNI 1
#endif

typedef int64_t i64;

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

static inline float q_bf2f(uint16_t h) {
    uint32_t u = (uint32_t)h << 16;
    float f;
    memcpy(&f, &u, 4);
    return f;
}

static inline uint16_t q_f2bf(float f) { /* round to nearest even, NaN kept quiet */
    uint32_t u;
    memcpy(&u, &f, 4);
    if ((u & 0x7fffffffu) > 0x7f800000u) return (uint16_t)((u >> 16) | 0x40u);
    u += 0x7fffu + ((u >> 16) & 1u);
    return (uint16_t)(u >> 16);
}

/* Activations (M x K, float32 dt=0 or bf16 dt=1, row stride K) to int8 blocks: qx (M x Kp, zero past K),
 * dx and cx = dx * sum(codes) (M x Kp/32). A block of zeros gets dx = 0. Codes round half away from 0. */
void gb_quantize_rows_q8(const void *x, i64 M, i64 K, i64 Kp, int8_t *qx, float *dx, float *cx, int dt,
                         int threads) {
    const i64 nb = Kp / 32;
#pragma omp parallel for schedule(static) num_threads(threads) if (M * K >= (1 << 16))
    for (i64 m = 0; m < M; m++) {
        float v[32];
        for (i64 b = 0; b < nb; b++) {
            float amax = 0.0f;
            for (int j = 0; j < 32; j++) {
                const i64 k = b * 32 + j;
                float f = 0.0f;
                if (k < K) f = dt ? q_bf2f(((const uint16_t *)x)[m * K + k]) : ((const float *)x)[m * K + k];
                v[j] = f;
                const float a = f < 0 ? -f : f;
                amax = a > amax ? a : amax;
            }
            const float d = amax / 127.0f;
            const float id = d > 0.0f ? 1.0f / d : 0.0f;
            int32_t s = 0;
            int8_t *q = qx + m * Kp + b * 32;
            for (int j = 0; j < 32; j++) {
                const int c = (int)roundf(v[j] * id);
                q[j] = (int8_t)c;
                s += c;
            }
            dx[m * nb + b] = d;
            cx[m * nb + b] = d * (float)s;
        }
    }
}

static inline void store_out(void *out, i64 i, float v, int dt) {
    if (dt)
        ((uint16_t *)out)[i] = q_f2bf(v);
    else
        ((float *)out)[i] = v;
}

/* sum over the codes of one 32-value block of row ``w`` times the activation codes ``a`` (exact int32) */
static inline int32_t block_dot_u4(const uint8_t *group, int high, const int8_t *a) {
    int32_t s = 0;
    for (int j = 0; j < 32; j++) s += (int32_t)(high ? group[j] >> 4 : group[j] & 15) * a[j];
    return s;
}

static inline int32_t block_dot_u8(const uint8_t *w, const int8_t *a) {
    int32_t s = 0;
    for (int j = 0; j < 32; j++) s += (int32_t)w[j] * a[j];
    return s;
}

/* sum_b o[b] cx[b]: the offsets' share of one output (o = c d when o16 is NULL) */
static inline float offset_dot(const uint16_t *d, const uint16_t *o16, float c, const float *cx, i64 nb) {
    float s = 0.0f;
    if (o16 == NULL) {
        for (i64 b = 0; b < nb; b++) s += h2f(d[b]) * cx[b];
        return c * s;
    }
    for (i64 b = 0; b < nb; b++) s += h2f(o16[b]) * cx[b];
    return s;
}

#ifdef GB_VNNI
/* 64 codes of a 4-bit row (one 32-byte group) as 64 bytes in value order */
static inline __m512i codes_u4(const uint8_t *group) {
    const __m256i raw = _mm256_loadu_si256((const __m256i *)group);
    const __m256i mask = _mm256_set1_epi8(15);
    const __m256i lo = _mm256_and_si256(raw, mask);
    const __m256i hi = _mm256_and_si256(_mm256_srli_epi16(raw, 4), mask);
    return _mm512_inserti64x4(_mm512_castsi256_si512(lo), hi, 1);
}

/* two blocks: their exact code products (lanes 0-7 block b, 8-15 block b + 1) times dx d, added to acc */
static inline __m512 pair_fma(__m512i wq, const int8_t *a, const uint16_t *d, const float *dx, __m512 acc) {
    const __m512i idx = _mm512_set_epi32(1, 1, 1, 1, 1, 1, 1, 1, 0, 0, 0, 0, 0, 0, 0, 0);
    const __m512i ip = _mm512_dpbusd_epi32(_mm512_setzero_si512(), wq, _mm512_loadu_si512((const void *)a));
    int32_t d2;
    memcpy(&d2, d, 4);
    const __m128 dd = _mm_cvtph_ps(_mm_cvtsi32_si128(d2));
    const __m128 xx = _mm_castpd_ps(_mm_load_sd((const double *)dx));
    const __m512 sc = _mm512_permutexvar_ps(idx, _mm512_castps128_ps512(_mm_mul_ps(dd, xx)));
    return _mm512_fmadd_ps(_mm512_cvtepi32_ps(ip), sc, acc);
}

/* y[m] for one weight row against every activation row; bits = 4 or 8 */
static inline void row_dot_vnni(const uint8_t *w, const uint16_t *d, const uint16_t *o, float c, i64 Kp,
                                const int8_t *qx, const float *dx, const float *cx, i64 M, int bits, float *y) {
    const i64 nb = Kp / 32;
    for (i64 m = 0; m < M; m++) {
        const int8_t *a = qx + m * Kp;
        const float *dxm = dx + m * nb;
        __m512 acc0 = _mm512_setzero_ps(), acc1 = _mm512_setzero_ps();
        i64 b = 0;
        if (bits == 4) {
            for (; b + 4 <= nb; b += 4) { /* two groups of 64 values per iteration, two accumulators */
                acc0 = pair_fma(codes_u4(w + b * 16), a + b * 32, d + b, dxm + b, acc0);
                acc1 = pair_fma(codes_u4(w + b * 16 + 32), a + b * 32 + 64, d + b + 2, dxm + b + 2, acc1);
            }
            for (; b < nb; b += 2) acc0 = pair_fma(codes_u4(w + b * 16), a + b * 32, d + b, dxm + b, acc0);
        } else {
            for (; b + 4 <= nb; b += 4) {
                const __m512i w0 = _mm512_loadu_si512((const void *)(w + b * 32));
                const __m512i w1 = _mm512_loadu_si512((const void *)(w + b * 32 + 64));
                acc0 = pair_fma(w0, a + b * 32, d + b, dxm + b, acc0);
                acc1 = pair_fma(w1, a + b * 32 + 64, d + b + 2, dxm + b + 2, acc1);
            }
            for (; b < nb; b += 2)
                acc0 = pair_fma(_mm512_loadu_si512((const void *)(w + b * 32)), a + b * 32, d + b, dxm + b, acc0);
        }
        y[m] = _mm512_reduce_add_ps(_mm512_add_ps(acc0, acc1)) + offset_dot(d, o, c, cx + m * nb, nb);
    }
}
#endif

static void row_dot_generic(const uint8_t *w, const uint16_t *d, const uint16_t *o, float c, i64 Kp,
                            const int8_t *qx, const float *dx, const float *cx, i64 M, int bits, float *y) {
    const i64 nb = Kp / 32;
    for (i64 m = 0; m < M; m++) {
        const int8_t *a = qx + m * Kp;
        float total = 0.0f;
        for (i64 b = 0; b < nb; b++) {
            int32_t ip;
            if (bits == 4)
                ip = block_dot_u4(w + (b / 2) * 32, (int)(b & 1), a + b * 32);
            else
                ip = block_dot_u8(w + b * 32, a + b * 32);
            total += dx[m * nb + b] * h2f(d[b]) * (float)ip;
        }
        y[m] = total + offset_dot(d, o, c, cx + m * nb, nb);
    }
}

/* out[m * out_stride + n] = sum_b dx[m,b] d[n,b] ip + o[n,b] cx[m,b] (+ bias[n]) for n < N, m < M.
 * w: N rows of Kp / 2 (bits 4) or Kp (bits 8) bytes; d, o: N x Kp / 32; M <= 64. */
void gb_gemv_blocks(const uint8_t *w, const uint16_t *d, const uint16_t *o, float c, const float *bias, i64 N,
                    i64 Kp, int bits,
                    const int8_t *qx, const float *dx, const float *cx, i64 M, void *out, i64 out_stride,
                    int out_dt, int threads) {
    const i64 row_bytes = bits == 4 ? Kp / 2 : Kp;
    const i64 nb = Kp / 32;
#pragma omp parallel for schedule(static) num_threads(threads) if (N * Kp >= (1 << 16))
    for (i64 n = 0; n < N; n++) {
        float y[64];
#ifdef GB_VNNI
        row_dot_vnni(w + n * row_bytes, d + n * nb, o ? o + n * nb : NULL, c, Kp, qx, dx, cx, M, bits, y);
#else
        row_dot_generic(w + n * row_bytes, d + n * nb, o ? o + n * nb : NULL, c, Kp, qx, dx, cx, M, bits, y);
#endif
        const float bn = bias ? bias[n] : 0.0f;
        for (i64 m = 0; m < M; m++) store_out(out, m * out_stride + n, y[m] + bn, out_dt);
    }
}

/* The same product computed block by block without any vector path (the kernels' own reference). */
void gb_gemv_blocks_generic(const uint8_t *w, const uint16_t *d, const uint16_t *o, float c, const float *bias,
                            i64 N, i64 Kp, int bits, const int8_t *qx, const float *dx, const float *cx, i64 M, void *out,
                            i64 out_stride, int out_dt, int threads) {
    const i64 row_bytes = bits == 4 ? Kp / 2 : Kp;
    const i64 nb = Kp / 32;
#pragma omp parallel for schedule(static) num_threads(threads) if (N * Kp >= (1 << 16))
    for (i64 n = 0; n < N; n++) {
        float y[64];
        row_dot_generic(w + n * row_bytes, d + n * nb, o ? o + n * nb : NULL, c, Kp, qx, dx, cx, M, bits, y);
        const float bn = bias ? bias[n] : 0.0f;
        for (i64 m = 0; m < M; m++) store_out(out, m * out_stride + n, y[m] + bn, out_dt);
    }
}

/* W (N x K, float32 dt=0 or bf16 dt=1): the weight itself, d q + o per value, rounded once to the dtype. */
void gb_dequant_blocks(const uint8_t *w, const uint16_t *d, const uint16_t *o, float c, i64 N, i64 Kp, i64 K,
                       int bits, void *out, int out_dt, int threads) {
    const i64 row_bytes = bits == 4 ? Kp / 2 : Kp;
    const i64 nb = Kp / 32;
#pragma omp parallel for schedule(static) num_threads(threads) if (N * K >= (1 << 16))
    for (i64 n = 0; n < N; n++) {
        const uint8_t *row = w + n * row_bytes;
        for (i64 k = 0; k < K; k++) {
            const i64 b = k / 32;
            int q;
            if (bits == 4) {
                const uint8_t byte = row[(k / 64) * 32 + (k % 32)];
                q = (k % 64) < 32 ? (byte & 15) : (byte >> 4);
            } else {
                q = row[k];
            }
            const float db = h2f(d[n * nb + b]);
            const float ob = o ? h2f(o[n * nb + b]) : c * db;
            store_out(out, n * K + k, db * (float)q + ob, out_dt);
        }
    }
}
