/* glassbox CPU kernels for weights kept in 32-value blocks of 4 or 8 bits (GGUF Q4_0, Q4_1, Q8_0, and
 * --quantization int4/int8), compiled with cpu_kernels.c by glassbox/kernels/native.py.
 *
 * One weight layout for every format (repacked at load by layers/block_quant.py): row n of K values
 * (K padded to Kp, a multiple of 64) holds unsigned codes q, and per 32-value block b a float16 scale
 * d[n,b] and an offset o[n,b]:  W[n,k] = d[n,b] * q[n,k] + o[n,b],  b = k / 32.  The offset is either
 * stored (float16, Q4_1: the block's min m) or c d[n,b] for one constant c (o16 == NULL):
 *   Q4_0 and int4: q in 0..15, c = -8.   Q8_0 and int8: q = s + 128 (s the int8), c = -128.
 * So a Q4_0 row costs 4.5 bits per weight, Q4_1 5, Q8_0 8.5: the file's own sizes.
 * Codes come in chunks of 16 blocks (512 codes), interleaved so that one 64-byte vector holds 4 codes of
 * each of the 16 blocks: vector p, lane j (4 bytes) = block j's codes 4p .. 4p+3. 8-bit: a chunk is vectors
 * 0..7 (512 bytes). 4-bit: 4 vectors of 64 bytes whose low nibbles are vectors 0..3 and high nibbles 4..7
 * (256 bytes). Blocks past the last whole chunk follow in plain order (4-bit: 32-byte groups of 64 codes,
 * low nibbles codes 0..31, high 32..63). The activation codes use the same 8-bit arrangement, so that
 * AVX-512 VNNI sums each block's 32 products into one int32 lane with no reduction (see code_index).
 *
 * Decode rows (a few at a time) take llama.cpp's route: the activations are quantized to int8 per
 * 32-value block (scale dx = max|x| / 127, codes qx summing to sx; cx = dx sx), and
 *   y[m,n] = sum_b dx[m,b] d[n,b] sum_k q[n,k] qx[m,k]  +  sum_b o[n,b] cx[m,b]
 * with the inner sums exact in int32 (AVX-512 VNNI: 64 u8 x s8 products per instruction).
 * Other rows (prefill) dequantize the weight and use a float GEMM on the Python side.
 */
#include <math.h>
#include <stdint.h>
#include <stdlib.h>
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

