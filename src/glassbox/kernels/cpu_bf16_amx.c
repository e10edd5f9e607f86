/* bf16 linears on AMX tiles, over the same weight layout as cpu_bf16.c: out (M x N) = x (M x K) W^T + bias.
 *
 * The layout (N/16, K/2, 16, 2) holds, for each tile of 16 output rows, the K values in pairs, one 64-byte line
 * per pair: 16 consecutive lines are exactly an AMX B tile of 16 pairs x 16 columns (bf16, stride 64). So the
 * tile multiply reads the weights where they lie: per group of up to 4 output tiles and 16 activation rows,
 * C (16 x 16 float32 each, tmm0-3) += A (rows x 32 bf16, tmm4) . B (16 pairs x 16, tmm5/6) over K in steps of
 * 32, the weights streamed once per group and re-read from L2 for the next 16 rows.
 *
 * AVX-512 BF16 dot products reach ~65 GFLOP/s a thread on this project's Xeon, so a decode step of 16 rows is
 * bound by them, not by the weight stream; the tile multiply does 16 x 16 x 32 products per instruction.
 *
 * Bits: TDPBF16PS adds, for each output, each pair's two exact float32 products in pair order, k after k, with
 * round-to-nearest-even and denormals flushed; nothing in an output depends on the other rows of the tile or
 * on the thread count, and every M (1 included) runs here while AMX is on, so a row alone gets the bits it
 * gets in any batch. A K not a multiple of 32 ends on a zero-padded copy of the last pairs (0 x 0 adds +0).
 * The bits differ from the dot-product path's (its pair order and denormals), as oneDNN's differ from both.
 *
 * Linux hands out the AMX tile state only on request (arch_prctl ARCH_REQ_XCOMP_PERM); ``gb_bf16_amx_init``
 * asks once and says whether the path is on. Without AMX in the compiler's target (an EPYC) it is never on.
 */
#include "cpu_common.h"
#include <omp.h>
#include <string.h>

int gb_bf16_amx_on = 0; /* read by cpu_bf16.c's linear */

#if defined(__AMX_TILE__) && defined(__AMX_BF16__) && defined(__AVX512F__) && defined(__AVX512BF16__)
#include <immintrin.h>
#include <sys/syscall.h>
#include <unistd.h>

#define ARCH_REQ_XCOMP_PERM 0x1023
#define XFEATURE_XTILEDATA 18

/* GCC's tile loads and stores are asm without a memory operand: a compiler barrier keeps the scratch copies
 * written before a load and the stored sums read after a store */
#define BARRIER() __asm__ volatile("" ::: "memory")

typedef struct {
    uint8_t palette, start_row, reserved[14];
    uint16_t colsb[16];
    uint8_t rows[16];
} tile_config;

/* tmm0-3: C (rows x 16 float32); tmm4: A (rows x 32 bf16); tmm5, tmm6: B (16 pairs x 16 x 2 bf16) */
static void configure(i64 rows) {
    tile_config c;
    memset(&c, 0, sizeof c);
    c.palette = 1;
    for (int t = 0; t < 5; t++) {
        c.colsb[t] = 64;
        c.rows[t] = (uint8_t)rows;
    }
    for (int t = 5; t < 7; t++) {
        c.colsb[t] = 64;
        c.rows[t] = 16;
    }
    BARRIER();
    _tile_loadconfig(&c);
}

static inline void store_rows(const float *c, i64 rows, const float *bias, i64 n, i64 valid, void *out, i64 ldo,
                              i64 m0, int dt) {
    const __mmask16 mask = valid >= 16 ? (__mmask16)0xffff : (__mmask16)((1u << valid) - 1);
    const __m512 b = bias ? _mm512_maskz_loadu_ps(mask, bias + n) : _mm512_setzero_ps();
    for (i64 m = 0; m < rows; m++) {
        const __m512 s = _mm512_add_ps(_mm512_loadu_ps(c + 16 * m), b);
        const i64 at = (m0 + m) * ldo + n;
        if (dt)
            _mm256_mask_storeu_epi16((uint16_t *)out + at, mask, (__m256i)_mm512_cvtneps_pbh(s));
        else
            _mm512_mask_storeu_ps((float *)out + at, mask, s);
    }
}

/* C[J] += A . B[J] (through tmm B) for the g tiles of the group; the tile numbers are literals: GCC's tile
 * intrinsics write them into the instruction's text */
