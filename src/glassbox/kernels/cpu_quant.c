/* glassbox CPU kernels for weights kept in 32-value blocks of 4, 5 or 8 bits (GGUF Q4_0, Q4_1, Q8_0, Q5_0,
 * Q5_1, IQ4_NL, and --quantization int4/int8), compiled with cpu_kernels.c by glassbox/kernels/native.py.
 *
 * One weight layout for every format (repacked at load by quant/blocks/weights.py): row n of K values
 * (K padded to Kp, a multiple of 64) holds unsigned codes q, and per 32-value block b a float16 scale
 * d[n,b] and an offset o[n,b]:  W[n,k] = d[n,b] * q[n,k] + o[n,b],  b = k / 32.  The offset is either
 * stored (float16, Q4_1: the block's min m), or -z[n,b] d[n,b] for an integer zero code z (uint8, GPTQ and AWQ:
 * W = d (q - z) exactly, -z d computed in float32), or c d[n,b] for one constant c (neither stored):
 *   Q4_0 and int4: q in 0..15, c = -8.   Q8_0 and int8: q = s + 128 (s the int8), c = -128.
 *   Q5_0: q in 0..31, c = -16.   IQ4_NL: q = T[i] + 128 for a 4-bit index i into GGML's table T, c = -128.
 * So a Q4_0 row costs 4.5 bits per weight, Q4_1 5, Q8_0 8.5, Q5_0 5.5, Q5_1 6, IQ4_NL 4.5: the file's own sizes.
 * 5-bit codes are stored as 4-bit ones plus their fifth bits in masks (cpu_quant.h code_at, chunk_vector);
 * IQ4_NL's indices as 4-bit codes, looked up with a byte shuffle when unpacked.
 * Codes come in chunks of 16 blocks (512 codes), interleaved so that one 64-byte vector holds 4 codes of
 * each of the 16 blocks: vector p, lane j (4 bytes) = block j's codes 4p .. 4p+3. 8-bit: a chunk is vectors
 * 0..7 (512 bytes). 4-bit: 4 vectors of 64 bytes whose low nibbles are vectors 0..3 and high nibbles 4..7
 * (256 bytes). Blocks past the last whole chunk follow in plain order (4-bit: 32-byte groups of 64 codes,
 * low nibbles codes 0..31, high 32..63). The activation codes use the same 8-bit arrangement, so that
 * AVX-512 VNNI sums each block's 32 products into one int32 lane with no reduction (see code_index).
 * The rows are stored in tiles of 16 (cpu_quant.h tiled_index, quant/blocks/tiles.py): a tile holds chunk 0
 * of its 16 rows one after another, then chunk 1's, ..., then the rows' tail blocks row after row; the
 * scales (offsets, zero codes) the same way, 16 per chunk. A last tile of R < 16 rows has R in place of 16.
 * The batch-1 GEMV takes a tile at a time, chunk by chunk, so it reads the weights front to back: two or
 * three sequential streams (codes, scales, offsets) instead of 16 rows' worth, which the hardware
 * prefetcher follows (benchmarks/kquant_gemv.py, 1 thread, weights from DRAM: 2048 x 2048 Q4_0 1.6-1.9x,
 * Q8_0 1.4-2.1x faster than 16 row-major rows with software prefetch).
 *
 * Decode rows (a few at a time) take llama.cpp's route: the activations are quantized to int8 per
 * 32-value block (scale dx = max|x| / 127, codes qx summing to sx; cx = dx sx), and
 *   y[m,n] = sum_b dx[m,b] d[n,b] sum_k q[n,k] qx[m,k]  +  sum_b o[n,b] cx[m,b]
 * with the inner sums exact in int32 (AVX-512 VNNI: 64 u8 x s8 products per instruction).
 * Other rows (prefill) dequantize the weight and use a float GEMM on the Python side.
 */
#include "cpu_quant.h"

/* Activations (M x K, float32 dt=0 or bf16 dt=1, row stride K) to int8 blocks: qx (M x Kp, zero past K),
 * dx and cx = dx * sum(codes) (M x Kp/32). A block of zeros gets dx = 0. Codes round half away from 0. */