#define CHUNK 16 /* blocks per interleaved chunk: 512 codes */

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
            int8_t *q = qx + m * Kp;
            for (int j = 0; j < 32; j++) {
                const int c = (int)roundf(v[j] * id);
                q[code_index(b * 32 + j, Kp, 8)] = (int8_t)c;
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

static inline int code_at(const uint8_t *row, i64 k, i64 Kp, int bits) {
    if (bits == 8) return row[code_index(k, Kp, 8)];
    const i64 i = code_index(k, Kp, 4);
    return (i & 1) ? (row[i >> 1] >> 4) : (row[i >> 1] & 15);
}

/* sum over block b's codes times the activation codes (exact int32; both in their interleaved order) */
static inline int32_t block_dot(const uint8_t *row, i64 b, i64 Kp, int bits, const int8_t *a) {
    int32_t s = 0;
    for (i64 k = b * 32; k < b * 32 + 32; k++) s += (int32_t)code_at(row, k, Kp, bits) * a[code_index(k, Kp, 8)];
    return s;
}

/* blocks [b0, nb) of one row against each activation row, added to y[m] (the plain-C path) */
static void rows_tail(const uint8_t *row, const uint16_t *d, const uint16_t *o, float c, i64 Kp, int bits,
                      const int8_t *qx, const float *dx, const float *cx, i64 M, i64 b0, float *y) {
    const i64 nb = Kp / 32;
    for (i64 m = 0; m < M; m++) {
        float total = 0.0f;
        for (i64 b = b0; b < nb; b++) {
            const float db = h2f(d[b]);
            const float ob = o ? h2f(o[b]) : c * db;
            const int32_t ip = block_dot(row, b, Kp, bits, qx + m * Kp);
            total += dx[m * nb + b] * db * (float)ip + ob * cx[m * nb + b];
        }
        y[m] += total;
    }
}

#ifdef GB_VNNI
/* y[m] for one weight row: whole chunks in vectors (codes unpacked once for all M rows; one int32 lane per
 * block, so no reduction), the remaining blocks by rows_tail. */
static void row_dot_vnni(const uint8_t *w, const uint16_t *d, const uint16_t *o, float c, i64 Kp, int bits,
                         const int8_t *qx, const float *dx, const float *cx, i64 M, float *y) {
    const i64 nb = Kp / 32;
    const i64 chunks = nb / CHUNK;
    __m512 acc[64], off[64];
    for (i64 m = 0; m < M; m++) acc[m] = off[m] = _mm512_setzero_ps();
    const __m512i mask = _mm512_set1_epi8(15);
    for (i64 ch = 0; ch < chunks; ch++) {
        const i64 b = ch * CHUNK;
        __m512i codes[8];
        if (bits == 4) {
            for (int q = 0; q < 4; q++) {
                const __m512i v = _mm512_loadu_si512((const void *)(w + ch * 256 + q * 64));
                codes[q] = _mm512_and_si512(v, mask);
                codes[q + 4] = _mm512_and_si512(_mm512_srli_epi16(v, 4), mask);
            }
        } else {
            for (int p = 0; p < 8; p++) codes[p] = _mm512_loadu_si512((const void *)(w + ch * 512 + p * 64));
        }
        const __m512 dv = _mm512_cvtph_ps(_mm256_loadu_si256((const __m256i *)(d + b)));
        const __m512 ov = o ? _mm512_cvtph_ps(_mm256_loadu_si256((const __m256i *)(o + b)))
                            : _mm512_mul_ps(dv, _mm512_set1_ps(c));
        for (i64 m = 0; m < M; m++) {
            const int8_t *a = qx + m * Kp + ch * 512;
            __m512i s0 = _mm512_setzero_si512(), s1 = _mm512_setzero_si512();
            for (int p = 0; p < 8; p += 2) {
                s0 = _mm512_dpbusd_epi32(s0, codes[p], _mm512_loadu_si512((const void *)(a + p * 64)));
                s1 = _mm512_dpbusd_epi32(s1, codes[p + 1], _mm512_loadu_si512((const void *)(a + p * 64 + 64)));
            }
            const __m512 sums = _mm512_cvtepi32_ps(_mm512_add_epi32(s0, s1)); /* lane j: block b + j */
            const __m512 scale = _mm512_mul_ps(dv, _mm512_loadu_ps(dx + m * nb + b));
            acc[m] = _mm512_fmadd_ps(sums, scale, acc[m]);
            off[m] = _mm512_fmadd_ps(ov, _mm512_loadu_ps(cx + m * nb + b), off[m]);
        }
    }
    for (i64 m = 0; m < M; m++) y[m] = _mm512_reduce_add_ps(_mm512_add_ps(acc[m], off[m]));
    rows_tail(w, d, o, c, Kp, bits, qx, dx, cx, M, chunks * CHUNK, y);
}
#endif

/* out[m * out_stride + n] = sum_b dx[m,b] d[n,b] ip + o[n,b] cx[m,b] (+ bias[n]) for n < N, m < M.
 * w: N rows of Kp / 2 (bits 4) or Kp (bits 8) bytes; d, o: N x Kp / 32; M <= 64. ``generic``: the plain-C
 * path alone (the vector path's reference). */
static void gemv(const uint8_t *w, const uint16_t *d, const uint16_t *o, float c, const float *bias, i64 N, i64 Kp,
                 int bits, const int8_t *qx, const float *dx, const float *cx, i64 M, void *out, i64 out_stride,
                 int out_dt, int threads, int generic) {
    const i64 row_bytes = bits == 4 ? Kp / 2 : Kp;
    const i64 nb = Kp / 32;
#pragma omp parallel for schedule(static) num_threads(threads) if (N * Kp >= (1 << 16))
    for (i64 n = 0; n < N; n++) {
        float y[64];
        const uint16_t *on = o ? o + n * nb : NULL;
#ifdef GB_VNNI
        if (!generic) {
            row_dot_vnni(w + n * row_bytes, d + n * nb, on, c, Kp, bits, qx, dx, cx, M, y);
        } else
#endif
        {
            for (i64 m = 0; m < M; m++) y[m] = 0.0f;
            rows_tail(w + n * row_bytes, d + n * nb, on, c, Kp, bits, qx, dx, cx, M, 0, y);
        }
        const float bn = bias ? bias[n] : 0.0f;
        for (i64 m = 0; m < M; m++) store_out(out, m * out_stride + n, y[m] + bn, out_dt);
    }
}

void gb_gemv_blocks(const uint8_t *w, const uint16_t *d, const uint16_t *o, float c, const float *bias, i64 N,
                    i64 Kp, int bits, const int8_t *qx, const float *dx, const float *cx, i64 M, void *out,
                    i64 out_stride, int out_dt, int threads) {
    gemv(w, d, o, c, bias, N, Kp, bits, qx, dx, cx, M, out, out_stride, out_dt, threads, 0);
}

void gb_gemv_blocks_generic(const uint8_t *w, const uint16_t *d, const uint16_t *o, float c, const float *bias,
                            i64 N, i64 Kp, int bits, const int8_t *qx, const float *dx, const float *cx, i64 M,
                            void *out, i64 out_stride, int out_dt, int threads) {
    gemv(w, d, o, c, bias, N, Kp, bits, qx, dx, cx, M, out, out_stride, out_dt, threads, 1);
}

/* One decode-row linear in one call: x (M x K, dt 0 float32 / 1 bf16) to int8 blocks, then the GEMV into out
 * (M x N, same dtype). M <= 64. */
void gb_linear_blocks(const void *x, i64 M, i64 K, const uint8_t *w, const uint16_t *d, const uint16_t *o, float c,
                      const float *bias, i64 N, i64 Kp, int bits, void *out, int dt, int threads) {
    const i64 nb = Kp / 32;
    int8_t *qx = (int8_t *)malloc((size_t)(M * Kp));
    float *dx = (float *)malloc((size_t)(M * nb) * sizeof(float));
    float *cx = (float *)malloc((size_t)(M * nb) * sizeof(float));
    if (qx && dx && cx) {
        gb_quantize_rows_q8(x, M, K, Kp, qx, dx, cx, dt, threads);
        gemv(w, d, o, c, bias, N, Kp, bits, qx, dx, cx, M, out, N, dt, threads, 0);
    }
    free(qx);
    free(dx);
    free(cx);
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
            const int q = code_at(row, k, Kp, bits);
            const float db = h2f(d[n * nb + b]);
            const float ob = o ? h2f(o[n * nb + b]) : c * db;
            store_out(out, n * K + k, db * (float)q + ob, out_dt);
        }
    }
}
