/* glassbox CPU kernels for GGUF K-quant weights kept as stored (Q4_K, Q5_K, Q6_K), compiled with
 * cpu_kernels.c by glassbox/kernels/native.py. The layout is written by layers/kquant.py.
 *
 * A row of K values (K a multiple of 256) is K / 256 super-blocks. Each has two records:
 *   codes (kind 4: 128 bytes, 5: 160, 6: 192): the unsigned codes q (4, 5 or 6 bits) in lane order, as
 *     4 byte vectors V0..V3 of 64 bytes where lane j (bytes 4j .. 4j+3) of V_p holds the codes of values
 *     16j + 4p .. 16j + 4p + 3: so that AVX-512 VNNI sums each 16-value lane in one int32 lane. Bytes 0..63
 *     hold V0 in the low nibbles and V1 in the high, bytes 64..127 V2 and V3; then for Q5_K 4 bit masks
 *     of 64 bits (mask p: bit 4 of V_p's bytes), for Q6_K 8 (mask 2p: bit 4 of V_p, 2p + 1: bit 5).
 *   meta (kind 4/5: 16 bytes, 6: 18), the GGML block's own: Q4_K/Q5_K float16 d, float16 dmin, then 8
 *     6-bit sub-block scales sc and 8 6-bit mins m in 12 bytes (see scale_min); Q6_K 16 sub-block scales sc
 *     (int8), float16 d.
 * Lane j (16 values) has a scale S_j and an offset O_j, formed here in float32 from the stored integers:
 *   Q4_K, Q5_K: W = S_j q + O_j, S_j = d sc[j/2], O_j = -dmin m[j/2]   (sub-blocks of 32 values)
 *   Q6_K:       W = S_j (q - 32), S_j = d sc[j]                         (sub-blocks of 16 values)
 * d sc and dmin m are exact in float32 (an 11-bit significand times an integer below 2^7) and so is S q:
 * the dequantization below equals GGML's (gguf.quants.dequantize) bit for bit. Bytes per weight: the
 * file's own, Q4_K 144/256 (4.5 bits), Q5_K 176/256 (5.5), Q6_K 210/256 (6.5625).
 *
 * Decode rows: the activations are quantized to int8 per 32 values (as cpu_quant.c: dx = max|x| / 127,
 * codes rounded half away from zero), their codes put in the same lane order, and per 16-value lane the sum
 * of the codes sx and cx = dx sx kept. Then per lane, exactly in int32, ip = sum q qx (- 32 sx for Q6_K) and
 *   y = sum_lanes dx S ip + O cx.
 */
#include "cpu_quant.h"

#define SB 256 /* values per super-block */
#define LANES 16 /* 16-value lanes per super-block */

static inline i64 code_bytes(int kind) { return kind == 4 ? 128 : kind == 5 ? 160 : 192; }
static inline i64 meta_bytes(int kind) { return kind == 6 ? 18 : 16; }

/* Where value r (0..255) of a super-block sits in the lane order: byte 64 p + 4 j + t. */
static inline i64 lane_pos(i64 r) {
    const i64 j = r / 16, w = r % 16;
    return (w / 4) * 64 + 4 * j + w % 4;
}

static inline int code_of(const uint8_t *rec, int kind, i64 r) {
    const i64 pos = lane_pos(r), p = pos / 64, i = pos % 64;
    int q = (rec[(p / 2) * 64 + i] >> (4 * (p % 2))) & 15;
    if (kind == 5) q |= ((rec[128 + p * 8 + i / 8] >> (i % 8)) & 1) << 4;
    if (kind == 6) {
        q |= ((rec[128 + 2 * p * 8 + i / 8] >> (i % 8)) & 1) << 4;
        q |= ((rec[128 + (2 * p + 1) * 8 + i / 8] >> (i % 8)) & 1) << 5;
    }
    return q;
}

static inline float half_at(const uint8_t *p) {
    uint16_t h;
    memcpy(&h, p, 2);
    return h2f(h);
}

/* Sub-block s's 6-bit scale and min from Q4_K/Q5_K's 12 bytes (a = bytes 0-3, b = 4-7, c = 8-11):
 * s < 4: the low 6 bits of a[s] and b[s]; s >= 4: the nibbles of c[s-4] below the top 2 bits of a[s-4], b[s-4]. */
