/* glassbox CPU kernels for 4-bit floating-point weights (E2M1 values): MXFP4 and NVFP4, kept packed
 * (quant/fp4/weights.py repacks them at load; it holds the PyTorch reference of everything here).
 *
 * A code c (4 bits: sign bit 3, then a 3-bit magnitude index) is the E2M1 value
 *   {0, 0.5, 1, 1.5, 2, 3, 4, 6}[c & 7], negated when c & 8.
 * Twice that value is an integer w2 in {0, 1, 2, 3, 4, 6, 8, 12} (signed), and w2 + 12 is a byte u in 0..24:
 * a byte-table lookup (vpermb on a 64-byte table with AVX512-VBMI, else vpshufb) turns 64 nibbles into 64 such
 * bytes, and AVX-512 VNNI multiplies them by int8 activation codes.
 * kind 0, MXFP4 (OCP microscaling): an E8M0 scale e (byte) per 32 values, W = value * 2^(e - 127).
 * kind 1, NVFP4 (ModelOpt): an FP8 E4M3 scale s per 16 values and a float32 scale g per row (the
 *   checkpoint's per-tensor weight_scale_2), W = value * (s * g) (the product rounded to float32 first, as
 *   ModelOpt's dequantization does).
 *
 * Layout of a row of K values (K padded with zeros to Kp, a multiple of 32; nb = Kp / 32 blocks): blocks in
 * chunks of 16 (the last chunk may hold r < 16). A chunk is 4 groups of r * 4 bytes: byte (q, j, t) of a chunk
 * holds code 4q + t of its block j in the low nibble and code 16 + 4q + t in the high one. So one 64-byte
 * vector holds 4 codes of each of 16 blocks, and VNNI sums a block's products into one int32 lane with no
 * reduction; the low nibbles of a chunk are the first 16 codes of its blocks (NVFP4's first sub-block) and
 * the high nibbles the last 16. Activations use the same order with a byte per code (8 groups of r * 4).
 * Scales: MXFP4 one byte per block in order; NVFP4 per chunk the r first-half scales, then the r second-half.
 *
 * Decode rows (a few at a time): activations in int8 per 32-value block (dx = max|x| / 127, codes rounded
 * half away from zero, as cpu_quant.c's), and per block (or half block) the exact integer
 *   ip = sum_k w2[k] qx[k] = sum_k u[k] qx[k] - 12 sum_k qx[k],
 *   y[m, n] = g[n] * sum_blocks dx[m, b] * (scale / 2) * ip      (g = 1 for MXFP4).
 * Batch 1 runs 4 weight rows at a time (the activation chunk loaded once for them). Other rows (prefill)
 * dequantize the weight (cpu_fp4_dequant.c) for a float GEMM on the Python side. Without AVX-512 the plain-C
 * paths run (row_generic here, the scalar loop there).
 */
#include "cpu_fp4.h"

/* Block b of an activation row (x[at ..], n = the values left in the row, zeros past them) to codes in qx (the
 * row's), rounded half away from zero; returns d = max|x| / 127 and the two halves' code sums. */
static float quantize_block(const void *x, i64 at, i64 n, int dt, int8_t *qx, i64 b, i64 nb, int32_t half[2]) {
    int8_t c[32];
    const float d = q8_block(x, at, n, dt, c);
    for (int j = 0; j < 32; j++) {
        qx[fp4_act_pos(b * 32 + j, nb)] = c[j];
        half[j / 16] += c[j];
    }
    return d;
}

#ifdef GB_FP4_VEC
/* One whole block of 32 activations (x: its first, dt 0 float32 / 1 bf16) to codes, stored at q + p * stride
 * (4 codes each, p = 0..7); returns d and the two halves' code sums. Rounds as roundf (half away from 0). */
