/* glassbox's int8 prompt GEMM for weights kept in 32-value blocks (cpu_quant.c's layout and arithmetic:
 * Q4_0, Q4_1, Q8_0, Q5_0, Q5_1, IQ4_NL, --quantization int4/int8), for many activation rows at once.
 *
 * The arithmetic is the decode GEMV's (cpu_quant.c): x quantized per row in 32-value blocks to int8 (llama.cpp's
 * q8_0: dx = max|x| / 127, codes qx, cx = dx sum(qx)), then
 *   y[m,n] = sum_b dx[m,b] d[n,b] sum_k q[n,k] qx[m,k]  +  sum_b o[n,b] cx[m,b]      (+ bias[n])
 * with each block's inner sum exact in int32 (AVX-512 VNNI vpdpbusd: u8 codes x s8 activations).
 *
 * The GEMV reads one weight row at a time and streams every activation row past it: each activation vector
 * loaded feeds one vpdpbusd, and M activation rows of K bytes (past L1 for prompt sizes) come from L2 once per
 * weight row. Here a register tile of NR = 4 weight rows x MR = 4 activation rows shares its loads: per
 * 64-code step 4 weight vectors (unpacked once: nibbles split, 5th bits added, IQ4_NL's table looked up) and 4
 * activation vectors feed 16 vpdpbusd into 16 int32 accumulators, lane j holding block j of the chunk (the
 * interleaved layout: no reduction inside a block). After each chunk of 16 blocks the 16 sums turn float and
 * are scaled by d dx (Q4_1-like stored offsets and zero codes: o cx added; a constant offset c d instead starts
 * the int32 sums at c sx, sx the block's activation codes' sum). Cache blocking: a thread owns whole tiles of 16
 * weight rows (threads over output columns, as the GEMV); for each panel of activation rows (PANEL_BYTES of
 * codes, in L2) it walks its tiles, and in a tile takes 4 activation rows at a time (4 Kp bytes, in L1) against
 * the tile's 4-row groups (16 Kp / 2 bytes at 4 bits: in L1 for K up to ~4096, else L2).
 * Blocks past the last whole chunk (K not a multiple of 512) go through cpu_quant.h's tail_vnni per pair.
 *
 * Built without AVX-512 VNNI, gb_gemm_blocks_native() says 0 and the Python side keeps its float path
 * (dequantized weight, oneDNN's GEMM); gb_gemm_blocks then runs the GEMV's plain-C path (the reference). */
#include "cpu_quant.h"

void gb_linear_blocks(const void *x, i64 M, i64 K, const uint8_t *w, const uint16_t *d, const uint16_t *o,
                      const uint8_t *z, float c, const float *bias, i64 N, i64 Kp, int bits, void *out, int dt,
                      int threads);

#define NR 4  /* weight rows per register tile */
#define MR 4  /* activation rows per register tile */
#define PANEL_BYTES (1 << 19) /* activation codes per panel: within L2 (2 MB a core on the Xeon, 1 MB on Zen 4) */

#ifdef GB_VNNI
/* One chunk (16 blocks) of the full 4 x 4 tile: s[i * 4 + j] += the block sums of weight row i (its chunk's codes
 * at w[i]) and activation row j (its chunk at a + j Kp), lane b = block b. Named accumulators: 16 int32 vectors,
 * 4 weight vectors and 1 activation vector stay in registers (gcc spills arrays of them). */
static inline __attribute__((always_inline)) void chunk4x4(const uint8_t *const w[NR], int bits, const int8_t *a,
                                                           i64 Kp, __m512i s[NR * MR]) {
    __m512i s00 = s[0], s01 = s[1], s02 = s[2], s03 = s[3], s10 = s[4], s11 = s[5], s12 = s[6], s13 = s[7];
    __m512i s20 = s[8], s21 = s[9], s22 = s[10], s23 = s[11], s30 = s[12], s31 = s[13], s32 = s[14], s33 = s[15];
#pragma GCC unroll 8
    for (int p = 0; p < 8; p++) {
        const __m512i w0 = chunk_vector(w[0], bits, p), w1 = chunk_vector(w[1], bits, p);
        const __m512i w2 = chunk_vector(w[2], bits, p), w3 = chunk_vector(w[3], bits, p);
        __m512i av = _mm512_loadu_si512((const void *)(a + p * 64));
        s00 = _mm512_dpbusd_epi32(s00, w0, av), s10 = _mm512_dpbusd_epi32(s10, w1, av);
        s20 = _mm512_dpbusd_epi32(s20, w2, av), s30 = _mm512_dpbusd_epi32(s30, w3, av);
        av = _mm512_loadu_si512((const void *)(a + Kp + p * 64));
        s01 = _mm512_dpbusd_epi32(s01, w0, av), s11 = _mm512_dpbusd_epi32(s11, w1, av);
        s21 = _mm512_dpbusd_epi32(s21, w2, av), s31 = _mm512_dpbusd_epi32(s31, w3, av);
        av = _mm512_loadu_si512((const void *)(a + 2 * Kp + p * 64));
        s02 = _mm512_dpbusd_epi32(s02, w0, av), s12 = _mm512_dpbusd_epi32(s12, w1, av);
        s22 = _mm512_dpbusd_epi32(s22, w2, av), s32 = _mm512_dpbusd_epi32(s32, w3, av);
        av = _mm512_loadu_si512((const void *)(a + 3 * Kp + p * 64));
        s03 = _mm512_dpbusd_epi32(s03, w0, av), s13 = _mm512_dpbusd_epi32(s13, w1, av);
        s23 = _mm512_dpbusd_epi32(s23, w2, av), s33 = _mm512_dpbusd_epi32(s33, w3, av);
    }
    s[0] = s00, s[1] = s01, s[2] = s02, s[3] = s03, s[4] = s10, s[5] = s11, s[6] = s12, s[7] = s13;
    s[8] = s20, s[9] = s21, s[10] = s22, s[11] = s23, s[12] = s30, s[13] = s31, s[14] = s32, s[15] = s33;
}