static inline void scale_min(const uint8_t *p, i64 s, int *sc, int *m) {
    if (s < 4) {
        *sc = p[s] & 63;
        *m = p[4 + s] & 63;
    } else {
        *sc = (p[8 + s - 4] & 15) | ((p[s - 4] >> 6) << 4);
        *m = (p[8 + s - 4] >> 4) | ((p[4 + s - 4] >> 6) << 4);
    }
}

/* Lane j's scale S and offset O (O = 0 for Q6_K, whose codes are offset by -32 instead). */
static inline void lane_scale(const uint8_t *mt, int kind, i64 j, float *S, float *O) {
    if (kind == 6) {
        *S = half_at(mt + 16) * (float)(int8_t)mt[j];
        *O = 0.0f;
        return;
    }
    int sc, m;
    scale_min(mt + 4, j / 2, &sc, &m);
    *S = half_at(mt) * (float)sc;
    *O = -(half_at(mt + 2) * (float)m);
}

/* Activations (M x K, float32 dt=0 or bf16 dt=1) to int8 codes in lane order (M x K), and per 16-value lane
 * (M x K/16) the block's scale dx, the codes' sum sx and cx = dx sx. */
void gb_quantize_rows_kq(const void *x, i64 M, i64 K, int8_t *qx, float *dx, float *cx, int32_t *sx, int dt,
                         int threads) {
    const i64 nl = K / 16;
#pragma omp parallel for schedule(static) num_threads(threads) if (M * K >= (1 << 16))
    for (i64 m = 0; m < M; m++) {
        float v[32];
        for (i64 b = 0; b < K / 32; b++) {
            float amax = 0.0f;
            for (int t = 0; t < 32; t++) {
                const i64 k = b * 32 + t;
                const float f = dt ? bf2f(((const uint16_t *)x)[m * K + k]) : ((const float *)x)[m * K + k];
                v[t] = f;
                const float a = f < 0 ? -f : f;
                amax = a > amax ? a : amax;
            }
            const float d = amax / 127.0f;
            const float id = d > 0.0f ? 1.0f / d : 0.0f;
            for (int h = 0; h < 2; h++) {
                int32_t s = 0;
                for (int t = 0; t < 16; t++) {
                    const i64 k = b * 32 + 16 * h + t;
                    const int c = (int)roundf(v[16 * h + t] * id);
                    qx[m * K + (k / SB) * SB + lane_pos(k % SB)] = (int8_t)c;
                    s += c;
                }
                const i64 lane = m * nl + 2 * b + h;
                dx[lane] = d;
                sx[lane] = s;
                cx[lane] = d * (float)s;
            }
        }
    }
}

/* One weight row against M activation rows, plain C: y[m]. */
static void row_generic(const uint8_t *codes, const uint8_t *meta, int kind, i64 K, const int8_t *qx,
                        const float *dx, const float *cx, const int32_t *sx, i64 M, float *y) {
    const i64 nsb = K / SB, nl = K / 16, cb = code_bytes(kind), mb = meta_bytes(kind);
    for (i64 m = 0; m < M; m++) {
        float total = 0.0f;
        for (i64 sb = 0; sb < nsb; sb++) {
            const uint8_t *rec = codes + sb * cb;
            const int8_t *a = qx + m * K + sb * SB;
            for (i64 j = 0; j < LANES; j++) {
                int32_t ip = 0;
                for (i64 r = 16 * j; r < 16 * j + 16; r++) ip += code_of(rec, kind, r) * a[lane_pos(r)];
                const i64 lane = m * nl + sb * LANES + j;
                if (kind == 6) ip -= 32 * sx[lane];
                float S, O;
                lane_scale(meta + sb * mb, kind, j, &S, &O);
                total += (float)ip * (S * dx[lane]) + O * cx[lane];
            }
        }
        y[m] = total;
    }
}

#ifdef GB_VNNI
/* One super-block's codes as the 4 byte vectors V0..V3 (lane order). */
static inline void unpack_sb(const uint8_t *rec, int kind, __m512i V[4]) {
    const __m512i m15 = _mm512_set1_epi8(15);
    const __m512i n0 = _mm512_loadu_si512((const void *)rec), n1 = _mm512_loadu_si512((const void *)(rec + 64));
    V[0] = _mm512_and_si512(n0, m15);
    V[1] = _mm512_and_si512(_mm512_srli_epi16(n0, 4), m15);
    V[2] = _mm512_and_si512(n1, m15);
    V[3] = _mm512_and_si512(_mm512_srli_epi16(n1, 4), m15);
    if (kind == 4) return;
    const __m512i b4 = _mm512_set1_epi8(16), b5 = _mm512_set1_epi8(32);
    for (int p = 0; p < 4; p++) {
        uint64_t bits;
        if (kind == 5) {
            memcpy(&bits, rec + 128 + 8 * p, 8);
            V[p] = _mm512_mask_add_epi8(V[p], _cvtu64_mask64(bits), V[p], b4);
        } else {
            memcpy(&bits, rec + 128 + 16 * p, 8);
            V[p] = _mm512_mask_add_epi8(V[p], _cvtu64_mask64(bits), V[p], b4);
            memcpy(&bits, rec + 136 + 16 * p, 8);
            V[p] = _mm512_mask_add_epi8(V[p], _cvtu64_mask64(bits), V[p], b5);
        }
    }
}