void gb_quantize_rows_q8(const void *x, i64 M, i64 K, i64 Kp, int8_t *qx, float *dx, float *cx, int dt,
                         int threads) {
    const i64 nb = Kp / 32;
#pragma omp parallel for schedule(static) num_threads(threads) if (M * K >= (1 << 16))
    for (i64 m = 0; m < M; m++) {
        for (i64 b = 0; b < nb; b++) {
            int8_t c[32];
            const float d = q8_block(x, m * K + b * 32, K - b * 32, dt, c);
            int32_t s = 0;
            int8_t *q = qx + m * Kp;
            for (int j = 0; j < 32; j++) {
                q[code_index(b * 32 + j, Kp, 8)] = c[j];
                s += c[j];
            }
            dx[m * nb + b] = d;
            cx[m * nb + b] = d * (float)s;
        }
    }
}



/* sum over block b of row n's codes times the activation codes (exact int32; both in their interleaved order) */
static inline int32_t block_dot(const uint8_t *w, i64 N, i64 n, i64 b, i64 Kp, int bits, const int8_t *a) {
    int32_t s = 0;
    for (i64 k = b * 32; k < b * 32 + 32; k++) s += (int32_t)code_at(w, N, n, k, Kp, bits) * a[code_index(k, Kp, 8)];
    return s;
}

/* row n against each activation row, into y[m] (the plain-C path: every element through tiled_index) */
static void row_generic(const uint8_t *w, const uint16_t *d, const uint16_t *o, const uint8_t *z, float c, i64 N, i64 n,
                        i64 Kp, int bits, const int8_t *qx, const float *dx, const float *cx, i64 M, float *y) {
    const i64 nb = Kp / 32;
    for (i64 m = 0; m < M; m++) {
        float total = 0.0f;
        for (i64 b = 0; b < nb; b++) {
            const i64 mi = meta_at(N, n, b, Kp);
            const float db = h2f(d[mi]);
            const float ob = block_offset(o ? o + mi : NULL, z ? z + mi : NULL, c, 0, db);
            const int32_t ip = block_dot(w, N, n, b, Kp, bits, qx + m * Kp);
            total += dx[m * nb + b] * db * (float)ip + ob * cx[m * nb + b];
        }
        y[m] = total;
    }
}

#ifdef GB_VNNI
/* y[m] for one weight row: whole chunks in vectors (codes unpacked once for all M rows; one int32 lane per
 * block, so no reduction), the remaining blocks by tail_vnni. */
