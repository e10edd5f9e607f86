/* glassbox CPU kernels for GGUF K-quant weights kept as stored (Q4_K, Q5_K, Q6_K), compiled with
 * cpu_kernels.c by glassbox/kernels/native.py. The layout is written by quant/blocks/kquant.py.
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
 * The rows are stored in tiles of 16 (cpu_quant.h tiled_index; kq_at): a tile holds the first GEMV step (two
 * super-blocks for Q4_K/Q5_K, one for Q6_K) of its 16 rows one after another, then the second step's, ...,
 * then (an odd count of Q4_K/Q5_K super-blocks) the rows' last super-blocks; the meta records the same way.
 * So the batch-1 GEMV, a tile at a time, reads its weights front to back.
 *
 * Decode rows: the activations are quantized to int8 per 32 values (as cpu_quant.c: dx = max|x| / 127,
 * codes rounded half away from zero), their codes put in the same lane order, with per 32-value block dx and
 * cx = dx times the sum of its codes, and per 16-value lane that sum sx. Then, exactly in int32,
 *   Q4_K, Q5_K: per sub-block s of 32 values, ip = sum q qx (its two lanes added); y = sum_s dx S ip + O cx,
 *     two super-blocks (16 sub-blocks) to a vector;
 *   Q6_K: per lane, ip = sum q qx - 32 sx; y = sum_lanes dx S ip.
 */
#include "cpu_kquant.h"

/* Activations (M x K, float32 dt=0 or bf16 dt=1) to int8 codes in lane order (M x K); per 32-value block
 * (M x K/32) its scale dx and cx = dx times its codes' sum, per 16-value lane (M x K/16) the codes' sum sx. */
void gb_quantize_rows_kq(const void *x, i64 M, i64 K, int8_t *qx, float *dx, float *cx, int32_t *sx, int dt,
                         int threads) {
    const i64 nb = K / 32;
#pragma omp parallel for schedule(static) num_threads(threads) if (M * K >= (1 << 16))
    for (i64 m = 0; m < M; m++) {
        for (i64 b = 0; b < nb; b++) {
            int8_t c[32];
            const float d = q8_block(x, m * K + b * 32, 32, dt, c);
            int32_t s[2] = {0, 0};
            for (int t = 0; t < 32; t++) {
                const i64 k = b * 32 + t;
                qx[m * K + (k / SB) * SB + lane_pos(k % SB)] = c[t];
                s[t / 16] += c[t];
            }
            dx[m * nb + b] = d;
            cx[m * nb + b] = d * (float)(s[0] + s[1]);
            sx[m * 2 * nb + 2 * b] = s[0];
            sx[m * 2 * nb + 2 * b + 1] = s[1];
        }
    }
}

/* Row n of the N rows against M activation rows, plain C: y[m]. */
static void row_generic(const uint8_t *codes, const uint8_t *meta, int kind, i64 N, i64 n, i64 K, const int8_t *qx,
                        const float *dx, const float *cx, const int32_t *sx, i64 M, float *y) {
    const i64 nsb = K / SB, nb = K / 32, cb = code_bytes(kind), mb = meta_bytes(kind);
    for (i64 m = 0; m < M; m++) {
        float total = 0.0f;
        for (i64 sb = 0; sb < nsb; sb++) {
            const uint8_t *rec = codes + kq_at(n, sb, N, nsb, cb, kind);
            const uint8_t *mt = meta + kq_at(n, sb, N, nsb, mb, kind);
            const int8_t *a = qx + m * K + sb * SB;
            const i64 b0 = m * nb + sb * 8; /* this super-block's first activation block */
            const int lane = kq_step(kind) == 1;
            for (i64 j = 0; j < LANES; j += (lane ? 1 : 2)) { /* a lane or (Q4_K, Q5_K) a sub-block of two */
                const i64 width = lane ? 16 : 32;
                int32_t ip = 0;
                for (i64 r = 16 * j; r < 16 * j + width; r++) ip += code_of(rec, kind, r) * a[lane_pos(r)];
                float S, O;
                lane_scale(mt, kind, j, &S, &O);
                if (lane) /* O: Q2_K's min, times the lane's activation sum */
                    total += (float)(ip - code_offset(kind) * sx[2 * b0 + j]) * (S * dx[b0 + j / 2]) +
                             O * (dx[b0 + j / 2] * (float)sx[2 * b0 + j]);
                else
                    total += (float)ip * (S * dx[b0 + j / 2]) + O * cx[b0 + j / 2];
            }
        }
        y[m] = total;
    }
}

