/* The K-quant layout's helpers, shared by cpu_kquant.c (activations, GEMV) and cpu_kquant_dequant.c (the
 * dequantization). The layout is described in cpu_kquant.c. */
#ifndef GB_CPU_KQUANT_H
#define GB_CPU_KQUANT_H
#include "cpu_quant.h"

#define SB 256 /* values per super-block */
#define LANES 16 /* 16-value lanes per super-block */

/* kind: 4, 5, 6 Q4_K, Q5_K, Q6_K; 2, 3, 12 Q2_K, Q3_K, IQ4_XS (quant/blocks/kquant_low.py has their records) */
static inline i64 code_bytes(int kind) {
    return kind == 2 ? 64 : kind == 3 ? 96 : kind == 5 ? 160 : kind == 6 ? 192 : 128;
}
static inline i64 meta_bytes(int kind) { return kind == 2 ? 20 : kind == 3 ? 14 : kind == 12 ? 8 : kind == 6 ? 18 : 16; }
/* Super-blocks per GEMV step: Q4_K/Q5_K two (their sub-blocks of 32 fill a vector), the others one. */
static inline i64 kq_step(int kind) { return kind == 4 || kind == 5 ? 2 : 1; }
/* c in W = S (q - c) + O: the codes' offset (Q6_K 32, Q3_K 4, IQ4_XS 128: its table's values + 128). */
static inline int code_offset(int kind) { return kind == 6 ? 32 : kind == 3 ? 4 : kind == 12 ? 128 : 0; }
static const int8_t IQ4_XS_VALUES[16] = {-127, -104, -83, -65, -49, -35, -22, -10, 1, 13, 25, 38, 53, 69, 89, 113};

/* Super-block sb of row n (of N rows of nsb) in the tiled codes or meta (``bytes`` per super-block): tiles
 * of 16 rows (cpu_quant.h tiled_index) whose segments are one GEMV step, Q4_K/Q5_K two super-blocks, Q6_K
 * one; with an odd count, Q4_K/Q5_K's last super-block follows the pairs, row after row. */
static inline i64 kq_at(i64 n, i64 sb, i64 N, i64 nsb, i64 bytes, int kind) {
    const i64 step = kq_step(kind);
    return tiled_index(n, sb * bytes, N, nsb * bytes, step * bytes, nsb / step * step * bytes);
}

/* One row's super-blocks in the tiles, found without a division per super-block: sb < full at
 * c + (sb / step) cstep + (sb % step) bytes (meta: m, mstep), the last one of an odd count at ct (mt). */
typedef struct {
    const uint8_t *c, *ct, *m, *mt;
    i64 cstep, mstep, full, pair;
} kq_row;

static inline kq_row kq_row_at(const uint8_t *codes, const uint8_t *meta, int kind, i64 N, i64 nsb, i64 n) {
    const i64 step = kq_step(kind), cb = code_bytes(kind), mb = meta_bytes(kind);
    const i64 R = N - n / TILE * TILE < TILE ? N - n / TILE * TILE : TILE;
    kq_row x;
    x.full = nsb / step * step;
    x.pair = step == 2;
    x.c = codes + kq_at(n, 0, N, nsb, cb, kind);
    x.m = meta + kq_at(n, 0, N, nsb, mb, kind);
    x.ct = x.full < nsb ? codes + kq_at(n, x.full, N, nsb, cb, kind) : NULL;
    x.mt = x.full < nsb ? meta + kq_at(n, x.full, N, nsb, mb, kind) : NULL;
    x.cstep = R * step * cb;
    x.mstep = R * step * mb;
    return x;
}

static inline const uint8_t *kq_codes(const kq_row *r, i64 sb, i64 cb) {
    if (sb >= r->full) return r->ct;
    return r->pair ? r->c + (sb >> 1) * r->cstep + (sb & 1) * cb : r->c + sb * r->cstep;
}

static inline const uint8_t *kq_meta(const kq_row *r, i64 sb, i64 mb) {
    if (sb >= r->full) return r->mt;
    return r->pair ? r->m + (sb >> 1) * r->mstep + (sb & 1) * mb : r->m + sb * r->mstep;
}

/* Where value r (0..255) of a super-block sits in the lane order: byte 64 p + 4 j + t. */
static inline i64 lane_pos(i64 r) {
    const i64 j = r / 16, w = r % 16;
    return (w / 4) * 64 + 4 * j + w % 4;
}

