/* The 8-bit KV cache (layers/kv_quant.py holds the same arithmetic in PyTorch ops, the reference).
 *
 * Each (token, head) row of d values is stored as d codes followed by its float32 scale s:
 * s = max|x| / 127 (int8) or max|x| / 448 (fp8 e4m3fn; 1 for an all-zero row), code = round-half-even(x / s)
 * or fp8(x / s) rounded as torch's float8_e4m3fn conversion, and x is read back as s * value(code).
 * Half the bytes of a bf16 cache (plus 4 per row), so decode attention reads half as much. */
#include "cpu_kv8.h"

static float fp8_value[256]; /* e4m3fn code -> float, filled when the library loads */

__attribute__((constructor)) static void fill_fp8_values(void) {
    for (int c = 0; c < 256; c++) {
        const int e = (c >> 3) & 15, m = c & 7;
        float v = e ? ldexpf(1.0f + (float)m / 8.0f, e - 7) : ldexpf((float)m, -9); /* subnormal: m 2^-9 */
        if (e == 15 && m == 7) v = NAN;
        fp8_value[c] = (c & 0x80) ? -v : v;
    }
}

/* float -> e4m3fn, round to nearest even; |f| >= 480 gives NaN (0x7f), as torch's conversion does. */
static inline uint8_t f2e4m3(float f) {
    uint32_t u;
    memcpy(&u, &f, 4);
    const uint32_t sign = u & 0x80000000u;
    u ^= sign;
    uint8_t r;
    if (u >= (1087u << 20)) { /* 480.0 and above, inf, NaN */
        r = 0x7f;
    } else if (u < (121u << 23)) { /* below 2^-6: subnormal, rounded by a float addition of 2^14 */
        const uint32_t magic = 141u << 23;
        float a, b;
        memcpy(&a, &u, 4);
        memcpy(&b, &magic, 4);
        a += b;
        uint32_t v;
        memcpy(&v, &a, 4);
        r = (uint8_t)(v - magic);
    } else {
        const uint32_t odd = (u >> 20) & 1u;
        u += ((uint32_t)(7 - 127) << 23) + 0x7ffffu + odd;
        r = (uint8_t)(u >> 20);
    }
    return (uint8_t)(r | (sign >> 24));
}

void kv8_store_row(uint8_t *dst, const float *x, i64 d, int kind) {
    float amax = 0.0f;
    for (i64 i = 0; i < d; i++) {
        const float a = fabsf(x[i]);
        amax = a > amax ? a : amax;
    }
    const float s = amax > 0.0f ? amax / (kind == KV8_INT8 ? 127.0f : 448.0f) : 1.0f;
    if (kind == KV8_INT8) {
        for (i64 i = 0; i < d; i++) {
            float y = nearbyintf(x[i] / s);
            y = y > 127.0f ? 127.0f : (y < -127.0f ? -127.0f : y);
            dst[i] = (uint8_t)(int8_t)y;
        }
    } else {
        for (i64 i = 0; i < d; i++) dst[i] = f2e4m3(x[i] / s);
    }
    memcpy(dst + d, &s, 4);
}

#if defined(__AVX512F__)
#include <immintrin.h>
/* 16 codes -> 16 floats: int8 widened; fp8 e4m3fn placed in a float16's bit fields (sign, exponent and
 * mantissa shifted, subnormals included), which reads as the value / 2^8 (the caller's scale takes the 2^8). */
static inline __m512 codes16(const uint8_t *p, int kind) {
    const __m128i c = _mm_loadu_si128((const __m128i *)p);
    if (kind == KV8_INT8) return _mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(c));
    const __m256i w = _mm256_cvtepu8_epi16(c);
    const __m256i mag = _mm256_slli_epi16(_mm256_and_si256(w, _mm256_set1_epi16(0x7f)), 7);
    const __m256i sign = _mm256_slli_epi16(_mm256_and_si256(w, _mm256_set1_epi16(0x80)), 8);
    return _mm512_cvtph_ps(_mm256_or_si256(mag, sign));
}
#define KV8_FP8_SHIFT 256.0f
#else
#define KV8_FP8_SHIFT 1.0f
#endif