/* The 16 lanes' scales S and offsets O of one super-block (see lane_scale). */
static inline void lane_scales(const uint8_t *mt, int kind, __m512 *S, __m512 *O) {
    uint16_t h;
    if (kind == 6) {
        memcpy(&h, mt + 16, 2);
        const __m128i sc = _mm_loadu_si128((const __m128i *)mt);
        *S = _mm512_mul_ps(_mm512_set1_ps(_cvtsh_ss(h)), _mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(sc)));
        *O = _mm512_setzero_ps();
        return;
    }
    /* the 16 meta bytes: d, dmin, a (4-7), b (8-11), c (12-15); scale_min for all 8 sub-blocks at once */
    const __m128i x = _mm_loadu_si128((const __m128i *)mt);
    const __m128i p1 = _mm_shuffle_epi8(x, _mm_setr_epi8(4, 5, 6, 7, 12, 13, 14, 15, 8, 9, 10, 11, 12, 13, 14, 15));
    const __m128i p2 = _mm_shuffle_epi8(x, _mm_setr_epi8(-1, -1, -1, -1, 4, 5, 6, 7, -1, -1, -1, -1, 8, 9, 10, 11));
    const __m128i low = _mm_or_si128(
        _mm_and_si128(p1, _mm_setr_epi8(63, 63, 63, 63, 15, 15, 15, 15, 63, 63, 63, 63, 0, 0, 0, 0)),
        _mm_and_si128(_mm_srli_epi16(p1, 4), _mm_setr_epi8(0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 15, 15, 15, 15)));
    const __m128i top = _mm_and_si128(_mm_srli_epi16(p2, 2), _mm_setr_epi8(0, 0, 0, 0, 48, 48, 48, 48, 0, 0, 0, 0, 48, 48, 48, 48));
    const __m128i sm = _mm_or_si128(low, top); /* sc 0..7, m 0..7 */
    memcpy(&h, mt, 2);
    const __m512 d = _mm512_set1_ps(_cvtsh_ss(h));
    memcpy(&h, mt + 2, 2);
    const __m512 ndmin = _mm512_set1_ps(-_cvtsh_ss(h));
    *S = _mm512_mul_ps(d, _mm512_cvtepi32_ps(_mm512_cvtepu8_epi32(_mm_unpacklo_epi8(sm, sm))));
    *O = _mm512_mul_ps(ndmin, _mm512_cvtepi32_ps(_mm512_cvtepu8_epi32(_mm_unpackhi_epi8(sm, sm))));
}

/* lane j: sum over its 16 values of q qx (exact int32), less 32 sx for Q6_K */
static inline __m512i lane_dots(const __m512i V[4], const int8_t *a, int kind, const int32_t *sx) {
    __m512i s0 = _mm512_dpbusd_epi32(_mm512_setzero_si512(), V[0], _mm512_loadu_si512((const void *)a));
    __m512i s1 = _mm512_dpbusd_epi32(_mm512_setzero_si512(), V[1], _mm512_loadu_si512((const void *)(a + 64)));
    s0 = _mm512_dpbusd_epi32(s0, V[2], _mm512_loadu_si512((const void *)(a + 128)));
    s1 = _mm512_dpbusd_epi32(s1, V[3], _mm512_loadu_si512((const void *)(a + 192)));
    const __m512i s = _mm512_add_epi32(s0, s1);
    if (kind != 6) return s;
    return _mm512_sub_epi32(s, _mm512_slli_epi32(_mm512_loadu_si512((const void *)sx), 5));
}