static inline float quantize_block_vec(const void *x, int dt, int8_t *q, i64 stride, int32_t half[2]) {
    __m512 v[2];
    for (int i = 0; i < 2; i++)
        v[i] = dt ? _mm512_castsi512_ps(_mm512_slli_epi32(
                        _mm512_cvtepu16_epi32(_mm256_loadu_si256((const __m256i *)((const uint16_t *)x + 16 * i))), 16))
                  : _mm512_loadu_ps((const float *)x + 16 * i);
    const float amax = _mm512_reduce_max_ps(_mm512_max_ps(_mm512_abs_ps(v[0]), _mm512_abs_ps(v[1])));
    const float d = amax / 127.0f, id = d > 0.0f ? 1.0f / d : 0.0f;
    __m128i c[2];
    for (int i = 0; i < 2; i++) {
        const __m512 a = _mm512_abs_ps(_mm512_mul_ps(v[i], _mm512_set1_ps(id)));
        const __m512 f = _mm512_roundscale_ps(a, _MM_FROUND_TO_NEG_INF | _MM_FROUND_NO_EXC);
        const __mmask16 up = _mm512_cmp_ps_mask(_mm512_sub_ps(a, f), _mm512_set1_ps(0.5f), _CMP_GE_OQ);
        __m512i r = _mm512_cvttps_epi32(_mm512_mask_add_ps(f, up, f, _mm512_set1_ps(1.0f)));
        const __mmask16 neg = _mm512_cmp_ps_mask(v[i], _mm512_setzero_ps(), _CMP_LT_OQ);
        r = _mm512_mask_sub_epi32(r, neg, _mm512_setzero_si512(), r);
        half[i] = _mm512_reduce_add_epi32(r);
        c[i] = _mm512_cvtepi32_epi8(r);
    }
    int32_t groups[8]; /* group p: codes 4p .. 4p + 3 */
    memcpy(groups, &c[0], 16);
    memcpy(groups + 4, &c[1], 16);
    for (int p = 0; p < 8; p++) memcpy(q + p * stride, groups + p, 4);
    return d;
}
#endif

/* Activations (M x K, dt 0 float32 / 1 bf16) to int8 codes qx (M x Kp, the layout's order), dx (M x nb) and
 * cs (M x 2 nb): 12 times the sum of the codes, per block in order (kind 0) or per half block in NVFP4's
 * scale order (kind 1): the term that turns the shuffled bytes u = w2 + 12 back into w2. */
void gb_fp4_quantize_rows(const void *x, i64 M, i64 K, i64 Kp, int8_t *qx, float *dx, int32_t *cs, int kind, int dt,
                          int threads) {
    const i64 nb = Kp / 32;
#pragma omp parallel for schedule(static) num_threads(threads) if (M * K >= (1 << 16))
    for (i64 m = 0; m < M; m++) {
        for (i64 b = 0; b < nb; b++) {
            int32_t half[2] = {0, 0};
            float d;
#ifdef GB_FP4_VEC
            if ((b + 1) * 32 <= K) {
                const i64 ch = b / 16, r = chunk_blocks(ch, nb);
                d = quantize_block_vec((const char *)x + (m * K + b * 32) * (dt ? 2 : 4), dt,
                                       qx + m * Kp + ch * 512 + (b % 16) * 4, r * 4, half);
            } else
#endif
                d = quantize_block(x, m * K + b * 32, K - b * 32, dt, qx + m * Kp, b, nb, half);
            dx[m * nb + b] = d;
            int32_t *cm = cs + m * 2 * nb;
            if (kind == 0) {
                cm[b] = 12 * (half[0] + half[1]);
            } else {
                cm[half_pos(b, 0, nb)] = 12 * half[0];
                cm[half_pos(b, 1, nb)] = 12 * half[1];
            }
        }
    }
}

