/* bf16 linears on weights in tiles of 16 rows: out (M x N) = x (M x K, bf16) W^T + bias, W (N x K, bf16).
 *
 * Batch-1 decode of a dense bf16 model is one pass over every weight; what it costs is how fast that pass
 * streams. oneDNN's packed bf16 GEMV (what torch offers) reached about half the read-bandwidth probe on this
 * project's CPU (benchmarks/bf16_gemv.py). The layout here (quant/dense/bf16_tiles.py builds it at load) holds W as
 * (N/16, K/2, 16, 2): for each tile of 16 output rows, the K values in pairs, each 64-byte line the same two
 * k of 16 rows — what AVX-512 ``vdpbf16ps`` multiplies against a broadcast pair of activations. A tile is
 * read front to back, a matrix tile after tile, so each thread's weights stream as one sequential read, and
 * every output lands in a lane of a float32 accumulator (no horizontal sums). Up to 4 activation rows run
 * against four tiles at once (four independent multiply-add chains, which keeps up with the loads from cache
 * as well as from memory); more rows take tiles in pairs, 8 activation rows at a time (16 accumulators),
 * which keeps up with oneDNN's GEMM at prefill sizes too (benchmarks/bf16_gemv.py, bf16_decode.py).
 *
 * Every path adds each output's products in k order in one lane, so an output's bits do not depend on how
 * many rows ran with it or on the thread count: a lone decode row, the same row in a batch or among a
 * speculative step's verification rows get the same outputs (tests/test_bf16_linear.py holds this).
 *
 * Products of two bf16 values are exact in float32; the sums' order differs from oneDNN's (as oneDNN's own
 * does between layouts). The sum plus the float32 bias is rounded once to the output dtype. Without AVX-512
 * BF16, and as the tests' reference (``gb_linear_bf16t_generic``), a plain float32 loop over the same layout.
 */
#include "cpu_common.h"
#include <omp.h>
#if defined(__AVX512F__) && defined(__AVX512BW__) && defined(__AVX512BF16__)
#include <immintrin.h>
#define GB_BF16DP 1
#endif

/* weight (n, k) in the tiled layout of K2 = K / 2 pairs */
static inline float tiled_at(const uint16_t *wp, i64 K2, i64 n, i64 k) {
    return bf2f(wp[((n / 16) * K2 + k / 2) * 32 + (n % 16) * 2 + (k % 2)]);
}

static inline void put(void *out, i64 i, float v, int dt) {
    if (dt)
        ((uint16_t *)out)[i] = f2bf(v);
    else
        ((float *)out)[i] = v;
}

/* tiles [t0, t1) for every row, plain C: a float32 sum in k order. */
static void tiles_generic(const uint16_t *x, i64 M, i64 K, i64 ldx, const uint16_t *wp, const float *bias, i64 N,
                          i64 t0, i64 t1, void *out, i64 ldo, int dt) {
    const i64 n1 = t1 * 16 < N ? t1 * 16 : N;
    for (i64 n = t0 * 16; n < n1; n++)
        for (i64 m = 0; m < M; m++) {
            float s = 0.0f;
            for (i64 k = 0; k < K; k++) s += tiled_at(wp, K / 2, n, k) * bf2f(x[m * ldx + k]);
            put(out, m * ldo + n, s + (bias ? bias[n] : 0.0f), dt);
        }
}

#ifdef GB_BF16DP
/* 16 outputs of each of MB rows (acc sums) + bias into out columns [n, n + valid). */
static inline void store16(__m512 s, const float *bias, i64 n, i64 valid, void *out, i64 row, int dt) {
    const __mmask16 mask = valid >= 16 ? (__mmask16)0xffff : (__mmask16)((1u << valid) - 1);
    if (bias) s = _mm512_add_ps(s, _mm512_maskz_loadu_ps(mask, bias + n));
    if (dt)
        _mm256_mask_storeu_epi16((uint16_t *)out + row + n, mask, (__m256i)_mm512_cvtneps_pbh(s));
    else
        _mm512_mask_storeu_ps((float *)out + row + n, mask, s);
}

static inline __m512bh pair(const uint16_t *x, i64 p) {
    int32_t v;
    memcpy(&v, x + 2 * p, 4);
    return (__m512bh)_mm512_set1_epi32(v);
}