static void row_dot_vnni(const block_row *rw, float c, i64 Kp, int bits, const int8_t *qx, const float *dx,
                         const float *cx, i64 M, float *y) {
    const i64 nb = Kp / 32;
    const i64 chunks = nb / CHUNK;
    __m512 acc[64], off[64];
    for (i64 m = 0; m < M; m++) acc[m] = off[m] = _mm512_setzero_ps();
    for (i64 ch = 0; ch < chunks; ch++) {
        const i64 b = ch * CHUNK;
        const uint8_t *w = rw->w + ch * rw->wstep;
        __m512i codes[8];
        for (int p = 0; p < 8; p++) codes[p] = chunk_vector(w, bits, p);
        const i64 mo = ch * rw->mstep;
        const __m512 dv = _mm512_cvtph_ps(_mm256_loadu_si256((const __m256i *)(rw->d + mo)));
        const __m512 ov = block_offsets16(rw->o ? rw->o + mo : NULL, rw->z ? rw->z + mo : NULL, c, 0, dv);
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
    for (i64 m = 0; m < M; m++) {
        __m512 total = _mm512_add_ps(acc[m], off[m]);
        if (chunks * CHUNK < nb)
            total = _mm512_add_ps(total, tail_vnni(rw, c, Kp, bits, qx + m * Kp, dx + m * nb, cx + m * nb, chunks * CHUNK));
        y[m] = _mm512_reduce_add_ps(total);
    }
}

/* One activation row against the 16 rows of a whole tile (tile base pointers w, d, o, z): y[r] for its row r
 * (per-row horizontal sums done together at the end). The tile is read front to back: chunk by chunk, in
 * each its 16 rows' codes one after another (and their scales, offsets), then the rows' tail blocks.
 * Inlined where ``bits`` is a constant (gemv). */
static inline __attribute__((always_inline)) void rows16_m1(const uint8_t *w, const uint16_t *d, const uint16_t *o, const uint8_t *z, float c, i64 Kp,
                      int bits, const int8_t *qx, const float *dx, const float *cx, float *y) {
    const i64 nb = Kp / 32, chunks = nb / CHUNK;
    const i64 cb = chunk_bytes(bits); /* code bytes per chunk */
    const __m512i mask = _mm512_set1_epi8(15);
    __m512 acc[16];
    for (int r = 0; r < 16; r++) acc[r] = _mm512_setzero_ps();
    for (i64 ch = 0; ch < chunks; ch++) {
        const i64 b = ch * CHUNK;
        const __m512 dxv = _mm512_loadu_ps(dx + b), cxv = _mm512_loadu_ps(cx + b);
        const int8_t *a = qx + ch * 512;
        for (int r = 0; r < 16; r++) {
            const uint8_t *wr = w + (ch * 16 + r) * cb;
            const i64 mo = (ch * 16 + r) * CHUNK;
            __m512i s0 = _mm512_setzero_si512(), s1 = _mm512_setzero_si512();
            for (i64 q = 0; q < cb; q += 64) /* cpu_common.h */
                _mm_prefetch((const char *)(wr + GB_PREFETCH_AHEAD + q), _MM_HINT_T0);
            if (bits == 4) {
                for (int q = 0; q < 4; q += 2) {
                    const __m512i v0 = _mm512_loadu_si512((const void *)(wr + q * 64));
                    const __m512i v1 = _mm512_loadu_si512((const void *)(wr + q * 64 + 64));
                    s0 = _mm512_dpbusd_epi32(s0, _mm512_and_si512(v0, mask), _mm512_loadu_si512((const void *)(a + q * 64)));
                    s1 = _mm512_dpbusd_epi32(s1, _mm512_and_si512(v1, mask), _mm512_loadu_si512((const void *)(a + q * 64 + 64)));
                    s0 = _mm512_dpbusd_epi32(s0, _mm512_and_si512(_mm512_srli_epi16(v0, 4), mask),
                                             _mm512_loadu_si512((const void *)(a + q * 64 + 256)));
                    s1 = _mm512_dpbusd_epi32(s1, _mm512_and_si512(_mm512_srli_epi16(v1, 4), mask),
                                             _mm512_loadu_si512((const void *)(a + q * 64 + 320)));
                }
            } else { /* 8 bits; 5 bits and IQ4_NL's table (cpu_quant.h chunk_vector) */
                for (int p = 0; p < 8; p += 2) {
                    s0 = _mm512_dpbusd_epi32(s0, chunk_vector(wr, bits, p), _mm512_loadu_si512((const void *)(a + p * 64)));
                    s1 = _mm512_dpbusd_epi32(s1, chunk_vector(wr, bits, p + 1),
                                             _mm512_loadu_si512((const void *)(a + p * 64 + 64)));
                }
            }
            const __m512 dv = _mm512_cvtph_ps(_mm256_loadu_si256((const __m256i *)(d + mo)));
            const __m512 ov = block_offsets16(o ? o + mo : NULL, z ? z + mo : NULL, c, 0, dv);
            acc[r] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(_mm512_add_epi32(s0, s1)), _mm512_mul_ps(dv, dxv), acc[r]);
            acc[r] = _mm512_fmadd_ps(ov, cxv, acc[r]);
        }
    }
    if (chunks * CHUNK < nb) /* blocks past the last whole chunk */
        for (int r = 0; r < 16; r++) {
            const block_row rw = row_at(w, d, o, z, 16, Kp, bits, r); /* the tile alone: 16 rows */
            acc[r] = _mm512_add_ps(acc[r], tail_vnni(&rw, c, Kp, bits, qx, dx, cx, chunks * CHUNK));
        }
    _mm512_storeu_ps(y, sum_lanes16(acc));
}
#endif

/* out[m * out_stride + n] = sum_b dx[m,b] d[n,b] ip + o[n,b] cx[m,b] (+ bias[n]) for n < N, m < M.
 * w, d, o, z: N rows in tiles of 16 (see above); M <= 64. Each thread takes a run of whole tiles.
 * ``generic``: the plain-C path alone (the vector path's reference). */