/* One weight row against M activation rows in plain C (the vector path's reference): y[m] before g. */
static void row_generic(const uint8_t *w, const uint8_t *s, int kind, i64 Kp, const int8_t *qx, const float *dx,
                        i64 M, float *y) {
    const i64 nb = Kp / 32;
    for (i64 m = 0; m < M; m++) {
        float total = 0.0f;
        for (i64 b = 0; b < nb; b++) {
            int32_t ip[2] = {0, 0};
            for (i64 k = b * 32; k < b * 32 + 32; k++) {
                const i64 at = fp4_code_pos(k, nb);
                const int c = (at & 1) ? w[at >> 1] >> 4 : w[at >> 1] & 15;
                ip[(k % 32) / 16] += FP4_TWICE[c] * qx[m * Kp + fp4_act_pos(k, nb)];
            }
            float lo, hi;
            block_scales(s, kind, b, nb, &lo, &hi);
            total += dx[m * nb + b] * 0.5f * (lo * (float)ip[0] + hi * (float)ip[1]);
        }
        y[m] = total;
    }
}

#ifdef GB_FP4_VEC
/* 16 lanes of 2^(e - 127) / 2 (MXFP4) from 16 E8M0 bytes (lanes past r zero). */
static inline __m512 e8m0_half16(const uint8_t *s, __mmask16 k) {
    const __m512i e = _mm512_cvtepu8_epi32(_mm_maskz_loadu_epi8(k, s));
    const __m512 ex = _mm512_cvtepi32_ps(_mm512_sub_epi32(e, _mm512_set1_epi32(128)));
    return _mm512_maskz_scalef_ps(k, _mm512_set1_ps(1.0f), ex);
}

/* NVFP4's scales: an E4M3 byte moved into a float16 whose bits are its bits shifted (sign to bit 15, exponent
 * and mantissa from bit 7 up) is s * 2^-8 exactly, subnormals included (the caller's d carries the 2^8 / 2). */
static inline __m256i e4m3_f16_16(__m256i x) { /* 16 bytes widened to 16-bit lanes */
    return _mm256_or_si256(_mm256_slli_epi16(_mm256_and_si256(x, _mm256_set1_epi16(0x7f)), 7),
                           _mm256_slli_epi16(_mm256_and_si256(x, _mm256_set1_epi16(0x80)), 8));
}

static inline __m512 e4m3_scaled16(const uint8_t *s, __mmask16 k) { /* 16 lanes of s * 2^-8 */
    return _mm512_cvtph_ps(e4m3_f16_16(_mm256_cvtepu8_epi16(_mm_maskz_loadu_epi8(k, s))));
}

static inline void e4m3_scaled32(const uint8_t *s, __m512 *lo, __m512 *hi) { /* 32 bytes: two halves of 16 */
    const __m512i x = _mm512_cvtepu8_epi16(_mm256_loadu_si256((const __m256i *)s));
    const __m512i h = _mm512_or_si512(_mm512_slli_epi16(_mm512_and_si512(x, _mm512_set1_epi16(0x7f)), 7),
                                      _mm512_slli_epi16(_mm512_and_si512(x, _mm512_set1_epi16(0x80)), 8));
    *lo = _mm512_cvtph_ps(_mm512_castsi512_si256(h));
    *hi = _mm512_cvtph_ps(_mm512_extracti64x4_epi64(h, 1));
}

/* What multiplies a chunk's dx: 1 for MXFP4 (its scales come as 2^(e - 128)), 2^7 for NVFP4 (s * 2^-8). */
static inline __m512 dx_factor(int kind, __m512 d) { return kind == 0 ? d : _mm512_mul_ps(d, _mm512_set1_ps(128.0f)); }

/* A chunk's geometry: r blocks, groups of g = 4 r bytes, byte and lane masks; full: r == 16 (plain loads). */
typedef struct {
    i64 b, r, g;
    __mmask64 kb;
    __mmask16 kr;
} Chunk;

static inline Chunk chunk_at(i64 ch, i64 nb) {
    Chunk c;
    c.b = ch * 16;
    c.r = chunk_blocks(ch, nb);
    c.g = c.r * 4;
    c.kb = c.g == 64 ? ~(__mmask64)0 : (((__mmask64)1 << c.g) - 1);
    c.kr = (__mmask16)((1u << c.r) - 1);
    return c;
}