#ifdef GB_VNNI
/* lane j: sum over its 16 values of q qx (exact int32), less c sx for the codes' offset c (code_offset) */
static inline __attribute__((always_inline)) __m512i lane_dots(const __m512i V[4], const int8_t *a, int kind,
                                                               const int32_t *sx) {
    __m512i s0 = _mm512_dpbusd_epi32(_mm512_setzero_si512(), V[0], _mm512_loadu_si512((const void *)a));
    __m512i s1 = _mm512_dpbusd_epi32(_mm512_setzero_si512(), V[1], _mm512_loadu_si512((const void *)(a + 64)));
    s0 = _mm512_dpbusd_epi32(s0, V[2], _mm512_loadu_si512((const void *)(a + 128)));
    s1 = _mm512_dpbusd_epi32(s1, V[3], _mm512_loadu_si512((const void *)(a + 192)));
    const __m512i s = _mm512_add_epi32(s0, s1);
    if (!code_offset(kind)) return s;
    const __m512i sxv = _mm512_loadu_si512((const void *)sx);
    if (kind == 6) return _mm512_sub_epi32(s, _mm512_slli_epi32(sxv, 5));
    return _mm512_sub_epi32(s, _mm512_mullo_epi32(sxv, _mm512_set1_epi32(code_offset(kind))));
}

/* Q4_K/Q5_K, super-blocks sb and sb + 1 (``two``: whether the second exists) of one weight row against one
 * activation row: per sub-block s (0-7 the first's, 8-15 the second's) ip_s, exact, its two lanes added. */
static inline __m512i pair_dots(const uint8_t *rec, int kind, int two, const int8_t *a) {
    __m512i V[4];
    unpack_sb(rec, kind, V);
    const __m512i s0 = lane_dots(V, a, kind, NULL);
    __m512i s1 = _mm512_setzero_si512();
    if (two) {
        unpack_sb(rec + code_bytes(kind), kind, V);
        s1 = lane_dots(V, a + SB, kind, NULL);
    }
    const __m512i even = _mm512_setr_epi32(0, 2, 4, 6, 8, 10, 12, 14, 16, 18, 20, 22, 24, 26, 28, 30);
    const __m512i odd = _mm512_setr_epi32(1, 3, 5, 7, 9, 11, 13, 15, 17, 19, 21, 23, 25, 27, 29, 31);
    return _mm512_add_epi32(_mm512_permutex2var_epi32(s0, even, s1), _mm512_permutex2var_epi32(s0, odd, s1));
}

/* Q6_K's per-lane activation scales dx (one per 32 values, each over two lanes) of one super-block. */
static inline __m512 lane_dx(const float *dx) {
    const __m512i dup = _mm512_setr_epi32(0, 0, 1, 1, 2, 2, 3, 3, 4, 4, 5, 5, 6, 6, 7, 7);
    return _mm512_permutexvar_ps(dup, _mm512_castps256_ps512(_mm256_loadu_ps(dx)));
}

/* One activation row against the 16 rows of a whole tile (its codes and meta): y[r] for row r. Q4_K/Q5_K two
 * super-blocks a step, Q6_K one; the tile is read front to back (a step's 16 rows one after another).
 * Inlined where ``kind`` is a constant: the compiler drops the other kinds' branches (8-10% faster). */