static void gemv(const uint8_t *w, const uint16_t *d, const uint16_t *o, const uint8_t *z, float c, const float *bias, i64 N, i64 Kp,
                 int bits, const int8_t *qx, const float *dx, const float *cx, i64 M, void *out, i64 out_stride,
                 int out_dt, int threads, int generic) {
    const i64 row_bytes = code_row_bytes(Kp, bits);
    const i64 nb = Kp / 32;
    const i64 tiles = (N + TILE - 1) / TILE;
#pragma omp parallel for schedule(static) num_threads(threads) if (N * Kp >= (1 << 16))
    for (i64 t = 0; t < tiles; t++) {
        const i64 n0 = t * TILE, rows = N - n0 < TILE ? N - n0 : TILE;
        float y[64 * TILE];
#ifdef GB_VNNI
        if (!generic && M == 1 && rows == TILE) { /* batch 1, a whole tile: each format's own code */
            const uint8_t *wt = w + n0 * row_bytes;
            const uint16_t *dt = d + n0 * nb, *ot = o ? o + n0 * nb : NULL;
            const uint8_t *zt = z ? z + n0 * nb : NULL;
            if (bits == 4)
                rows16_m1(wt, dt, ot, zt, c, Kp, 4, qx, dx, cx, y);
            else if (bits == 5)
                rows16_m1(wt, dt, ot, zt, c, Kp, 5, qx, dx, cx, y);
            else if (bits == (4 | GB_NL))
                rows16_m1(wt, dt, ot, zt, c, Kp, 4 | GB_NL, qx, dx, cx, y);
            else
                rows16_m1(wt, dt, ot, zt, c, Kp, 8, qx, dx, cx, y);
        } else
#endif
            for (i64 r = 0; r < rows; r++) {
#ifdef GB_VNNI
                if (!generic) {
                    const i64 next = N - n0 - TILE < TILE ? N - n0 - TILE : TILE; /* the next tile's rows */
                    if (next > 0) {
                        const i64 n1 = n0 + TILE;
                        prefetch_part(w + n1 * row_bytes, next * row_bytes, r);
                        prefetch_part(d + n1 * nb, next * nb * 2, r);
                        if (o) prefetch_part(o + n1 * nb, next * nb * 2, r);
                        if (z) prefetch_part(z + n1 * nb, next * nb, r);
                    }
                    const block_row rw = row_at(w, d, o, z, N, Kp, bits, n0 + r);
                    row_dot_vnni(&rw, c, Kp, bits, qx, dx, cx, M, y + r * M);
                    continue;
                }
#endif
                row_generic(w, d, o, z, c, N, n0 + r, Kp, bits, qx, dx, cx, M, y + r * M);
            }
        for (i64 r = 0; r < rows; r++) {
            const float bn = bias ? bias[n0 + r] : 0.0f;
            for (i64 m = 0; m < M; m++) store_out(out, m * out_stride + n0 + r, y[r * M + m] + bn, out_dt);
        }
    }
}

void gb_gemv_blocks(const uint8_t *w, const uint16_t *d, const uint16_t *o, const uint8_t *z, float c, const float *bias, i64 N,
                    i64 Kp, int bits, const int8_t *qx, const float *dx, const float *cx, i64 M, void *out,
                    i64 out_stride, int out_dt, int threads) {
    gemv(w, d, o, z, c, bias, N, Kp, bits, qx, dx, cx, M, out, out_stride, out_dt, threads, 0);
}

void gb_gemv_blocks_generic(const uint8_t *w, const uint16_t *d, const uint16_t *o, const uint8_t *z, float c, const float *bias,
                            i64 N, i64 Kp, int bits, const int8_t *qx, const float *dx, const float *cx, i64 M,
                            void *out, i64 out_stride, int out_dt, int threads) {
    gemv(w, d, o, z, c, bias, N, Kp, bits, qx, dx, cx, M, out, out_stride, out_dt, threads, 1);
}

/* One linear in one call: x (M x K, dt 0 float32 / 1 bf16) to int8 blocks, then the GEMV into out (M x N,
 * same dtype), 64 activation rows at a time (each weight row is read once per 64 rows). */
void gb_linear_blocks(const void *x, i64 M, i64 K, const uint8_t *w, const uint16_t *d, const uint16_t *o, const uint8_t *z, float c,
                      const float *bias, i64 N, i64 Kp, int bits, void *out, int dt, int threads) {
    const i64 nb = Kp / 32;
    int8_t *qx = (int8_t *)malloc((size_t)(M * Kp));
    float *dx = (float *)malloc((size_t)(M * nb) * sizeof(float));
    float *cx = (float *)malloc((size_t)(M * nb) * sizeof(float));
    if (qx && dx && cx) {
        gb_quantize_rows_q8(x, M, K, Kp, qx, dx, cx, dt, threads);
        for (i64 m0 = 0; m0 < M; m0 += 64) {
            const i64 rows = M - m0 < 64 ? M - m0 : 64;
            gemv(w, d, o, z, c, bias, N, Kp, bits, qx + m0 * Kp, dx + m0 * nb, cx + m0 * nb, rows,
                 (char *)out + m0 * N * (dt ? 2 : 4), N, dt, threads, 0);
        }
    }
    free(qx);
    free(dx);
    free(cx);
}

/* W (N x K, float32 dt=0 or bf16 dt=1): the weight itself, d q + o per value, rounded once to the dtype. */
