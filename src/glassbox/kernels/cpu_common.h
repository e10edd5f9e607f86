/* Helpers shared by glassbox's CPU kernels (cpu_kernels.c, cpu_softmax.c, cpu_kv8.c): storage dtypes
 * (dt == 0 float32, dt == 1 bfloat16) and the float32 arithmetic they all use. */
#ifndef GB_CPU_COMMON_H
#define GB_CPU_COMMON_H
#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

typedef int64_t i64;

static inline float bf2f(uint16_t h) {
    uint32_t u = (uint32_t)h << 16;
    float f;
    memcpy(&f, &u, 4);
    return f;
}

static inline uint16_t f2bf(float f) { /* round to nearest even, NaN kept quiet */
    uint32_t u;
    memcpy(&u, &f, 4);
    if ((u & 0x7fffffffu) > 0x7f800000u) return (uint16_t)((u >> 16) | 0x40u);
    u += 0x7fffu + ((u >> 16) & 1u);
    return (uint16_t)(u >> 16);
}

static inline void load_row(const void *p, float *dst, i64 n, int dt) {
    if (dt) {
        const uint16_t *s = (const uint16_t *)p;
        for (i64 i = 0; i < n; i++) dst[i] = bf2f(s[i]);
    } else {
        memcpy(dst, p, (size_t)n * 4);
    }
}

static inline void store_row(void *p, const float *src, i64 n, int dt) {
    if (dt) {
        uint16_t *d = (uint16_t *)p;
        for (i64 i = 0; i < n; i++) d[i] = f2bf(src[i]);
    } else {
        memcpy(p, src, (size_t)n * 4);
    }
}

static inline void *at(void *p, i64 i, int dt) { return (char *)p + i * (dt ? 2 : 4); }
static inline const void *cat_(const void *p, i64 i, int dt) { return (const char *)p + i * (dt ? 2 : 4); }

static inline float dot(const float *a, const float *b, i64 n) {
    float s = 0.0f;
#pragma omp simd reduction(+ : s)
    for (i64 i = 0; i < n; i++) s += a[i] * b[i];
    return s;
}

/* exp(x) to about 1 ulp, written so that loops of it vectorize (libm's expf does not without
 * -ffast-math): 2^n * e^r with |r| <= ln2/2 and a degree-7 Taylor polynomial. x is clamped to
 * [-87, 88] (NaN stays NaN): exp(-inf) gives ~1e-38 instead of 0, which no softmax or sigmoid here can
 * tell apart. */
static inline float exp_f(float x) {
    x = x < -87.0f ? -87.0f : x; /* ternaries, not fminf/fmaxf: those keep gcc from vectorizing */
    x = x > 88.0f ? 88.0f : x;
    const float n = (x * 1.44269504088896341f + 12582912.0f) - 12582912.0f; /* round to nearest: 1.5 * 2^23 */
    const float r = (x - n * 0.693145751953125f) - n * 1.42860682030941723e-6f;
    float p = 1.0f / 5040.0f;
    p = p * r + 1.0f / 720.0f;
    p = p * r + 1.0f / 120.0f;
    p = p * r + 1.0f / 24.0f;
    p = p * r + 1.0f / 6.0f;
    p = p * r + 0.5f;
    p = p * r + 1.0f;
    p = p * r + 1.0f;
    const uint32_t bits = (uint32_t)((int32_t)n + 127) << 23;
    float scale;
    memcpy(&scale, &bits, 4);
    return p * scale;
}


/* Paged decode attention's online softmax (cpu_kernels.c, cpu_kv8.c), per query head j of hq: running max
 * m, sum of exps l and unnormalized output acc (d floats). With sinks (hq logits, gpt-oss), each head starts
 * as if it had seen one key of score sinks[j] and a zero value: the sink joins the denominator only. */
static inline __attribute__((always_inline)) void start_heads(i64 hq, i64 d, float acc[hq][d], float *m, float *l,
                                                              const float *sinks) {
    for (i64 j = 0; j < hq; j++) {
        m[j] = sinks ? sinks[j] : -INFINITY;
        l[j] = sinks ? 1.0f : 0.0f;
        memset(acc[j], 0, sizeof(float) * (size_t)d);
    }
}