static inline __attribute__((always_inline)) __m512i load_group(const void *p, __mmask64 kb, int full) {
    return full ? _mm512_loadu_si512(p) : _mm512_maskz_loadu_epi8(kb, p);
}

/* One row's chunk: the looked-up code bytes u[p] (p < 4 low nibbles, p >= 4 high) and its scales (MXFP4:
 * s / 2; NVFP4: s * 2^-8, see dx_factor). */
static inline __attribute__((always_inline)) void chunk_weights(const uint8_t *w, const uint8_t *s, int kind, i64 ch,
                                                                Chunk c, int full, __m512i u[8], __m512 *slo,
                                                                __m512 *shi) {
    const __m512i lut = _mm512_broadcast_i32x4(_mm_setr_epi8(12, 13, 14, 15, 16, 18, 20, 24, 12, 11, 10, 9, 8, 6, 4, 0));
    for (int q = 0; q < 4; q++) {
        const __m512i v = load_group(w + ch * 256 + q * c.g, c.kb, full);
#ifdef __AVX512VBMI__ /* a 64-byte table lookup on each byte's low 6 bits: the nibble's value repeated 4 times */
        u[q] = _mm512_permutexvar_epi8(v, lut);
        u[q + 4] = _mm512_permutexvar_epi8(_mm512_srli_epi16(v, 4), lut);
#else
        const __m512i mask = _mm512_set1_epi8(15);
        u[q] = _mm512_shuffle_epi8(lut, _mm512_and_si512(v, mask));
        u[q + 4] = _mm512_shuffle_epi8(lut, _mm512_and_si512(_mm512_srli_epi16(v, 4), mask));
#endif
    }
    if (kind == 0) {
        *slo = *shi = e8m0_half16(s + c.b, c.kr);
    } else if (full) {
        e4m3_scaled32(s + ch * 32, slo, shi);
    } else {
        *slo = e4m3_scaled16(s + ch * 32, c.kr);
        *shi = e4m3_scaled16(s + ch * 32 + c.r, c.kr);
    }
}

/* acc += the chunk's blocks: lane j gets dx_j (scale_j / 2) ip_j (per half for NVFP4). a: 8 activation
 * vectors; cs: this activation row's chunk of 12 * code sums; d: its dx times dx_factor. */
static inline __attribute__((always_inline)) __m512 chunk_dot(const __m512i u[8], const __m512i a[8], __m512 slo,
                                                              __m512 shi, const int32_t *cs, __m512 d, Chunk c,
                                                              int kind, __m512 acc) {
    __m512i lo = _mm512_setzero_si512(), hi = _mm512_setzero_si512();
    for (int p = 0; p < 4; p++) {
        lo = _mm512_dpbusd_epi32(lo, u[p], a[p]);
        hi = _mm512_dpbusd_epi32(hi, u[p + 4], a[p + 4]);
    }
    if (kind == 0) {
        const __m512i ip = _mm512_sub_epi32(_mm512_add_epi32(lo, hi), _mm512_maskz_loadu_epi32(c.kr, cs));
        return _mm512_fmadd_ps(_mm512_cvtepi32_ps(ip), _mm512_mul_ps(slo, d), acc);
    }
    lo = _mm512_sub_epi32(lo, _mm512_maskz_loadu_epi32(c.kr, cs));
    hi = _mm512_sub_epi32(hi, _mm512_maskz_loadu_epi32(c.kr, cs + c.r));
    const __m512 both = _mm512_fmadd_ps(_mm512_cvtepi32_ps(lo), slo, _mm512_mul_ps(_mm512_cvtepi32_ps(hi), shi));
    return _mm512_fmadd_ps(both, d, acc);
}

static inline __attribute__((always_inline)) void load_acts(const int8_t *a, Chunk c, int full, __m512i out[8]) {
    for (int p = 0; p < 8; p++) out[p] = load_group(a + p * c.g, c.kb, full);
}