/* Lane r of the result: the sum of the 16 lanes of v[r] (a tree of permute-adds). */
static inline __m512 sum16(__m512 v[16]) {
    __m512 a[8], b[4], c[2];
    const __m512i i1 = _mm512_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7, 16, 17, 18, 19, 20, 21, 22, 23);
    const __m512i j1 = _mm512_setr_epi32(8, 9, 10, 11, 12, 13, 14, 15, 24, 25, 26, 27, 28, 29, 30, 31);
    const __m512i i2 = _mm512_setr_epi32(0, 1, 2, 3, 16, 17, 18, 19, 8, 9, 10, 11, 24, 25, 26, 27);
    const __m512i j2 = _mm512_setr_epi32(4, 5, 6, 7, 20, 21, 22, 23, 12, 13, 14, 15, 28, 29, 30, 31);
    const __m512i i3 = _mm512_setr_epi32(0, 1, 16, 17, 4, 5, 20, 21, 8, 9, 24, 25, 12, 13, 28, 29);
    const __m512i j3 = _mm512_setr_epi32(2, 3, 18, 19, 6, 7, 22, 23, 10, 11, 26, 27, 14, 15, 30, 31);
    const __m512i i4 = _mm512_setr_epi32(0, 16, 2, 18, 4, 20, 6, 22, 8, 24, 10, 26, 12, 28, 14, 30);
    const __m512i j4 = _mm512_setr_epi32(1, 17, 3, 19, 5, 21, 7, 23, 9, 25, 11, 27, 13, 29, 15, 31);
    for (int i = 0; i < 8; i++)
        a[i] = _mm512_add_ps(_mm512_permutex2var_ps(v[i], i1, v[i + 8]), _mm512_permutex2var_ps(v[i], j1, v[i + 8]));
    for (int i = 0; i < 4; i++)
        b[i] = _mm512_add_ps(_mm512_permutex2var_ps(a[i], i2, a[i + 4]), _mm512_permutex2var_ps(a[i], j2, a[i + 4]));
    for (int i = 0; i < 2; i++)
        c[i] = _mm512_add_ps(_mm512_permutex2var_ps(b[i], i3, b[i + 2]), _mm512_permutex2var_ps(b[i], j3, b[i + 2]));
    return _mm512_add_ps(_mm512_permutex2var_ps(c[0], i4, c[1]), _mm512_permutex2var_ps(c[0], j4, c[1]));
}

/* One activation row against 16 weight rows: y[r] for row r. */
static void tile16_m1(const uint8_t *codes, const uint8_t *meta, int kind, i64 K, const int8_t *qx,
                      const float *dx, const float *cx, const int32_t *sx, float *y) {
    const i64 nsb = K / SB, cb = code_bytes(kind), mb = meta_bytes(kind);
    const i64 crow = nsb * cb, mrow = nsb * mb;
    __m512 acc[16];
    for (int r = 0; r < 16; r++) acc[r] = _mm512_setzero_ps();
    for (i64 sb = 0; sb < nsb; sb++) {
        const __m512 dxv = _mm512_loadu_ps(dx + sb * LANES), cxv = _mm512_loadu_ps(cx + sb * LANES);
        const int8_t *a = qx + sb * SB;
        for (int r = 0; r < 16; r++) {
            const uint8_t *rec = codes + r * crow + sb * cb;
            /* 16 rows are 16 streams, more than the hardware prefetcher follows: fetch 2 super-blocks ahead */
            for (i64 line = 0; line < cb; line += 64) _mm_prefetch((const char *)(rec + 2 * cb + line), _MM_HINT_T0);
            __m512i V[4];
            unpack_sb(rec, kind, V);
            __m512 S, O;
            lane_scales(meta + r * mrow + sb * mb, kind, &S, &O);
            const __m512i ip = lane_dots(V, a, kind, sx + sb * LANES);
            acc[r] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(ip), _mm512_mul_ps(S, dxv), acc[r]);
            if (kind != 6) acc[r] = _mm512_fmadd_ps(O, cxv, acc[r]);
        }
    }
    _mm512_storeu_ps(y, sum16(acc));
}

/* One weight row against M <= 64 activation rows: codes unpacked once per super-block for all of them. */
static void row_vnni(const uint8_t *codes, const uint8_t *meta, int kind, i64 K, const int8_t *qx,
                     const float *dx, const float *cx, const int32_t *sx, i64 M, float *y) {
    const i64 nsb = K / SB, nl = K / 16, cb = code_bytes(kind), mb = meta_bytes(kind);
    __m512 acc[64];
    for (i64 m = 0; m < M; m++) acc[m] = _mm512_setzero_ps();
    for (i64 sb = 0; sb < nsb; sb++) {
        __m512i V[4];
        unpack_sb(codes + sb * cb, kind, V);
        __m512 S, O;
        lane_scales(meta + sb * mb, kind, &S, &O);
        for (i64 m = 0; m < M; m++) {
            const i64 lane = m * nl + sb * LANES;
            const __m512i ip = lane_dots(V, qx + m * K + sb * SB, kind, sx + lane);
            acc[m] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(ip), _mm512_mul_ps(S, _mm512_loadu_ps(dx + lane)), acc[m]);
            if (kind != 6) acc[m] = _mm512_fmadd_ps(O, _mm512_loadu_ps(cx + lane), acc[m]);
        }
    }
    for (i64 m = 0; m < M; m++) y[m] = _mm512_reduce_add_ps(acc[m]);
}
#endif