/* One tile (wt: K2 lines of 64 bytes) times MB activation rows: sums[m]; one sum per lane, in k order. */
static inline __attribute__((always_inline)) void tile1(const uint16_t *wt, const uint16_t *x, i64 ldx, i64 K2,
                                                        const int MB, __m512 *sums) {
    __m512 acc[4];
#pragma GCC unroll 4
    for (int m = 0; m < MB; m++) acc[m] = _mm512_setzero_ps();
    for (i64 p = 0; p < K2; p++) {
        const __m512bh wv = (__m512bh)_mm512_loadu_si512(wt + p * 32);
#pragma GCC unroll 4
        for (int m = 0; m < MB; m++) acc[m] = _mm512_dpbf16_ps(acc[m], wv, pair(x + m * ldx, p));
    }
#pragma GCC unroll 4
    for (int m = 0; m < MB; m++) sums[m] = acc[m];
}

/* Two adjacent tiles (wt, wt + K2 lines) times MB activation rows: sums[m * 2 + i] for tile i. */
static inline __attribute__((always_inline)) void tile2(const uint16_t *wt, const uint16_t *x, i64 ldx, i64 K2,
                                                        const int MB, __m512 *sums) {
    __m512 acc[8][2];
#pragma GCC unroll 8
    for (int m = 0; m < MB; m++) acc[m][0] = acc[m][1] = _mm512_setzero_ps();
    const uint16_t *wu = wt + K2 * 32;
    for (i64 p = 0; p < K2; p++) {
        const __m512bh w0 = (__m512bh)_mm512_loadu_si512(wt + p * 32);
        const __m512bh w1 = (__m512bh)_mm512_loadu_si512(wu + p * 32);
#pragma GCC unroll 8
        for (int m = 0; m < MB; m++) {
            const __m512bh xv = pair(x + m * ldx, p);
            acc[m][0] = _mm512_dpbf16_ps(acc[m][0], w0, xv);
            acc[m][1] = _mm512_dpbf16_ps(acc[m][1], w1, xv);
        }
    }
#pragma GCC unroll 8
    for (int m = 0; m < MB; m++) sums[2 * m] = acc[m][0], sums[2 * m + 1] = acc[m][1];
}


/* Four adjacent tiles times MB (<= 4) activation rows: sums[m * 4 + i] for tile i; one sum per lane, in k
 * order (as tile2), so that a row's result does not depend on how many rows ran with it. */
static inline __attribute__((always_inline)) void tile4(const uint16_t *wt, const uint16_t *x, i64 ldx, i64 K2,
                                                        const int MB, __m512 *sums) {
    __m512 acc[4][4];
#pragma GCC unroll 4
    for (int m = 0; m < MB; m++)
#pragma GCC unroll 4
        for (int i = 0; i < 4; i++) acc[m][i] = _mm512_setzero_ps();
    const i64 ts = K2 * 32;
    for (i64 p = 0; p < K2; p++) {
        __m512bh wv[4];
#pragma GCC unroll 4
        for (int i = 0; i < 4; i++) _mm_prefetch((const char *)(wt + i * ts + p * 32) + GB_PREFETCH_AHEAD, _MM_HINT_T0);
#pragma GCC unroll 4
        for (int i = 0; i < 4; i++) wv[i] = (__m512bh)_mm512_loadu_si512(wt + i * ts + p * 32);
#pragma GCC unroll 4
        for (int m = 0; m < MB; m++) {
            const __m512bh xv = pair(x + m * ldx, p);
#pragma GCC unroll 4
            for (int i = 0; i < 4; i++) acc[m][i] = _mm512_dpbf16_ps(acc[m][i], wv[i], xv);
        }
    }
#pragma GCC unroll 4
    for (int m = 0; m < MB; m++)
#pragma GCC unroll 4
        for (int i = 0; i < 4; i++) sums[4 * m + i] = acc[m][i];
}

/* tiles [t0, t1) for every activation row: 1-4 rows four tiles at a time, 5 and more two tiles x 8 rows; the
 * tiles left over one at a time. Every path sums each output in k order in one float32 lane. */