static inline __attribute__((always_inline)) void tile16_m1(const uint8_t *codes, const uint8_t *meta, int kind, i64 K, const int8_t *qx,
                      const float *dx, const float *cx, const int32_t *sx, float *y) {
    const i64 nsb = K / SB, cb = code_bytes(kind), mb = meta_bytes(kind);
    const i64 step = kq_step(kind), full = nsb / step * step; /* super-blocks in whole steps */
    const int lane = step == 1; /* per-lane scales (all but Q4_K, Q5_K) */
    __m512 acc[16];
    for (int r = 0; r < 16; r++) acc[r] = _mm512_setzero_ps();
    for (i64 sb = 0; sb < nsb; sb += step) {
        const int two = !lane && sb + 1 < nsb;
        const __mmask16 k = two ? 0xFFFF : 0x00FF;
        const __m512 dxv = lane ? lane_dx(dx + sb * 8) : _mm512_maskz_loadu_ps(k, dx + sb * 8);
        /* Q2_K: per lane dx sx (its mins' factor); Q4_K/Q5_K: per sub-block cx */
        const __m512 cxv = kind == 2   ? _mm512_mul_ps(dxv, _mm512_cvtepi32_ps(_mm512_loadu_si512((const void *)(sx + sb * LANES))))
                           : lane ? dxv
                                  : _mm512_maskz_loadu_ps(k, cx + sb * 8);
        const int8_t *a = qx + sb * SB;
        for (int r = 0; r < 16; r++) {
            const i64 at = sb < full ? sb * 16 + r * step : full * 16 + r; /* in super-blocks */
            const uint8_t *rec = codes + at * cb, *mt = meta + at * mb;
            for (i64 q = 0; q < cb * step; q += 64) /* cpu_common.h */
                _mm_prefetch((const char *)(rec + GB_PREFETCH_AHEAD + q), _MM_HINT_T0);
            __m512 S, O;
            if (lane) {
                __m512i V[4];
                unpack_sb(rec, kind, V);
                lane_scales(mt, kind, &S, &O);
                const __m512i ip = lane_dots(V, a, kind, sx + sb * LANES);
                acc[r] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(ip), _mm512_mul_ps(S, dxv), acc[r]);
                if (kind == 2) acc[r] = _mm512_fmadd_ps(O, cxv, acc[r]);
            } else {
                pair_scales(mt, two, &S, &O);
                const __m512i ip = pair_dots(rec, kind, two, a);
                acc[r] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(ip), _mm512_mul_ps(S, dxv), acc[r]);
                acc[r] = _mm512_fmadd_ps(O, cxv, acc[r]);
            }
        }
    }
    _mm512_storeu_ps(y, sum_lanes16(acc));
}

/* Row n of the N rows against M <= 64 activation rows: codes unpacked once per step for all of them. */
static inline __attribute__((always_inline)) void row_vnni(const uint8_t *codes, const uint8_t *meta, int kind, i64 N, i64 n, i64 K,
                     const int8_t *qx, const float *dx, const float *cx, const int32_t *sx, i64 M, float *y) {
    const i64 nsb = K / SB, nb = K / 32, cb = code_bytes(kind), mb = meta_bytes(kind);
    const kq_row row = kq_row_at(codes, meta, kind, N, nsb, n);
    __m512 acc[64];
    for (i64 m = 0; m < M; m++) acc[m] = _mm512_setzero_ps();
    if (kq_step(kind) == 1) { /* per-lane scales */
        for (i64 sb = 0; sb < nsb; sb++) {
            __m512i V[4];
            unpack_sb(kq_codes(&row, sb, cb), kind, V);
            __m512 S, O;
            lane_scales(kq_meta(&row, sb, mb), kind, &S, &O);
            for (i64 m = 0; m < M; m++) {
                const i64 b0 = m * nb + sb * 8;
                const __m512i ip = lane_dots(V, qx + m * K + sb * SB, kind, sx + 2 * b0);
                const __m512 dxl = lane_dx(dx + b0);
                acc[m] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(ip), _mm512_mul_ps(S, dxl), acc[m]);
                if (kind == 2) { /* the mins: O dx sx per lane */
                    const __m512 sxf = _mm512_cvtepi32_ps(_mm512_loadu_si512((const void *)(sx + 2 * b0)));
                    acc[m] = _mm512_fmadd_ps(O, _mm512_mul_ps(dxl, sxf), acc[m]);
                }
            }
        }
    } else {
        for (i64 sb = 0; sb < nsb; sb += 2) {
            const int two = sb + 1 < nsb;
            const __mmask16 k = two ? 0xFFFF : 0x00FF;
            __m512 S, O;
            pair_scales(kq_meta(&row, sb, mb), two, &S, &O);
            const uint8_t *rec = kq_codes(&row, sb, cb); /* and sb + 1's after it */
            for (i64 m = 0; m < M; m++) { /* the codes come from L1 after the first row */
                const i64 b0 = m * nb + sb * 8;
                const __m512i ip = pair_dots(rec, kind, two, qx + m * K + sb * SB);
                acc[m] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(ip), _mm512_mul_ps(S, _mm512_maskz_loadu_ps(k, dx + b0)), acc[m]);
                acc[m] = _mm512_fmadd_ps(O, _mm512_maskz_loadu_ps(k, cx + b0), acc[m]);
            }
        }
    }
    for (i64 m = 0; m < M; m++) y[m] = _mm512_reduce_add_ps(acc[m]);
}
#endif

