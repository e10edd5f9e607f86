/* GGUF K-quant weights dequantized (quant/blocks/kquant.py's prefill rows and float32 models), rounded once to the
 * output dtype: equal to GGML's dequantization bit for bit. The layout is cpu_kquant.c's. */
#include "cpu_kquant.h"

#ifdef GB_VNNI
static inline __m128i lane128(__m512i v, int i) {
    switch (i) {
    case 0: return _mm512_extracti32x4_epi32(v, 0);
    case 1: return _mm512_extracti32x4_epi32(v, 1);
    case 2: return _mm512_extracti32x4_epi32(v, 2);
    default: return _mm512_extracti32x4_epi32(v, 3);
    }
}

/* One super-block dequantized into out (256 values, dt 0 float32 / 1 bf16): the byte vectors transposed
 * back to value order (4 x 4 dwords per 128-bit lane), then 16 values of one lane at a time. */
static void dequant_sb(const uint8_t *rec, const uint8_t *mt, int kind, void *out, int dt) {
    __m512i V[4];
    unpack_sb(rec, kind, V);
    const __m512i t0 = _mm512_unpacklo_epi32(V[0], V[1]), t1 = _mm512_unpackhi_epi32(V[0], V[1]);
    const __m512i t2 = _mm512_unpacklo_epi32(V[2], V[3]), t3 = _mm512_unpackhi_epi32(V[2], V[3]);
    const __m512i u[4] = {_mm512_unpacklo_epi64(t0, t2), _mm512_unpackhi_epi64(t0, t2),
                          _mm512_unpacklo_epi64(t1, t3), _mm512_unpackhi_epi64(t1, t3)};
    __m512 Sv, Ov;
    lane_scales(mt, kind, &Sv, &Ov);
    float s[16], o[16];
    _mm512_storeu_ps(s, Sv);
    _mm512_storeu_ps(o, Ov);
    for (int L = 0; L < 4; L++) {
        for (int i = 0; i < 4; i++) { /* 128-bit lane L of u[i]: lane j = 4 L + i's 16 codes in order */
            const int j = 4 * L + i;
            __m512 q = _mm512_cvtepi32_ps(_mm512_cvtepu8_epi32(lane128(u[i], L)));
            __m512 f;
            if (code_offset(kind)) /* (q - c) S: exact, as GGML's */
                f = _mm512_mul_ps(_mm512_sub_ps(q, _mm512_set1_ps((float)code_offset(kind))), _mm512_set1_ps(s[j]));
            else
                f = _mm512_fmadd_ps(q, _mm512_set1_ps(s[j]), _mm512_set1_ps(o[j]));
            if (dt) {
#ifdef __AVX512BF16__
                _mm256_storeu_si256((__m256i *)((uint16_t *)out + 16 * j), (__m256i)_mm512_cvtneps_pbh(f));
#else
                float tmp[16];
                _mm512_storeu_ps(tmp, f);
                for (int t = 0; t < 16; t++) ((uint16_t *)out)[16 * j + t] = f2bf(tmp[t]);
#endif
            } else {
                _mm512_storeu_ps((float *)out + 16 * j, f);
            }
        }
    }
}
#endif

/* W (N x K, rows in tiles of 16: kq_at) dequantized, rounded once to the dtype (dt 0 float32 / 1 bf16). ``generic``: plain C alone. */
void gb_dequant_kquant(const uint8_t *codes, const uint8_t *meta, int kind, i64 N, i64 K, void *out, int dt,
                       int threads, int generic) {
    const i64 nsb = K / SB, cb = code_bytes(kind), mb = meta_bytes(kind);
    (void)generic;
#pragma omp parallel for schedule(static) num_threads(threads) if (N * K >= (1 << 16))
    for (i64 n = 0; n < N; n++) {
        const i64 n1 = (n / TILE + 1) * TILE, next = N - n1 < TILE ? N - n1 : TILE; /* the next tile's rows */
        if (next > 0) { /* a sixteenth of the next tile per row (cpu_quant.h prefetch_part) */
            prefetch_part(codes + n1 * nsb * cb, next * nsb * cb, n % TILE);
            prefetch_part(meta + n1 * nsb * mb, next * nsb * mb, n % TILE);
        }
        const kq_row row = kq_row_at(codes, meta, kind, N, nsb, n);
        for (i64 sb = 0; sb < nsb; sb++) {
            const uint8_t *rec = kq_codes(&row, sb, cb), *mt = kq_meta(&row, sb, mb);
            const i64 at0 = n * K + sb * SB;
#ifdef GB_VNNI
            if (!generic) {
                dequant_sb(rec, mt, kind, (char *)out + at0 * (dt ? 2 : 4), dt);
                continue;
            }
#endif
            for (i64 r = 0; r < SB; r++) {
                float S, O;
                lane_scale(mt, kind, r / 16, &S, &O);
                const int q = code_of(rec, kind, r);
                store_out(out, at0 + r, code_offset(kind) ? S * (float)(q - code_offset(kind)) : S * (float)q + O, dt);
            }
        }
    }
}