static void tiles_dp(const uint16_t *x, i64 M, i64 K, i64 ldx, const uint16_t *wp, const float *bias, i64 N,
                     i64 t0, i64 t1, void *out, i64 ldo, int dt) {
    const i64 K2 = K / 2;
    __m512 s[16];
    i64 t = t0;
    if (M >= 5)
        for (; t + 2 <= t1; t += 2) {
            const uint16_t *wt = wp + t * K2 * 32;
            for (i64 m0 = 0; m0 < M; m0 += 8) {
                const i64 mb = M - m0 < 8 ? M - m0 : 8;
                const uint16_t *xm = x + m0 * ldx;
                switch (mb) {
                case 1: tile2(wt, xm, ldx, K2, 1, s); break;
                case 2: tile2(wt, xm, ldx, K2, 2, s); break;
                case 3: tile2(wt, xm, ldx, K2, 3, s); break;
                case 4: tile2(wt, xm, ldx, K2, 4, s); break;
                case 5: tile2(wt, xm, ldx, K2, 5, s); break;
                case 6: tile2(wt, xm, ldx, K2, 6, s); break;
                case 7: tile2(wt, xm, ldx, K2, 7, s); break;
                default: tile2(wt, xm, ldx, K2, 8, s); break;
                }
                for (i64 m = 0; m < mb; m++)
                    for (i64 i = 0; i < 2; i++)
                        store16(s[2 * m + i], bias, (t + i) * 16, N - (t + i) * 16, out, (m0 + m) * ldo, dt);
            }
        }
    if (M <= 4)
        for (; t + 4 <= t1; t += 4) {
            const uint16_t *wt = wp + t * K2 * 32;
            switch (M) {
            case 1: tile4(wt, x, ldx, K2, 1, s); break;
            case 2: tile4(wt, x, ldx, K2, 2, s); break;
            case 3: tile4(wt, x, ldx, K2, 3, s); break;
            default: tile4(wt, x, ldx, K2, 4, s); break;
            }
            for (i64 m = 0; m < M; m++)
                for (i64 i = 0; i < 4; i++)
                    store16(s[4 * m + i], bias, (t + i) * 16, N - (t + i) * 16, out, m * ldo, dt);
        }
    for (; t < t1; t++) {
        const uint16_t *wt = wp + t * K2 * 32;
        for (i64 m0 = 0; m0 < M; m0 += 4) {
            const i64 mb = M - m0 < 4 ? M - m0 : 4;
            const uint16_t *xm = x + m0 * ldx;
            switch (mb) {
            case 1: tile1(wt, xm, ldx, K2, 1, s); break;
            case 2: tile1(wt, xm, ldx, K2, 2, s); break;
            case 3: tile1(wt, xm, ldx, K2, 3, s); break;
            default: tile1(wt, xm, ldx, K2, 4, s); break;
            }
            for (i64 m = 0; m < mb; m++) store16(s[m], bias, t * 16, N - t * 16, out, (m0 + m) * ldo, dt);
        }
    }
}
#endif

extern int gb_bf16_amx_on; /* cpu_bf16_amx.c: the same tiles on AMX, every M, when on */
void gb_tiles_amx(const uint16_t *x, i64 M, i64 K, i64 ldx, const uint16_t *wp, const float *bias, i64 N, i64 t0,
                  i64 t1, void *out, i64 ldo, int dt);

static void linear(const uint16_t *x, i64 M, i64 K, i64 ldx, const uint16_t *wp, const float *bias, i64 N,
                   void *out, i64 ldo, int dt, int threads, int generic) {
    const i64 tiles = (N + 15) / 16;
    void (*run)(const uint16_t *, i64, i64, i64, const uint16_t *, const float *, i64, i64, i64, void *, i64,
                int) = tiles_generic;
#ifdef GB_BF16DP
    if (!generic) run = gb_bf16_amx_on ? gb_tiles_amx : tiles_dp;
#endif
    (void)generic;
    if (threads <= 1 || tiles < 2 || N * K * (M < 4 ? M : 4) < (1 << 16)) {
        run(x, M, K, ldx, wp, bias, N, 0, tiles, out, ldo, dt);
        return;
    }
#pragma omp parallel num_threads(threads)
    { /* each thread one contiguous run of tile pairs: one sequential stream */
        const i64 nt = omp_get_num_threads(), id = omp_get_thread_num(), pairs = (tiles + 1) / 2;
        const i64 a = 2 * (pairs * id / nt), b = 2 * (pairs * (id + 1) / nt);
        run(x, M, K, ldx, wp, bias, N, a, b < tiles ? b : tiles, out, ldo, dt);
    }
}

/* out (M x N, row stride ldo; dt 1 bf16, 0 float32) = x (M x K bf16, row stride ldx) W^T + bias (float32 or
 * NULL); W in the tiled layout (ceil(N / 16), K / 2, 16, 2), K even, rows past N zero. */
void gb_linear_bf16t(const uint16_t *x, i64 M, i64 K, i64 ldx, const uint16_t *wp, const float *bias, i64 N,
                     void *out, i64 ldo, int dt, int threads) {
    linear(x, M, K, ldx, wp, bias, N, out, ldo, dt, threads, 0);
}

void gb_linear_bf16t_generic(const uint16_t *x, i64 M, i64 K, i64 ldx, const uint16_t *wp, const float *bias,
                             i64 N, void *out, i64 ldo, int dt, int threads) {
    linear(x, M, K, ldx, wp, bias, N, out, ldo, dt, threads, 1);
}

/* 1 where gb_linear_bf16t runs the AVX-512 BF16 path (else it is the plain loop, slower than oneDNN). */
int gb_bf16_dot_native(void) {
#ifdef GB_BF16DP
    return 1;
#else
    return 0;
#endif
}
