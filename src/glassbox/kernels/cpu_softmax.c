/* Prefill attention's native passes around the bf16 GEMMs of kernels/cpu_prefill.py: the row offsets that
 * make the second score GEMM exact near each row's maximum, and the masked softmax. */
#include "cpu_common.h"

/* Prefill attention: the visible columns of row r of a tile's scores (groups, m, cols), for the query
 * m-index i = r % m at key column q0 + i: [lo, q0 + i] with lo = q0 + i - window + 1 under a window,
 * else 0; clipped to [0, cols). */
static inline void visible(i64 r, i64 m, i64 cols, i64 q0, i64 window, i64 *lo, i64 *hi) {
    i64 h = q0 + r % m + 1, l = window > 0 ? q0 + r % m - window + 1 : 0;
    *hi = h < cols ? h : cols;
    *lo = l > 0 ? l : 0;
}

/* bf16 of a finite float, round to nearest even (no NaN check, so that loops of it vectorize). */
static inline uint16_t f2bf_finite(float f) {
    uint32_t u;
    memcpy(&u, &f, 4);
    return (uint16_t)((u + 0x7fffu + ((u >> 16) & 1u)) >> 16);
}

static inline float row_max_bf16(const uint16_t *x, i64 n) {
    float mx = -INFINITY;
#pragma omp simd reduction(max : mx)
    for (i64 j = 0; j < n; j++) {
        const float v = bf2f(x[j]);
        mx = v > mx ? v : mx;
    }
    return mx;
}

/* offsets[r * stride] <- bf16(-max of row r's visible bf16 scores): the column that, appended to the
 * queries against a row of ones under the keys, makes a second GEMM give s - max, whose top entries
 * (all that a softmax sees) then round to bf16 with little error. */
void gb_prefill_row_offsets_bf16(const uint16_t *s, i64 rows, i64 m, i64 cols, i64 q0, i64 window,
                                 uint16_t *offsets, i64 stride, int threads) {
#pragma omp parallel for schedule(static) num_threads(threads) if (rows * cols >= (1 << 15))
    for (i64 r = 0; r < rows; r++) {
        i64 lo, hi;
        visible(r, m, cols, q0, window, &lo, &hi);
        offsets[r * stride] = f2bf(hi > lo ? -row_max_bf16(s + r * cols + lo, hi - lo) : 0.0f);
    }
}

/* Prefill attention's masked softmax, in place over a tile's bf16 scores (groups, m, cols): each row's
 * visible columns (see visible()) become p = exp((s - max) * scale) / sum, in float32 stored as bf16,
 * and the rest of the row 0. With sinks (one float32 logit per query head, row r's head r / m: gpt-oss)
 * each head's sink joins its rows' sums; the scores there are s + offset (offsets[r * stride], the
 * -max column of gb_prefill_row_offsets_bf16), so the sink is measured against (max - offset) * scale. */
void gb_prefill_softmax_bf16(uint16_t *s, i64 rows, i64 m, i64 cols, i64 q0, i64 window, float scale,
                             const float *sinks, const uint16_t *offsets, i64 stride, int threads) {
#pragma omp parallel for schedule(static) num_threads(threads) if (rows * cols >= (1 << 15))
    for (i64 r = 0; r < rows; r++) {
        uint16_t *row = s + r * cols;
        i64 lo, hi;
        visible(r, m, cols, q0, window, &lo, &hi);
        if (hi <= lo) { /* sees nothing (cannot happen for a causal row, which sees itself) */
            memset(row, 0, (size_t)cols * 2);
            continue;
        }
        const i64 n = hi - lo;
        uint16_t *x = row + lo;
        float e[n];
        const float mx = row_max_bf16(x, n);
        float shift = 0.0f, sum = 0.0f; /* shift: how far a sink above every score lowers the exps */
        if (sinks) {
            const float rel = sinks[r / m] - (mx - bf2f(offsets[r * stride])) * scale;
            shift = rel > 0.0f ? rel : 0.0f;
            sum = exp_f(rel - shift);
        }
#pragma omp simd reduction(+ : sum)
        for (i64 j = 0; j < n; j++) {
            e[j] = exp_f((bf2f(x[j]) - mx) * scale - shift);
            sum += e[j];
        }
        const float inv = 1.0f / sum;
#pragma omp simd
        for (i64 j = 0; j < n; j++) x[j] = f2bf_finite(e[j] * inv);
        memset(row, 0, (size_t)lo * 2);
        memset(row + hi, 0, (size_t)(cols - hi) * 2);
    }
}