/* One block's scores sc[j][lo..hi) in: each head's max, sum and acc rescaled to the new max, and the
 * scores turned into exp(s - max) (the weights of the block's V rows). */
static inline __attribute__((always_inline)) void softmax_block(i64 hq, i64 d, i64 bs, i64 lo, i64 hi,
                                                                float sc[hq][bs], float *m, float *l,
                                                                float acc[hq][d]) {
    for (i64 j = 0; j < hq; j++) {
        float mb = m[j];
        for (i64 p = lo; p < hi; p++) mb = sc[j][p] > mb ? sc[j][p] : mb;
        const float corr = exp_f(m[j] - mb); /* ~0 on the first block (m = -inf) */
        l[j] *= corr;
        for (i64 i = 0; i < d; i++) acc[j][i] *= corr;
        for (i64 p = lo; p < hi; p++) sc[j][p] = exp_f(sc[j][p] - mb);
        for (i64 p = lo; p < hi; p++) l[j] += sc[j][p];
        m[j] = mb;
    }
}

/* The heads' end: with part, each head's state (m, l, acc: d + 2 floats) for a later merge; else acc / l
 * stored as row sq's heads in out. */
static inline __attribute__((always_inline)) void finish_heads(i64 hq, i64 d, float acc[hq][d], const float *m,
                                                               const float *l, float *part, void *out, i64 sq,
                                                               int dt) {
    for (i64 j = 0; j < hq; j++) {
        if (part) {
            float *pj = part + j * (d + 2);
            pj[0] = m[j];
            pj[1] = l[j];
            memcpy(pj + 2, acc[j], sizeof(float) * (size_t)d);
            continue;
        }
        const float inv = 1.0f / l[j];
        for (i64 i = 0; i < d; i++) acc[j][i] *= inv;
        store_row(at(out, sq * hq * d + j * d, dt), acc[j], d, dt);
    }
}

/* How far ahead (bytes) the batch-1 GEMVs ask for their weight stream in software (_mm_prefetch): the block
 * and K-quant tiles (cpu_quant.c, cpu_kquant.c) and each of the bf16 tiles' four streams (cpu_bf16.c). The
 * hardware prefetcher alone does not run far enough ahead of kernels doing this much arithmetic per byte.
 * Measured on an Intel Xeon (2 vCPUs), a Qwen3-0.6B step's linears read from DRAM, alternating runs, one
 * thread: Q4_0 6.2-7.4 -> 10.1-11.1 GB/s, Q8_0 7.7-10.3 -> 11.9-12.5, Q4_K 6.7-7.8 -> 9.7-10.6, Q6_K
 * 7.4-7.8 -> 9.5-9.9, bf16 12.4 -> 14.1; two threads: Q4_0 11.5-13 -> 17.6-19.6, Q8_0 about even. 2 KB ahead
 * gained less, 8-16 KB no more. */
#define GB_PREFETCH_AHEAD 4096

/* One 32-value block of activations (float32 dt=0 or bf16 dt=1) starting at element k0 of x, the values
 * from `valid` on taken as 0, to int8 codes c as llama.cpp's q8 blocks: d = amax / 127 (0 for a block of
 * zeros), codes round(v / d) half away from 0. Returns d. (cpu_quant.c, cpu_kquant.c) */
static inline float q8_block(const void *x, i64 k0, i64 valid, int dt, int8_t c[32]) {
    float v[32], amax = 0.0f;
    for (int j = 0; j < 32; j++) {
        float f = 0.0f;
        if (j < valid) f = dt ? bf2f(((const uint16_t *)x)[k0 + j]) : ((const float *)x)[k0 + j];
        v[j] = f;
        const float a = f < 0 ? -f : f;
        amax = a > amax ? a : amax;
    }
    const float d = amax / 127.0f;
    const float id = d > 0.0f ? 1.0f / d : 0.0f;
    for (int j = 0; j < 32; j++) c[j] = (int8_t)(int)roundf(v[j] * id);
    return d;
}

#endif
