/* `--quantization int4|int8|int4-asym` at load: a float weight (N x K, float32 dt=0 or bf16 dt=1) rounded into
 * 32-value blocks, the same arithmetic as quant/blocks/weights.py's PyTorch reference (`quantize_reference`), so
 * the two give the same bytes: per block, mode 0 (int4, Q4_0's rounding) d = the value of largest magnitude
 * (the first such) / -8, q = floor(w / d + 8.5) (w times 1 / d, then + 8.5, each rounded) clamped to 0..15;
 * mode 1 (int8, Q8_0's) d = max |w| / 127, q = round-half-even(w / d) + 128 clamped to 1..255; mode 2 (int4
 * asymmetric, Q4_1's) d = (max - min) / 15, q = trunc((w - min) / d + 0.5) (times 1 / d) clamped to 0..15 and
 * the min kept. Values past K are 0. Outputs, rows in order: codes (N, Kp) uint8 in value order, d (and the
 * min) (N, Kp / 32) float16 (rounded to nearest even). Rows run in parallel. */
#include "cpu_quant.h"

#include <math.h>

static inline uint16_t f2h(float f) { /* float to IEEE half, round to nearest even */
    uint32_t x;
    memcpy(&x, &f, 4);
    const uint32_t sign = (x >> 16) & 0x8000u, ax = x & 0x7fffffffu;
    if (ax >= 0x7f800000u) return (uint16_t)(sign | (ax > 0x7f800000u ? 0x7e00u : 0x7c00u));
    if (ax >= 0x477ff000u) return (uint16_t)(sign | 0x7c00u); /* 65520 and up round to infinity */
    if (ax < 0x38800000u) {                                    /* below 2^-14: a subnormal half (or zero) */
        float v;
        memcpy(&v, &ax, 4);
        return (uint16_t)(sign | (uint32_t)nearbyintf(v * 16777216.0f)); /* units of 2^-24, exact scaling */
    }
    const uint32_t e = ax - 0x38000000u; /* exponent rebiased 127 -> 15 */
    return (uint16_t)(sign | ((e + 0xfffu + ((e >> 13) & 1u)) >> 13));
}

/* Clamps and extremes as compares (vectorizable: the values are finite). */
static inline float clampf(float x, float lo, float hi) { return x < lo ? lo : x > hi ? hi : x; }

static void quantize_block(const float *v, int mode, uint8_t *q, uint16_t *d, uint16_t *m) {
    if (mode == 1) {
        float amax = 0.0f;
#pragma omp simd reduction(max : amax)
        for (int i = 0; i < 32; i++) amax = fabsf(v[i]) > amax ? fabsf(v[i]) : amax;
        const float s = amax / 127.0f;
#pragma omp simd
        for (int i = 0; i < 32; i++) {
            const float r = s > 0.0f ? nearbyintf(v[i] / s) : 0.0f;
            q[i] = (uint8_t)(int)(clampf(r, -127.0f, 127.0f) + 128.0f);
        }
        *d = f2h(s);
        return;
    }
    if (mode == 2) {
        float lo = v[0], hi = v[0];
#pragma omp simd reduction(min : lo) reduction(max : hi)
        for (int i = 0; i < 32; i++) {
            lo = v[i] < lo ? v[i] : lo;
            hi = v[i] > hi ? v[i] : hi;
        }
        const float s = (hi - lo) / 15.0f, inv = s != 0.0f ? 1.0f / s : 0.0f;
#pragma omp simd
        for (int i = 0; i < 32; i++) {
            const float t = (v[i] - lo) * inv;
            q[i] = (uint8_t)(int)clampf(truncf(t + 0.5f), 0.0f, 15.0f);
        }
        *d = f2h(s);
        *m = f2h(lo);
        return;
    }
    float amax = 0.0f;
#pragma omp simd reduction(max : amax)
    for (int i = 0; i < 32; i++) amax = fabsf(v[i]) > amax ? fabsf(v[i]) : amax;
    int first = 0; /* the first value of that magnitude: its sign is the scale's */
    while (first < 31 && fabsf(v[first]) != amax) first++;
    const float s = v[first] / -8.0f, inv = s != 0.0f ? 1.0f / s : 0.0f;
#pragma omp simd
    for (int i = 0; i < 32; i++) {
        const float t = v[i] * inv;
        q[i] = (uint8_t)(int)clampf(floorf(t + 8.5f), 0.0f, 15.0f);
    }
    *d = f2h(s);
}

void gb_quantize_blocks(const void *w, int dt, i64 N, i64 K, int mode, uint8_t *codes, uint16_t *d, uint16_t *m,
                        int threads) {
    const i64 nb = (K + 31) / 32;
#pragma omp parallel for schedule(static) num_threads(threads) if (N * K >= (1 << 16))
    for (i64 r = 0; r < N; r++) {
        float v[32];
        for (i64 b = 0; b < nb; b++) {
            const i64 k0 = b * 32, valid = K - k0 < 32 ? K - k0 : 32;
            load_row(cat_(w, r * K + k0, dt), v, valid, dt);
            for (i64 i = valid; i < 32; i++) v[i] = 0.0f;
            quantize_block(v, mode, codes + (r * nb + b) * 32, d + r * nb + b, m ? m + r * nb + b : NULL);
        }
    }
}