/* out[m * out_stride + n] = sum over lanes dx S ip + O cx (+ bias[n]), n < N, m < M <= 64. ``generic``: the
 * plain-C path alone (the vector path's reference). */
static void gemv_kq(const uint8_t *codes, const uint8_t *meta, int kind, const float *bias, i64 N, i64 K,
                    const int8_t *qx, const float *dx, const float *cx, const int32_t *sx, i64 M, void *out,
                    i64 out_stride, int out_dt, int threads, int generic) {
    const i64 crow = K / SB * code_bytes(kind), mrow = K / SB * meta_bytes(kind);
    (void)generic; /* without AVX-512 VNNI every path is the plain one */
#ifdef GB_VNNI
    if (!generic && M == 1 && N >= 16) { /* batch 1: rows in tiles of 16 */
        const i64 tiles = N / 16;
#pragma omp parallel for schedule(static) num_threads(threads) if (N * K >= (1 << 16))
        for (i64 t = 0; t < tiles; t++) {
            float y[16];
            const i64 n0 = t * 16;
            tile16_m1(codes + n0 * crow, meta + n0 * mrow, kind, K, qx, dx, cx, sx, y);
            for (int r = 0; r < 16; r++) store_out(out, n0 + r, y[r] + (bias ? bias[n0 + r] : 0.0f), out_dt);
        }
        const i64 done = tiles * 16; /* the last rows one by one */
        if (done < N)
            gemv_kq(codes + done * crow, meta + done * mrow, kind, bias ? bias + done : NULL, N - done, K, qx, dx,
                    cx, sx, M, (char *)out + done * (out_dt ? 2 : 4), out_stride, out_dt, threads, 0);
        return;
    }
#endif
#pragma omp parallel for schedule(static) num_threads(threads) if (N * K >= (1 << 16))
    for (i64 n = 0; n < N; n++) {
        float y[64];
#ifdef GB_VNNI
        if (!generic)
            row_vnni(codes + n * crow, meta + n * mrow, kind, K, qx, dx, cx, sx, M, y);
        else
#endif
            row_generic(codes + n * crow, meta + n * mrow, kind, K, qx, dx, cx, sx, M, y);
        const float bn = bias ? bias[n] : 0.0f;
        for (i64 m = 0; m < M; m++) store_out(out, m * out_stride + n, y[m] + bn, out_dt);
    }
}

void gb_gemv_kquant(const uint8_t *codes, const uint8_t *meta, int kind, const float *bias, i64 N, i64 K,
                    const int8_t *qx, const float *dx, const float *cx, const int32_t *sx, i64 M, void *out,
                    i64 out_stride, int out_dt, int threads, int generic) {
    gemv_kq(codes, meta, kind, bias, N, K, qx, dx, cx, sx, M, out, out_stride, out_dt, threads, generic);
}

/* One linear in one call: x (M x K, dt 0 float32 / 1 bf16) to int8 codes, then the GEMV into out (M x N,
 * same dtype), 64 activation rows at a time. */
void gb_linear_kquant(const void *x, i64 M, i64 K, const uint8_t *codes, const uint8_t *meta, int kind,
                      const float *bias, i64 N, void *out, int dt, int threads) {
    const i64 nl = K / 16;
    int8_t *qx = (int8_t *)malloc((size_t)(M * K));
    float *dx = (float *)malloc((size_t)(M * nl) * sizeof(float));
    float *cx = (float *)malloc((size_t)(M * nl) * sizeof(float));
    int32_t *sx = (int32_t *)malloc((size_t)(M * nl) * sizeof(int32_t));
    if (qx && dx && cx && sx) {
        gb_quantize_rows_kq(x, M, K, qx, dx, cx, sx, dt, threads);
        for (i64 m0 = 0; m0 < M; m0 += 64) {
            const i64 rows = M - m0 < 64 ? M - m0 : 64;
            gemv_kq(codes, meta, kind, bias, N, K, qx + m0 * K, dx + m0 * nl, cx + m0 * nl, sx + m0 * nl, rows,
                    (char *)out + m0 * N * (dt ? 2 : 4), N, dt, threads, 0);
        }
    }
    free(qx);
    free(dx);
    free(cx);
    free(sx);
}

