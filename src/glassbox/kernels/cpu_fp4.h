/* Shared by cpu_fp4.c (activations, the GEMV) and cpu_fp4_dequant.c: the FP4 layout's helpers (see cpu_fp4.c). */
#ifndef GB_CPU_FP4_H
#define GB_CPU_FP4_H
#include "cpu_quant.h"
#if defined(GB_VNNI) && defined(__AVX512VL__)
#define GB_FP4_VEC 1
#endif

static const float FP4_VALUES[16] = {0.0f, 0.5f, 1.0f, 1.5f, 2.0f, 3.0f, 4.0f, 6.0f,
                                     -0.0f, -0.5f, -1.0f, -1.5f, -2.0f, -3.0f, -4.0f, -6.0f};
static const int8_t FP4_TWICE[16] = {0, 1, 2, 3, 4, 6, 8, 12, 0, -1, -2, -3, -4, -6, -8, -12};

static inline i64 chunk_blocks(i64 ch, i64 nb) { return nb - ch * 16 < 16 ? nb - ch * 16 : 16; }

/* Where code k of a row lives: its activation byte (8-bit order), and its weight byte * 2 + nibble. */
static inline i64 fp4_act_pos(i64 k, i64 nb) {
    const i64 b = k / 32, pos = k % 32, ch = b / 16, j = b % 16, r = chunk_blocks(ch, nb);
    return ch * 512 + (pos / 4) * r * 4 + j * 4 + pos % 4;
}

static inline i64 fp4_code_pos(i64 k, i64 nb) {
    const i64 b = k / 32, pos = k % 32, ch = b / 16, j = b % 16, r = chunk_blocks(ch, nb);
    const i64 p = pos / 4;
    return 2 * (ch * 256 + (p % 4) * r * 4 + j * 4 + pos % 4) + p / 4;
}

/* Index of half h (0: codes 0..15, 1: 16..31) of block b in NVFP4's scales and the activations' half sums. */
static inline i64 half_pos(i64 b, int h, i64 nb) {
    const i64 ch = b / 16;
    return ch * 32 + h * chunk_blocks(ch, nb) + b % 16;
}

static inline float bits_f(uint32_t u) {
    float f;
    memcpy(&f, &u, 4);
    return f;
}

/* 2^(e - 127) (e < 255): the float with exponent field e, or for e = 0 the subnormal 2^-127. */
static inline float e8m0(uint8_t e) { return bits_f(e ? (uint32_t)e << 23 : 0x00400000u); }

/* An E4M3 byte's value (no NaN here): exponent e + 120 in float32, or m 2^-9 for a subnormal (e = 0). */
static inline float e4m3(uint8_t x) {
    const uint32_t e = (x >> 3) & 15, m = x & 7;
    const float v = e ? bits_f(((e + 120) << 23) | (m << 20)) : (float)m * 0x1p-9f;
    return (x & 0x80) ? -v : v;
}

/* Block b's scales for its two halves (MXFP4: the same for both), g not applied. */
static inline void block_scales(const uint8_t *s, int kind, i64 b, i64 nb, float *lo, float *hi) {
    if (kind == 0) {
        *lo = *hi = e8m0(s[b]);
    } else {
        *lo = e4m3(s[half_pos(b, 0, nb)]);
        *hi = e4m3(s[half_pos(b, 1, nb)]);
    }
}

#endif