/* Where an activation row's chunk of cs starts (kind 0: per block; 1: per half block). */
static inline i64 cs_at(int kind, i64 ch) { return kind == 0 ? ch * 16 : ch * 32; }

/* One weight row against M (<= 64) activation rows: y[m] before g. Codes unpacked once per chunk. */
static void row_vnni(const uint8_t *w, const uint8_t *s, int kind, i64 Kp, const int8_t *qx, const float *dx,
                     const int32_t *cs, i64 M, float *y) {
    const i64 nb = Kp / 32, chunks = (nb + 15) / 16;
    __m512 acc[64];
    for (i64 m = 0; m < M; m++) acc[m] = _mm512_setzero_ps();
    for (i64 ch = 0; ch < chunks; ch++) {
        const Chunk c = chunk_at(ch, nb);
        const int full = c.r == 16;
        __m512i u[8], a[8];
        __m512 slo, shi;
        if (full) chunk_weights(w, s, kind, ch, c, 1, u, &slo, &shi);
        else chunk_weights(w, s, kind, ch, c, 0, u, &slo, &shi);
        for (i64 m = 0; m < M; m++) {
            if (full) load_acts(qx + m * Kp + ch * 512, c, 1, a);
            else load_acts(qx + m * Kp + ch * 512, c, 0, a);
            const __m512 d = dx_factor(kind, _mm512_maskz_loadu_ps(c.kr, dx + m * nb + c.b));
            acc[m] = chunk_dot(u, a, slo, shi, cs + m * 2 * nb + cs_at(kind, ch), d, c, kind, acc[m]);
        }
    }
    for (i64 m = 0; m < M; m++) y[m] = _mm512_reduce_add_ps(acc[m]);
}

/* Batch 1: 4 weight rows (row_bytes / row_scales apart) against one activation row, which is loaded once
 * per chunk for the 4: y[0..3] before g. */
static inline __attribute__((always_inline)) void chunk4(const uint8_t *w, i64 row_bytes, const uint8_t *s,
                                                         i64 row_scales, int kind, i64 nb, const int8_t *qx,
                                                         const float *dx, const int32_t *cs, i64 ch, int full,
                                                         __m512 acc[4]) {
    const Chunk c = chunk_at(ch, nb);
    __m512i a[8];
    load_acts(qx + ch * 512, c, full, a);
    const __m512 d = dx_factor(kind, _mm512_maskz_loadu_ps(c.kr, dx + c.b));
    for (int i = 0; i < 4; i++) {
        __m512i u[8];
        __m512 slo, shi;
        chunk_weights(w + i * row_bytes, s + i * row_scales, kind, ch, c, full, u, &slo, &shi);
        acc[i] = chunk_dot(u, a, slo, shi, cs + cs_at(kind, ch), d, c, kind, acc[i]);
    }
}

static void rows4_m1(const uint8_t *w, i64 row_bytes, const uint8_t *s, i64 row_scales, int kind, i64 Kp,
                     const int8_t *qx, const float *dx, const int32_t *cs, float y[4]) {
    const i64 nb = Kp / 32, chunks = (nb + 15) / 16;
    __m512 acc[4] = {_mm512_setzero_ps(), _mm512_setzero_ps(), _mm512_setzero_ps(), _mm512_setzero_ps()};
    for (i64 ch = 0; ch < chunks; ch++) {
        if (chunk_blocks(ch, nb) == 16) chunk4(w, row_bytes, s, row_scales, kind, nb, qx, dx, cs, ch, 1, acc);
        else chunk4(w, row_bytes, s, row_scales, kind, nb, qx, dx, cs, ch, 0, acc);
    }
    for (int i = 0; i < 4; i++) y[i] = _mm512_reduce_add_ps(acc[i]);
}
#endif

/* One weight row against M activation rows: y[m] before g. */
static void row_dot(const uint8_t *w, const uint8_t *s, int kind, i64 Kp, const int8_t *qx, const float *dx,
                    const int32_t *cs, i64 M, float *y, int generic) {
#ifdef GB_FP4_VEC
    if (!generic) {
        row_vnni(w, s, kind, Kp, qx, dx, cs, M, y);
        return;
    }
#endif
    (void)cs; /* read by the vector path only */
    (void)generic;
    row_generic(w, s, kind, Kp, qx, dx, M, y);
}