/* The same for an edge tile (nr < 4 or mr < 4): pairs past nr, mr untouched. */
static inline __attribute__((always_inline)) void chunk_edge(const uint8_t *const w[NR], int nr, int mr, int bits,
                                                             const int8_t *a, i64 Kp, __m512i s[NR * MR]) {
    for (int p = 0; p < 8; p++)
        for (int i = 0; i < nr; i++) {
            const __m512i wv = chunk_vector(w[i], bits, p);
            for (int j = 0; j < mr; j++)
                s[i * MR + j] =
                    _mm512_dpbusd_epi32(s[i * MR + j], wv, _mm512_loadu_si512((const void *)(a + j * Kp + p * 64)));
        }
}

/* y[i * MR + j] (i < nr weight rows rw[i], j < mr activation rows at qx + j Kp, their dx, cx at j nb):
 * 16 lanes out, lane i * MR + j = row pair (i, j) (lanes past nr, mr: zeros). Inlined where bits is a constant. */
static inline __attribute__((always_inline)) __m512 tile(const block_row *rw, int nr, int mr, float c, i64 Kp,
                                                         int bits, const int8_t *qx, const float *dx,
                                                         const float *cx, const int32_t *cs) {
    const i64 nb = Kp / 32, chunks = nb / CHUNK;
    __m512 acc[NR * MR];
    for (int r = 0; r < NR * MR; r++) acc[r] = _mm512_setzero_ps();
    for (i64 ch = 0; ch < chunks; ch++) {
        const i64 b = ch * CHUNK;
        __m512i s[NR * MR]; /* constant offsets: start from c sx, the offsets' share in integers */
        for (int j = 0; j < MR; j++) {
            const __m512i s0 = cs && j < mr ? _mm512_loadu_si512((const void *)(cs + j * nb + b)) : _mm512_setzero_si512();
            for (int i = 0; i < NR; i++) s[i * MR + j] = s0;
        }
        const uint8_t *w[NR];
        for (int i = 0; i < NR; i++) w[i] = rw[i < nr ? i : 0].w + ch * rw[i < nr ? i : 0].wstep;
        if (nr == NR && mr == MR)
            chunk4x4(w, bits, qx + ch * 512, Kp, s);
        else
            chunk_edge(w, nr, mr, bits, qx + ch * 512, Kp, s);
        for (int i = 0; i < nr; i++) {
            const i64 mo = ch * rw[i].mstep;
            const __m512 dv = _mm512_cvtph_ps(_mm256_loadu_si256((const __m256i *)(rw[i].d + mo)));
            if (cs) {
                for (int j = 0; j < mr; j++) {
                    const __m512 scale = _mm512_mul_ps(dv, _mm512_loadu_ps(dx + j * nb + b));
                    acc[i * MR + j] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(s[i * MR + j]), scale, acc[i * MR + j]);
                }
                continue;
            }
            const __m512 ov =
                block_offsets16(rw[i].o ? rw[i].o + mo : NULL, rw[i].z ? rw[i].z + mo : NULL, c, 0, dv);
            for (int j = 0; j < mr; j++) {
                const int r = i * MR + j;
                const __m512 scale = _mm512_mul_ps(dv, _mm512_loadu_ps(dx + j * nb + b));
                acc[r] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(s[r]), scale, acc[r]);
                acc[r] = _mm512_fmadd_ps(ov, _mm512_loadu_ps(cx + j * nb + b), acc[r]);
            }
        }
    }
    if (chunks * CHUNK < nb) /* blocks past the last whole chunk */
        for (int i = 0; i < nr; i++)
            for (int j = 0; j < mr; j++)
                acc[i * MR + j] = _mm512_add_ps(acc[i * MR + j], tail_vnni(&rw[i], c, Kp, bits, qx + j * Kp,
                                                                           dx + j * nb, cx + j * nb,
                                                                           chunks * CHUNK));
    return sum_lanes16(acc);
}