/* A row's codes as floats (unscaled, fp8 / KV8_FP8_SHIFT on the vector path); returns the scale that
 * turns them into values. */
static inline float load_codes(const uint8_t *row, float *dst, i64 d, int kind) {
    float s;
    memcpy(&s, row + d, 4);
#if defined(__AVX512F__)
    if (d % 16 == 0) {
        for (i64 i = 0; i < d; i += 16) _mm512_storeu_ps(dst + i, codes16(row + i, kind));
        return kind == KV8_INT8 ? s : s * KV8_FP8_SHIFT;
    }
#endif
    if (kind == KV8_INT8) {
        for (i64 i = 0; i < d; i++) dst[i] = (float)(int8_t)row[i];
    } else {
        for (i64 i = 0; i < d; i++) dst[i] = fp8_value[row[i]];
    }
    return s;
}

/* cpu_kernels.c's attend with K/V rows of codes: the online softmax in float32 over blocks, q . code scaled
 * by the key's scale, each V row's codes widened once and weighted by p times its scale. Inlined into
 * copies for the common head sizes (loops of known length unroll and keep their sums in registers). */
static inline __attribute__((always_inline)) void attend8(const void *qkv, i64 q_stride, const uint8_t *kc,
                                                          const uint8_t *vc, const i64 *table, i64 t0, i64 t1,
                                                          i64 sq, i64 hq, i64 hk, i64 d, i64 bs, float scale,
                                                          const float *sinks, void *out, float *part, int dt,
                                                          int kind) {
    const i64 g = hq / hk, rb = d + KV8_SCALE_BYTES;
    float acc[hq][d], qf[hq][d], sc[hq][bs], m[hq], l[hq], row[d];
    start_heads(hq, d, acc, m, l, sinks);
    for (i64 j = 0; j < hq; j++) load_row(cat_(qkv, sq * q_stride + j * d, dt), qf[j], d, dt);
    for (i64 b = t0 / bs; b * bs < t1; b++) {
        const i64 blk = table[b];
        const i64 lo = t0 > b * bs ? t0 - b * bs : 0;
        const i64 hi = t1 < (b + 1) * bs ? t1 - b * bs : bs;
        for (i64 p = lo; p < hi; p++)
            for (i64 h = 0; h < hk; h++) {
                const float ks = load_codes(kc + ((blk * bs + p) * hk + h) * rb, row, d, kind) * scale;
                for (i64 j = h * g; j < (h + 1) * g; j++) sc[j][p] = dot(qf[j], row, d) * ks;
            }
        softmax_block(hq, d, bs, lo, hi, sc, m, l, acc);
        for (i64 p = lo; p < hi; p++)
            for (i64 h = 0; h < hk; h++) {
                const float vs = load_codes(vc + ((blk * bs + p) * hk + h) * rb, row, d, kind);
                for (i64 j = h * g; j < (h + 1) * g; j++) {
                    const float w = sc[j][p] * vs;
                    for (i64 i = 0; i < d; i++) acc[j][i] += w * row[i];
                }
            }
    }
    finish_heads(hq, d, acc, m, l, part, out, sq, dt);
}

void kv8_attend(const void *qkv, i64 q_stride, const void *k_cache, const void *v_cache, const i64 *table, i64 t0,
                i64 t1, i64 sq, i64 hq, i64 hk, i64 d, i64 bs, float scale, const float *sinks, void *out,
                float *part, int dt, int kind) {
    const uint8_t *kc = (const uint8_t *)k_cache, *vc = (const uint8_t *)v_cache;
    if (d == 64)
        attend8(qkv, q_stride, kc, vc, table, t0, t1, sq, hq, hk, 64, bs, scale, sinks, out, part, dt, kind);
    else if (d == 128)
        attend8(qkv, q_stride, kc, vc, table, t0, t1, sq, hq, hk, 128, bs, scale, sinks, out, part, dt, kind);
    else
        attend8(qkv, q_stride, kc, vc, table, t0, t1, sq, hq, hk, d, bs, scale, sinks, out, part, dt, kind);
}
