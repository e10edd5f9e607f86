/* Shared by cpu_quant.c (the block GEMV) and cpu_dequant.c: the block layout's helpers (see cpu_quant.c). */
#ifndef GB_CPU_QUANT_H
#define GB_CPU_QUANT_H
#include "cpu_common.h"
#if defined(__AVX512F__) && defined(__AVX512BW__) && defined(__AVX512VNNI__)
#include <immintrin.h>
#define GB_VNNI 1
#endif

static inline float h2f(uint16_t h) { /* IEEE half to float, exact */
    const uint32_t sign = (uint32_t)(h & 0x8000u) << 16;
    uint32_t exp = (h >> 10) & 0x1fu, man = h & 0x3ffu, u;
    if (exp == 0x1fu) {
        u = sign | 0x7f800000u | (man << 13);
    } else if (exp != 0) {
        u = sign | ((exp + 112u) << 23) | (man << 13);
    } else if (man == 0) {
        u = sign;
    } else { /* subnormal half: normalize */
        exp = 113u;
        while (!(man & 0x400u)) {
            man <<= 1;
            exp--;
        }
        u = sign | (exp << 23) | ((man & 0x3ffu) << 13);
    }
    float f;
    memcpy(&f, &u, 4);
    return f;
}

#define CHUNK 16 /* blocks per interleaved chunk: 512 codes */

/* Where code k of a row lives (see the layout above): its byte, times 2 plus the nibble (1: high) for 4 bits. */
static inline i64 code_index(i64 k, i64 Kp, int bits) {
    const i64 b = k / 32, pos = k % 32, chunks = Kp / 32 / CHUNK;
    if (b < chunks * CHUNK) {
        const i64 ch = b / CHUNK, j = b % CHUNK, p = pos / 4, t = pos % 4;
        if (bits == 8) return ch * 512 + p * 64 + j * 4 + t;
        return 2 * (ch * 256 + (p % 4) * 64 + j * 4 + t) + p / 4;
    }
    if (bits == 8) return k;
    const i64 tail = k - chunks * CHUNK * 32;
    return 2 * (chunks * 256 + (tail / 64) * 32 + (tail % 32)) + (tail % 64) / 32;
}

static inline void store_out(void *out, i64 i, float v, int dt) {
    if (dt)
        ((uint16_t *)out)[i] = f2bf(v);
    else
        ((float *)out)[i] = v;
}

static inline int code_at(const uint8_t *row, i64 k, i64 Kp, int bits) {
    if (bits == 8) return row[code_index(k, Kp, 8)];
    const i64 i = code_index(k, Kp, 4);
    return (i & 1) ? (row[i >> 1] >> 4) : (row[i >> 1] & 15);
}

/* Block b's offset o (see cpu_quant.c): stored (o), -z d for integer zero codes (z), else c d. Exact: a
 * float16 d times an integer below 256 fits float32's 24 bits. */
static inline float block_offset(const uint16_t *o, const uint8_t *z, float c, i64 b, float db) {
    return o ? h2f(o[b]) : z ? -(float)z[b] * db : c * db;
}

#ifdef GB_VNNI
/* The offsets of blocks b .. b + 15 of one row, whose scales are dv (as block_offset). */
static inline __m512 block_offsets16(const uint16_t *o, const uint8_t *z, float c, i64 b, __m512 dv) {
    if (o) return _mm512_cvtph_ps(_mm256_loadu_si256((const __m256i *)(o + b)));
    if (z) {
        const __m512 zf = _mm512_cvtepi32_ps(_mm512_cvtepu8_epi32(_mm_loadu_si128((const __m128i *)(z + b))));
        return _mm512_mul_ps(zf, _mm512_sub_ps(_mm512_setzero_ps(), dv));
    }
    return _mm512_mul_ps(dv, _mm512_set1_ps(c));
}
#endif

#endif