/* One (nr x mr) tile of one format: the whole 4 x 4 tile with its sizes constant, edges with them variable. */
#define GB_TILE_FOR(NAME, BITS)                                                                         \
    static __m512 tile_##NAME(const block_row *rw, int nr, int mr, float c, i64 Kp, const int8_t *qx,     \
                              const float *dx, const float *cx, const int32_t *cs) {                    \
        if (nr == NR && mr == MR) return tile(rw, NR, MR, c, Kp, BITS, qx, dx, cx, cs);                 \
        return tile(rw, nr, mr, c, Kp, BITS, qx, dx, cx, cs);                                           \
    }
GB_TILE_FOR(4, 4)
GB_TILE_FOR(5, 5)
GB_TILE_FOR(8, 8)
GB_TILE_FOR(nl, 4 | GB_NL)

typedef __m512 (*tile_fn)(const block_row *, int, int, float, i64, const int8_t *, const float *, const float *,
                          const int32_t *);

static void gemm(const uint8_t *w, const uint16_t *d, const uint16_t *o, const uint8_t *z, float c,
                 const float *bias, i64 N, i64 Kp, int bits, const int8_t *qx, const float *dx, const float *cx,
                 const int32_t *cs, i64 M, void *out, int out_dt, int threads) {
    const i64 nb = Kp / 32, tiles = (N + TILE - 1) / TILE;
    const i64 MB = PANEL_BYTES / Kp < 16 ? 16 : PANEL_BYTES / Kp / MR * MR; /* activation rows per panel */
    const tile_fn fn = bits == 4 ? tile_4 : bits == 5 ? tile_5 : bits == (4 | GB_NL) ? tile_nl : tile_8;
#pragma omp parallel num_threads(threads)
    for (i64 m0 = 0; m0 < M; m0 += MB) { /* a panel of MB activation rows (L2) against all the thread's tiles */
        const i64 mend = M - m0 < MB ? M : m0 + MB;
#pragma omp for schedule(static) nowait
        for (i64 t = 0; t < tiles; t++) { /* the same tiles each panel: no barrier needed */
            const i64 n0 = t * TILE, rows = N - n0 < TILE ? N - n0 : TILE;
            block_row rw[TILE];
            for (i64 r = 0; r < rows; r++) rw[r] = row_at(w, d, o, z, N, Kp, bits, n0 + r);
            for (i64 m = m0; m < mend; m += MR) { /* 4 activation rows (L1) against the tile's 4-row groups */
                const int mr = mend - m < MR ? (int)(mend - m) : MR;
                for (i64 g = 0; g < rows; g += NR) {
                    const int nr = rows - g < NR ? (int)(rows - g) : NR;
                    float y[NR * MR];
                    _mm512_storeu_ps(y, fn(rw + g, nr, mr, c, Kp, qx + m * Kp, dx + m * nb, cx + m * nb,
                                           cs ? cs + m * nb : NULL));
                    for (int i = 0; i < nr; i++) {
                        const i64 n = n0 + g + i;
                        const float bn = bias ? bias[n] : 0.0f;
                        for (int j = 0; j < mr; j++) store_out(out, (m + j) * N + n, y[i * MR + j] + bn, out_dt);
                    }
                }
            }
        }
    }
}
#endif

#ifdef GB_VNNI
/* gb_quantize_rows_q8 (cpu_quant.c) in vectors, the same codes: x (M x K, dt 0 float32 / 1 bf16) to int8 blocks
 * qx (M x Kp, cpu_quant.c's interleaved order, zero past K), dx, cx = dx sum(codes), and cs = ci sum(codes)
 * (M x Kp / 32). Codes are roundf(x / dx) exactly: t = trunc(y), then t + sign(y) where |y - t| >= 1/2 (y - t
 * is exact in float32). */