static inline int code_of(const uint8_t *rec, int kind, i64 r) {
    const i64 pos = lane_pos(r), p = pos / 64, i = pos % 64;
    if (kind == 2 || kind == 3) { /* 2 bits of byte i (bits 2p), Q3_K's third from mask p */
        const int q = (rec[i] >> (2 * p)) & 3;
        return kind == 2 ? q : q | (((rec[64 + p * 8 + i / 8] >> (i % 8)) & 1) << 2);
    }
    int q = (rec[(p / 2) * 64 + i] >> (4 * (p % 2))) & 15;
    if (kind == 12) return IQ4_XS_VALUES[q] + 128;
    if (kind == 5) q |= ((rec[128 + p * 8 + i / 8] >> (i % 8)) & 1) << 4;
    if (kind == 6) {
        q |= ((rec[128 + 2 * p * 8 + i / 8] >> (i % 8)) & 1) << 4;
        q |= ((rec[128 + (2 * p + 1) * 8 + i / 8] >> (i % 8)) & 1) << 5;
    }
    return q;
}

static inline float half_at(const uint8_t *p) {
    uint16_t h;
    memcpy(&h, p, 2);
    return h2f(h);
}

/* Sub-block s's 6-bit scale and min from Q4_K/Q5_K's 12 bytes (a = bytes 0-3, b = 4-7, c = 8-11):
 * s < 4: the low 6 bits of a[s] and b[s]; s >= 4: the nibbles of c[s-4] below the top 2 bits of a[s-4], b[s-4]. */
static inline void scale_min(const uint8_t *p, i64 s, int *sc, int *m) {
    if (s < 4) {
        *sc = p[s] & 63;
        *m = p[4 + s] & 63;
    } else {
        *sc = (p[8 + s - 4] & 15) | ((p[s - 4] >> 6) << 4);
        *m = (p[8 + s - 4] >> 4) | ((p[4 + s - 4] >> 6) << 4);
    }
}

/* Lane j's scale S and offset O (O = 0 where the codes are offset instead: code_offset). */
static inline void lane_scale(const uint8_t *mt, int kind, i64 j, float *S, float *O) {
    *O = 0.0f;
    if (kind == 2) { /* byte j: low nibble the scale, high the min */
        *S = half_at(mt + 16) * (float)(mt[j] & 15);
        *O = -(half_at(mt + 18) * (float)(mt[j] >> 4));
        return;
    }
    if (kind == 3) { /* 6 bits: the low nibble in byte j % 8 (high nibble for j >= 8), the top 2 in byte 8 + j % 4 */
        const int sc = ((mt[j % 8] >> (4 * (j / 8))) & 15) | (((mt[8 + j % 4] >> (2 * (j / 4))) & 3) << 4);
        *S = half_at(mt + 12) * (float)(sc - 32);
        return;
    }
    if (kind == 12) { /* sub-block s = j / 2: its low nibble in byte 4 + s / 2, its top 2 bits at 2 s of the uint16 */
        const i64 s = j / 2;
        const int ls = ((mt[4 + s / 2] >> (4 * (s % 2))) & 15) | ((((mt[2] | (mt[3] << 8)) >> (2 * s)) & 3) << 4);
        *S = half_at(mt) * (float)(ls - 32);
        return;
    }
    if (kind == 6) {
        *S = half_at(mt + 16) * (float)(int8_t)mt[j];
        *O = 0.0f;
        return;
    }
    int sc, m;
    scale_min(mt + 4, j / 2, &sc, &m);
    *S = half_at(mt) * (float)sc;
    *O = -(half_at(mt + 2) * (float)m);
}