#ifdef GB_VNNI
static inline __m128i lane128(__m512i v, int i) {
    switch (i) {
    case 0: return _mm512_extracti32x4_epi32(v, 0);
    case 1: return _mm512_extracti32x4_epi32(v, 1);
    case 2: return _mm512_extracti32x4_epi32(v, 2);
    default: return _mm512_extracti32x4_epi32(v, 3);
    }
}

/* One super-block dequantized into out (256 values, dt 0 float32 / 1 bf16): the byte vectors transposed
 * back to value order (4 x 4 dwords per 128-bit lane), then 16 values of one lane at a time. */
static void dequant_sb(const uint8_t *rec, const uint8_t *mt, int kind, void *out, int dt) {
    __m512i V[4];
    unpack_sb(rec, kind, V);
    const __m512i t0 = _mm512_unpacklo_epi32(V[0], V[1]), t1 = _mm512_unpackhi_epi32(V[0], V[1]);
    const __m512i t2 = _mm512_unpacklo_epi32(V[2], V[3]), t3 = _mm512_unpackhi_epi32(V[2], V[3]);
    const __m512i u[4] = {_mm512_unpacklo_epi64(t0, t2), _mm512_unpackhi_epi64(t0, t2),
                          _mm512_unpacklo_epi64(t1, t3), _mm512_unpackhi_epi64(t1, t3)};
    __m512 Sv, Ov;
    lane_scales(mt, kind, &Sv, &Ov);
    float s[16], o[16];
    _mm512_storeu_ps(s, Sv);
    _mm512_storeu_ps(o, Ov);
    for (int L = 0; L < 4; L++) {
        for (int i = 0; i < 4; i++) { /* 128-bit lane L of u[i]: lane j = 4 L + i's 16 codes in order */
            const int j = 4 * L + i;
            __m512 q = _mm512_cvtepi32_ps(_mm512_cvtepu8_epi32(lane128(u[i], L)));
            __m512 f;
            if (kind == 6)
                f = _mm512_mul_ps(_mm512_sub_ps(q, _mm512_set1_ps(32.0f)), _mm512_set1_ps(s[j]));
            else
                f = _mm512_fmadd_ps(q, _mm512_set1_ps(s[j]), _mm512_set1_ps(o[j]));
            if (dt) {
#ifdef __AVX512BF16__
                _mm256_storeu_si256((__m256i *)((uint16_t *)out + 16 * j), (__m256i)_mm512_cvtneps_pbh(f));
#else
                float tmp[16];
                _mm512_storeu_ps(tmp, f);
                for (int t = 0; t < 16; t++) ((uint16_t *)out)[16 * j + t] = f2bf(tmp[t]);
#endif
            } else {
                _mm512_storeu_ps((float *)out + 16 * j, f);
            }
        }
    }
}
#endif

/* W (N x K) dequantized, rounded once to the dtype (dt 0 float32 / 1 bf16). ``generic``: plain C alone. */
void gb_dequant_kquant(const uint8_t *codes, const uint8_t *meta, int kind, i64 N, i64 K, void *out, int dt,
                       int threads, int generic) {
    const i64 nsb = K / SB, cb = code_bytes(kind), mb = meta_bytes(kind);
    (void)generic;
#pragma omp parallel for schedule(static) num_threads(threads) if (N * K >= (1 << 16))
    for (i64 n = 0; n < N; n++) {
        for (i64 sb = 0; sb < nsb; sb++) {
            const uint8_t *rec = codes + (n * nsb + sb) * cb, *mt = meta + (n * nsb + sb) * mb;
            const i64 at0 = n * K + sb * SB;
#ifdef GB_VNNI
            if (!generic) {
                dequant_sb(rec, mt, kind, (char *)out + at0 * (dt ? 2 : 4), dt);
                continue;
            }
#endif
            for (i64 r = 0; r < SB; r++) {
                float S, O;
                lane_scale(mt, kind, r / 16, &S, &O);
                const int q = code_of(rec, kind, r);
                store_out(out, at0 + r, kind == 6 ? S * (float)(q - 32) : S * (float)q + O, dt);
            }
        }
    }
}