static void quantize_rows(const void *x, i64 M, i64 K, i64 Kp, int8_t *qx, float *dx, float *cx, int32_t *cs,
                          int32_t ci, int dt, int threads) {
    const i64 nb = Kp / 32, whole = nb / CHUNK * CHUNK;
#pragma omp parallel for schedule(static) num_threads(threads) if (M * K >= (1 << 16))
    for (i64 m = 0; m < M; m++) {
        int32_t *row = (int32_t *)(void *)(qx + m * Kp); /* 4 codes a word */
        for (i64 b = 0; b < nb; b++) {
            const i64 k0 = b * 32, valid = K - k0 < 0 ? 0 : K - k0 > 32 ? 32 : K - k0;
            const __mmask16 m0 = (__mmask16)(valid >= 16 ? 0xffffu : (1u << valid) - 1u);
            const __mmask16 m1 = (__mmask16)(valid >= 32 ? 0xffffu : valid <= 16 ? 0u : (1u << (valid - 16)) - 1u);
            __m512 v0, v1;
            if (dt) {
                const uint16_t *p = (const uint16_t *)x + m * K + k0;
                v0 = _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(_mm256_maskz_loadu_epi16(m0, p)), 16));
                v1 = _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(_mm256_maskz_loadu_epi16(m1, p + 16)), 16));
            } else {
                const float *p = (const float *)x + m * K + k0;
                v0 = _mm512_maskz_loadu_ps(m0, p);
                v1 = _mm512_maskz_loadu_ps(m1, p + 16);
            }
            const float amax = _mm512_reduce_max_ps(_mm512_max_ps(_mm512_abs_ps(v0), _mm512_abs_ps(v1)));
            const float dv = amax / 127.0f, id = dv > 0.0f ? 1.0f / dv : 0.0f;
            __m512i q[2];
            for (int h = 0; h < 2; h++) {
                const __m512 y = _mm512_mul_ps(h ? v1 : v0, _mm512_set1_ps(id));
                const __m512 t = _mm512_roundscale_ps(y, _MM_FROUND_TO_ZERO | _MM_FROUND_NO_EXC);
                const __mmask16 up = _mm512_cmp_ps_mask(_mm512_abs_ps(_mm512_sub_ps(y, t)), _mm512_set1_ps(0.5f), _CMP_GE_OQ);
                const __m512 one = _mm512_or_ps(_mm512_and_ps(y, _mm512_set1_ps(-0.0f)), _mm512_set1_ps(1.0f));
                q[h] = _mm512_cvttps_epi32(_mm512_mask_add_ps(t, up, t, one));
            }
            const int32_t sum = _mm512_reduce_add_epi32(_mm512_add_epi32(q[0], q[1]));
            int32_t words[8];
            _mm_storeu_si128((__m128i *)(void *)words, _mm512_cvtepi32_epi8(q[0]));
            _mm_storeu_si128((__m128i *)(void *)(words + 4), _mm512_cvtepi32_epi8(q[1]));
            if (b < whole) /* word p of block j of chunk ch at word ch * 128 + p * 16 + j (code_index) */
                for (int p = 0; p < 8; p++) row[(b / CHUNK) * 128 + p * CHUNK + b % CHUNK] = words[p];
            else
                memcpy(row + b * 8, words, 32);
            dx[m * nb + b] = dv;
            cx[m * nb + b] = dv * (float)sum;
            cs[m * nb + b] = ci * sum;
        }
    }
}

#endif

/* 1 where gb_gemm_blocks runs the VNNI tiles (built with AVX-512 VNNI), else 0. */
int gb_gemm_blocks_native(void) {
#ifdef GB_VNNI
    return 1;
#else
    return 0;
#endif
}

/* out (M x N, dtype dt: 0 float32, 1 bf16) = x (M x K, same dtype) W^T (+ bias), W in tiled blocks (cpu_quant.c;
 * weight arguments as gb_linear_blocks). */
void gb_gemm_blocks(const void *x, i64 M, i64 K, const uint8_t *w, const uint16_t *d, const uint16_t *o,
                    const uint8_t *z, float c, const float *bias, i64 N, i64 Kp, int bits, void *out, int dt,
                    int threads) {
#ifdef GB_VNNI
    const i64 nb = Kp / 32;
    int8_t *qx = (int8_t *)malloc((size_t)(M * Kp));
    float *dx = (float *)malloc((size_t)(M * nb) * sizeof(float));
    float *cx = (float *)malloc((size_t)(M * nb) * sizeof(float));
    /* a constant offset c d (o, z NULL; c = -8, -16 or -128, an integer): c sx per activation block */
    const int constant = !o && !z;
    int32_t *cs = (int32_t *)malloc((size_t)(M * nb) * sizeof(int32_t));
    if (qx && dx && cx && cs) {
        quantize_rows(x, M, K, Kp, qx, dx, cx, cs, constant ? (int32_t)c : 0, dt, threads);
        gemm(w, d, o, z, c, bias, N, Kp, bits, qx, dx, cx, constant ? cs : NULL, M, out, dt, threads);
    }
    free(cs);
    free(qx);
    free(dx);
    free(cx);
#else
    gb_linear_blocks(x, M, K, w, d, o, z, c, bias, N, Kp, bits, out, dt, threads);
#endif
}