#ifdef GB_VNNI
/* One super-block's codes as the 4 byte vectors V0..V3 (lane order), unsigned (IQ4_XS: its values + 128). */
static inline __attribute__((always_inline)) void unpack_sb(const uint8_t *rec, int kind, __m512i V[4]) {
    if (kind == 2 || kind == 3) {
        const __m512i x = _mm512_loadu_si512((const void *)rec), m3 = _mm512_set1_epi8(3);
        V[0] = _mm512_and_si512(x, m3);
        V[1] = _mm512_and_si512(_mm512_srli_epi16(x, 2), m3);
        V[2] = _mm512_and_si512(_mm512_srli_epi16(x, 4), m3);
        V[3] = _mm512_and_si512(_mm512_srli_epi16(x, 6), m3);
        if (kind == 3)
            for (int p = 0; p < 4; p++) {
                uint64_t bits;
                memcpy(&bits, rec + 64 + 8 * p, 8);
                V[p] = _mm512_mask_add_epi8(V[p], _cvtu64_mask64(bits), V[p], _mm512_set1_epi8(4));
            }
        return;
    }
    const __m512i m15 = _mm512_set1_epi8(15);
    const __m512i n0 = _mm512_loadu_si512((const void *)rec), n1 = _mm512_loadu_si512((const void *)(rec + 64));
    V[0] = _mm512_and_si512(n0, m15);
    V[1] = _mm512_and_si512(_mm512_srli_epi16(n0, 4), m15);
    V[2] = _mm512_and_si512(n1, m15);
    V[3] = _mm512_and_si512(_mm512_srli_epi16(n1, 4), m15);
    if (kind == 12) {
        const __m128i t = _mm_add_epi8(_mm_loadu_si128((const __m128i *)IQ4_XS_VALUES), _mm_set1_epi8(-128));
        for (int p = 0; p < 4; p++) V[p] = _mm512_shuffle_epi8(_mm512_broadcast_i32x4(t), V[p]);
        return;
    }
    if (kind == 4) return;
    const __m512i b4 = _mm512_set1_epi8(16), b5 = _mm512_set1_epi8(32);
    for (int p = 0; p < 4; p++) {
        uint64_t bits;
        if (kind == 5) {
            memcpy(&bits, rec + 128 + 8 * p, 8);
            V[p] = _mm512_mask_add_epi8(V[p], _cvtu64_mask64(bits), V[p], b4);
        } else {
            memcpy(&bits, rec + 128 + 16 * p, 8);
            V[p] = _mm512_mask_add_epi8(V[p], _cvtu64_mask64(bits), V[p], b4);
            memcpy(&bits, rec + 136 + 16 * p, 8);
            V[p] = _mm512_mask_add_epi8(V[p], _cvtu64_mask64(bits), V[p], b5);
        }
    }
}

/* The 16 lanes' scales S and offsets O of one super-block (see lane_scale). */
static inline __attribute__((always_inline)) void lane_scales(const uint8_t *mt, int kind, __m512 *S, __m512 *O) {
    uint16_t h;
    if (kind == 2 || kind == 3 || kind == 12) { /* lane by lane */
        float s[16], o[16];
        for (int j = 0; j < 16; j++) lane_scale(mt, kind, j, s + j, o + j);
        *S = _mm512_loadu_ps(s);
        *O = _mm512_loadu_ps(o);
        return;
    }
    if (kind == 6) {
        memcpy(&h, mt + 16, 2);
        const __m128i sc = _mm_loadu_si128((const __m128i *)mt);
        *S = _mm512_mul_ps(_mm512_set1_ps(_cvtsh_ss(h)), _mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(sc)));
        *O = _mm512_setzero_ps();
        return;
    }
    /* the 16 meta bytes: d, dmin, a (4-7), b (8-11), c (12-15); scale_min for all 8 sub-blocks at once */
    const __m128i x = _mm_loadu_si128((const __m128i *)mt);
    const __m128i p1 = _mm_shuffle_epi8(x, _mm_setr_epi8(4, 5, 6, 7, 12, 13, 14, 15, 8, 9, 10, 11, 12, 13, 14, 15));
    const __m128i p2 = _mm_shuffle_epi8(x, _mm_setr_epi8(-1, -1, -1, -1, 4, 5, 6, 7, -1, -1, -1, -1, 8, 9, 10, 11));
    const __m128i low = _mm_or_si128(
        _mm_and_si128(p1, _mm_setr_epi8(63, 63, 63, 63, 15, 15, 15, 15, 63, 63, 63, 63, 0, 0, 0, 0)),
        _mm_and_si128(_mm_srli_epi16(p1, 4), _mm_setr_epi8(0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 15, 15, 15, 15)));
    const __m128i top = _mm_and_si128(_mm_srli_epi16(p2, 2), _mm_setr_epi8(0, 0, 0, 0, 48, 48, 48, 48, 0, 0, 0, 0, 48, 48, 48, 48));
    const __m128i sm = _mm_or_si128(low, top); /* sc 0..7, m 0..7 */
    memcpy(&h, mt, 2);
    const __m512 d = _mm512_set1_ps(_cvtsh_ss(h));
    memcpy(&h, mt + 2, 2);
    const __m512 ndmin = _mm512_set1_ps(-_cvtsh_ss(h));
    *S = _mm512_mul_ps(d, _mm512_cvtepi32_ps(_mm512_cvtepu8_epi32(_mm_unpacklo_epi8(sm, sm))));
    *O = _mm512_mul_ps(ndmin, _mm512_cvtepi32_ps(_mm512_cvtepu8_epi32(_mm_unpackhi_epi8(sm, sm))));
}