/* out[m * out_stride + n] = the sums above (+ bias[n]), n < N, m < M <= 64; codes and meta in tiles of 16
 * rows (kq_at), each thread a run of whole tiles. ``generic``: the plain-C path alone (the vector path's
 * reference). */
static void gemv_kq(const uint8_t *codes, const uint8_t *meta, int kind, const float *bias, i64 N, i64 K,
                    const int8_t *qx, const float *dx, const float *cx, const int32_t *sx, i64 M, void *out,
                    i64 out_stride, int out_dt, int threads, int generic) {
    const i64 crow = K / SB * code_bytes(kind), mrow = K / SB * meta_bytes(kind);
    const i64 tiles = (N + TILE - 1) / TILE;
    (void)generic; /* without AVX-512 VNNI every path is the plain one */
#pragma omp parallel for schedule(static) num_threads(threads) if (N * K >= (1 << 16))
    for (i64 t = 0; t < tiles; t++) {
        const i64 n0 = t * TILE, rows = N - n0 < TILE ? N - n0 : TILE;
        float y[64 * TILE];
#ifdef GB_VNNI
        if (!generic && M == 1 && rows == TILE) { /* batch 1, a whole tile */
            const uint8_t *c = codes + n0 * crow, *mt = meta + n0 * mrow;
            if (kind == 4)
                tile16_m1(c, mt, 4, K, qx, dx, cx, sx, y);
            else if (kind == 5)
                tile16_m1(c, mt, 5, K, qx, dx, cx, sx, y);
            else if (kind == 6)
                tile16_m1(c, mt, 6, K, qx, dx, cx, sx, y);
            else if (kind == 12)
                tile16_m1(c, mt, 12, K, qx, dx, cx, sx, y);
            else if (kind == 3)
                tile16_m1(c, mt, 3, K, qx, dx, cx, sx, y);
            else
                tile16_m1(c, mt, 2, K, qx, dx, cx, sx, y);
        } else
#endif
            for (i64 r = 0; r < rows; r++) {
#ifdef GB_VNNI
                const i64 next = N - n0 - TILE < TILE ? N - n0 - TILE : TILE; /* the next tile's rows */
                if (!generic && next > 0) { /* cpu_quant.h prefetch_part */
                    prefetch_part(codes + (n0 + TILE) * crow, next * crow, r);
                    prefetch_part(meta + (n0 + TILE) * mrow, next * mrow, r);
                }
                if (!generic && kind == 6) {
                    row_vnni(codes, meta, 6, N, n0 + r, K, qx, dx, cx, sx, M, y + r * M);
                    continue;
                }
                if (!generic) {
                    row_vnni(codes, meta, kind, N, n0 + r, K, qx, dx, cx, sx, M, y + r * M);
                    continue;
                }
#endif
                row_generic(codes, meta, kind, N, n0 + r, K, qx, dx, cx, sx, M, y + r * M);
            }
        for (i64 r = 0; r < rows; r++) {
            const float bn = bias ? bias[n0 + r] : 0.0f;
            for (i64 m = 0; m < M; m++) store_out(out, m * out_stride + n0 + r, y[r * M + m] + bn, out_dt);
        }
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
    const i64 nb = K / 32;
    int8_t *qx = (int8_t *)malloc((size_t)(M * K));
    float *dx = (float *)malloc((size_t)(M * nb) * sizeof(float));
    float *cx = (float *)malloc((size_t)(M * nb) * sizeof(float));
    int32_t *sx = (int32_t *)malloc((size_t)(M * 2 * nb) * sizeof(int32_t));
    if (qx && dx && cx && sx) {
        gb_quantize_rows_kq(x, M, K, qx, dx, cx, sx, dt, threads);
        for (i64 m0 = 0; m0 < M; m0 += 64) {
            const i64 rows = M - m0 < 64 ? M - m0 : 64;
            gemv_kq(codes, meta, kind, bias, N, K, qx + m0 * K, dx + m0 * nb, cx + m0 * nb, sx + m0 * 2 * nb, rows,
                    (char *)out + m0 * N * (dt ? 2 : 4), N, dt, threads, 0);
        }
    }
    free(qx);
    free(dx);
    free(cx);
    free(sx);
}