/* out[m * out_stride + n] = g[n] y[m, n] (+ bias[n]) for n < N, m < M (<= 64). g: NULL (MXFP4) or N floats.
 * generic: the plain-C path alone. Batch 1 runs rows 4 at a time (the activation row loaded once for 4). */
static void fp4_gemv(const uint8_t *w, const uint8_t *s, const float *g, int kind, const float *bias, i64 N, i64 Kp,
                     const int8_t *qx, const float *dx, const int32_t *cs, i64 M, void *out, i64 out_stride,
                     int out_dt, int threads, int generic) {
    const i64 row_bytes = Kp / 2, row_scales = kind == 0 ? Kp / 32 : Kp / 16;
    const i64 tile = !generic && M == 1 ? 4 : 1;
#pragma omp parallel for schedule(static) num_threads(threads) if (N * Kp >= (1 << 16))
    for (i64 n0 = 0; n0 < N; n0 += tile) {
        float y[64]; /* tile 1: y[m]; tile 4 (M == 1): y[row] */
        const i64 rows = N - n0 < tile ? N - n0 : tile;
#ifdef GB_FP4_VEC
        if (rows == 4)
            rows4_m1(w + n0 * row_bytes, row_bytes, s + n0 * row_scales, row_scales, kind, Kp, qx, dx, cs, y);
        else
#endif
            for (i64 i = 0; i < rows; i++)
                row_dot(w + (n0 + i) * row_bytes, s + (n0 + i) * row_scales, kind, Kp, qx, dx, cs, M, y + i, generic);
        for (i64 i = 0; i < rows; i++) {
            const i64 n = n0 + i;
            const float gn = g ? g[n] : 1.0f, bn = bias ? bias[n] : 0.0f;
            for (i64 m = 0; m < M; m++) store_out(out, m * out_stride + n, gn * y[tile == 4 ? i : m] + bn, out_dt);
        }
    }
}

void gb_fp4_gemv(const uint8_t *w, const uint8_t *s, const float *g, int kind, const float *bias, i64 N, i64 Kp,
                 const int8_t *qx, const float *dx, const int32_t *cs, i64 M, void *out, i64 out_stride, int out_dt,
                 int threads, int generic) {
    for (i64 m0 = 0; m0 < M; m0 += 64) {
        const i64 rows = M - m0 < 64 ? M - m0 : 64;
        fp4_gemv(w, s, g, kind, bias, N, Kp, qx + m0 * Kp, dx + m0 * (Kp / 32), cs + m0 * (Kp / 16), rows,
                 (char *)out + m0 * out_stride * (out_dt ? 2 : 4), out_stride, out_dt, threads, generic);
    }
}

/* One linear in one call: x (M x K, dt 0 float32 / 1 bf16) to int8 codes, then the GEMV into out (M x N, same
 * dtype), 64 activation rows at a time. */
void gb_fp4_linear(const void *x, i64 M, i64 K, const uint8_t *w, const uint8_t *s, const float *g, int kind,
                   const float *bias, i64 N, i64 Kp, void *out, int dt, int threads) {
    const i64 nb = Kp / 32;
    int8_t *qx = (int8_t *)malloc((size_t)(M * Kp));
    float *dx = (float *)malloc((size_t)(M * nb) * sizeof(float));
    int32_t *cs = (int32_t *)malloc((size_t)(M * 2 * nb) * sizeof(int32_t));
    if (qx && dx && cs) {
        gb_fp4_quantize_rows(x, M, K, Kp, qx, dx, cs, kind, dt, threads);
        gb_fp4_gemv(w, s, g, kind, bias, N, Kp, qx, dx, cs, M, out, N, dt, threads, 0);
    }
    free(qx);
    free(dx);
    free(cs);
}