/* Q4_K/Q5_K: the scales S and offsets O of the 16 sub-blocks of two super-blocks (their meta records at mt
 * and mt + 16; ``two``: whether the second exists, else its lanes are 0), as lane_scales does for one. */
static inline void pair_scales(const uint8_t *mt, int two, __m512 *S, __m512 *O) {
    const __m256i x = _mm256_maskz_loadu_epi8(two ? 0xFFFFFFFFu : 0xFFFFu, mt);
    const __m256i p1 = _mm256_shuffle_epi8(x, _mm256_setr_epi8(4, 5, 6, 7, 12, 13, 14, 15, 8, 9, 10, 11, 12, 13, 14, 15,
                                                               4, 5, 6, 7, 12, 13, 14, 15, 8, 9, 10, 11, 12, 13, 14, 15));
    const __m256i p2 = _mm256_shuffle_epi8(x, _mm256_setr_epi8(-1, -1, -1, -1, 4, 5, 6, 7, -1, -1, -1, -1, 8, 9, 10, 11,
                                                               -1, -1, -1, -1, 4, 5, 6, 7, -1, -1, -1, -1, 8, 9, 10, 11));
    const __m256i low = _mm256_or_si256(
        _mm256_and_si256(p1, _mm256_setr_epi8(63, 63, 63, 63, 15, 15, 15, 15, 63, 63, 63, 63, 0, 0, 0, 0,
                                              63, 63, 63, 63, 15, 15, 15, 15, 63, 63, 63, 63, 0, 0, 0, 0)),
        _mm256_and_si256(_mm256_srli_epi16(p1, 4), _mm256_setr_epi8(0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 15, 15, 15, 15,
                                                                    0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 15, 15, 15, 15)));
    const __m256i top = _mm256_and_si256(_mm256_srli_epi16(p2, 2),
                                         _mm256_setr_epi8(0, 0, 0, 0, 48, 48, 48, 48, 0, 0, 0, 0, 48, 48, 48, 48,
                                                          0, 0, 0, 0, 48, 48, 48, 48, 0, 0, 0, 0, 48, 48, 48, 48));
    /* per record (128-bit lane): sc 0..7, m 0..7; then the first's sc, the second's sc, the mins likewise */
    const __m256i sm = _mm256_permute4x64_epi64(_mm256_or_si256(low, top), 0xD8);
    const __m512 sc = _mm512_cvtepi32_ps(_mm512_cvtepu8_epi32(_mm256_castsi256_si128(sm)));
    const __m512 mn = _mm512_cvtepi32_ps(_mm512_cvtepu8_epi32(_mm256_extracti128_si256(sm, 1)));
    const __m256i dd = _mm256_shuffle_epi8(x, _mm256_setr_epi8(0, 1, 0, 1, 0, 1, 0, 1, 0, 1, 0, 1, 0, 1, 0, 1,
                                                               0, 1, 0, 1, 0, 1, 0, 1, 0, 1, 0, 1, 0, 1, 0, 1));
    const __m256i dm = _mm256_shuffle_epi8(x, _mm256_setr_epi8(2, 3, 2, 3, 2, 3, 2, 3, 2, 3, 2, 3, 2, 3, 2, 3,
                                                               2, 3, 2, 3, 2, 3, 2, 3, 2, 3, 2, 3, 2, 3, 2, 3));
    *S = _mm512_mul_ps(_mm512_cvtph_ps(dd), sc);
    *O = _mm512_sub_ps(_mm512_setzero_ps(), _mm512_mul_ps(_mm512_cvtph_ps(dm), mn));
}
#endif

#endif