#define GROUP_STEP(J, B)                                                                                            \
    if (g > J) {                                                                                                    \
        const char *line = (const char *)(wt + (J * K2 + p) * 32);                                                  \
        for (int l = 0; l < 16; l++) _mm_prefetch(line + GB_PREFETCH_AHEAD + 64 * l, _MM_HINT_T0);                  \
        _tile_loadd(B, line, 64);                                                                                   \
        _tile_dpbf16ps(J, 4, B);                                                                                    \
    }

static void group(const uint16_t *x, i64 rows, i64 ldx, const uint16_t *wt, i64 K2, int g, float *c) {
    const i64 full = K2 / 16 * 16;
    _tile_zero(0);
    _tile_zero(1);
    _tile_zero(2);
    _tile_zero(3);
    for (i64 p = 0; p < full; p += 16) {
        _tile_loadd(4, x + 2 * p, ldx * 2);
        GROUP_STEP(0, 5)
        GROUP_STEP(1, 6)
        GROUP_STEP(2, 5)
        GROUP_STEP(3, 6)
    }
    if (full < K2) { /* the last K2 - full pairs, zero-padded to a whole step */
        const i64 left = K2 - full;
        uint16_t a[16 * 32] __attribute__((aligned(64)));
        uint16_t bt[16 * 32] __attribute__((aligned(64)));
        memset(a, 0, sizeof a);
        for (i64 m = 0; m < rows; m++) memcpy(a + 32 * m, x + m * ldx + 2 * full, (size_t)left * 4);
        BARRIER();
        _tile_loadd(4, a, 64);
        for (int j = 0; j < g; j++) {
            memset(bt, 0, sizeof bt);
            memcpy(bt, wt + (j * K2 + full) * 32, (size_t)left * 64);
            BARRIER();
            _tile_loadd(5, bt, 64);
            switch (j) {
            case 0: _tile_dpbf16ps(0, 4, 5); break;
            case 1: _tile_dpbf16ps(1, 4, 5); break;
            case 2: _tile_dpbf16ps(2, 4, 5); break;
            default: _tile_dpbf16ps(3, 4, 5); break;
            }
        }
    }
    _tile_stored(0, c, 64);
    if (g > 1) _tile_stored(1, c + 256, 64);
    if (g > 2) _tile_stored(2, c + 512, 64);
    if (g > 3) _tile_stored(3, c + 768, 64);
    BARRIER();
}

/* tiles [t0, t1) for every row: groups of 4 tiles, each against the rows 16 at a time */
void gb_tiles_amx(const uint16_t *x, i64 M, i64 K, i64 ldx, const uint16_t *wp, const float *bias, i64 N, i64 t0,
                  i64 t1, void *out, i64 ldo, int dt) {
    const i64 K2 = K / 2;
    float c[4 * 256] __attribute__((aligned(64)));
    i64 configured = 0;
    for (i64 t = t0; t < t1; t += 4) {
        const int g = (int)(t1 - t < 4 ? t1 - t : 4);
        const uint16_t *wt = wp + t * K2 * 32;
        for (i64 m0 = 0; m0 < M; m0 += 16) {
            const i64 rows = M - m0 < 16 ? M - m0 : 16;
            if (rows != configured) {
                configure(rows);
                configured = rows;
            }
            group(x + m0 * ldx, rows, ldx, wt, K2, g, c);
            for (int j = 0; j < g; j++)
                store_rows(c + 256 * j, rows, bias, (t + j) * 16, N - (t + j) * 16, out, ldo, m0, dt);
        }
    }
    _tile_release();
}

int gb_bf16_amx_init(int want) {
    gb_bf16_amx_on = want && syscall(SYS_arch_prctl, ARCH_REQ_XCOMP_PERM, XFEATURE_XTILEDATA) == 0;
    return gb_bf16_amx_on;
}
#else
void gb_tiles_amx(const uint16_t *x, i64 M, i64 K, i64 ldx, const uint16_t *wp, const float *bias, i64 N, i64 t0,
                  i64 t1, void *out, i64 ldo, int dt) {
    (void)x, (void)M, (void)K, (void)ldx, (void)wp, (void)bias, (void)N, (void)t0, (void)t1, (void)out, (void)ldo;
    (void)dt;
}

int gb_bf16_amx_init(int want) {
    (void)want;
    return gb_bf16_amx_on = 0;
}
#endif
