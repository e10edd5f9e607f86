/* 4-bit float weights dequantized (quant/fp4/weights.py's prefill rows and float32 models): value * scale,
 * rounded once to the output dtype. The layout is cpu_fp4.c's. */
#include "cpu_fp4.h"

#if defined(GB_FP4_VEC) && defined(__AVX512BF16__)
static inline __m256i bf16_rne(__m512 f) { /* float32 to bf16, nearest even, subnormals kept (no NaN here) */
    const __m512i u = _mm512_castps_si512(f);
    const __m512i lsb = _mm512_and_si512(_mm512_srli_epi32(u, 16), _mm512_set1_epi32(1));
    return _mm512_cvtepi32_epi16(_mm512_srli_epi32(_mm512_add_epi32(u, _mm512_add_epi32(lsb, _mm512_set1_epi32(0x7fff))), 16));
}

/* One row's codes dequantized into out (K values, dt 0 float32 / 1 bf16; K >= the whole chunks' codes): per
 * group of 16 code bytes (4 codes of 4 blocks) the values looked up, times each block's scale, stored as
 * 4-value runs. Blocks past K are left to the caller. */
static void dequant_row_vnni(const uint8_t *w, const uint8_t *s, float g, int kind, i64 nb, i64 K, void *out, int dt) {
    const __m512 values = _mm512_loadu_ps(FP4_VALUES);
    for (i64 ch = 0; ch * 16 < nb && (ch * 16 + chunk_blocks(ch, nb)) * 32 <= K; ch++) {
        const i64 b = ch * 16, r = chunk_blocks(ch, nb);
        float sc[2][16] = {{0}}; /* per half, per block: the scale applied to the values (times g for NVFP4) */
        int tiny = 0;            /* a scale small enough for subnormal values: bf16 rounded without the flush */
        for (i64 j = 0; j < r; j++) {
            float lo, hi;
            block_scales(s, kind, b + j, nb, &lo, &hi);
            sc[0][j] = kind == 0 ? lo : lo * g;
            sc[1][j] = kind == 0 ? hi : hi * g;
            for (int h = 0; h < 2; h++) tiny |= sc[h][j] != 0.0f && fabsf(sc[h][j]) < 0x1p-124f;
        }
        for (i64 j0 = 0; j0 < r; j0 += 4) { /* 4 blocks: 16 bytes of each group */
            const i64 nj = r - j0 < 4 ? r - j0 : 4;
            const __m512i four = _mm512_setr_epi32(0, 0, 0, 0, 1, 1, 1, 1, 2, 2, 2, 2, 3, 3, 3, 3);
            const __m512 sv[2] = {_mm512_permutexvar_ps(four, _mm512_loadu_ps(sc[0] + j0)),
                                  _mm512_permutexvar_ps(four, _mm512_loadu_ps(sc[1] + j0))};
            for (int q = 0; q < 4; q++) {
                const __m128i raw = _mm_maskz_loadu_epi8((__mmask16)((1u << (nj * 4)) - 1), w + ch * 256 + q * r * 4 + j0 * 4);
                for (int h = 0; h < 2; h++) {
                    const __m128i c = h ? _mm_and_si128(_mm_srli_epi16(raw, 4), _mm_set1_epi8(15)) : _mm_and_si128(raw, _mm_set1_epi8(15));
                    const __m512 f = _mm512_mul_ps(_mm512_permutexvar_ps(_mm512_cvtepu8_epi32(c), values), sv[h]);
                    const i64 at = (b + j0) * 32 + h * 16 + 4 * q; /* block j0 + i at at + 32 i */
                    if (dt) {
                        uint16_t tb[16];
                        _mm256_storeu_si256((__m256i *)tb, tiny ? bf16_rne(f) : (__m256i)_mm512_cvtneps_pbh(f));
                        for (i64 i = 0; i < nj; i++) memcpy((uint16_t *)out + at + 32 * i, tb + 4 * i, 8);
                    } else {
                        float tmp[16];
                        _mm512_storeu_ps(tmp, f);
                        for (i64 i = 0; i < nj; i++) memcpy((float *)out + at + 32 * i, tmp + 4 * i, 16);
                    }
                }
            }
        }
    }
}
#endif

/* W (N x K) dequantized into out (dt 0 float32 / 1 bf16): value * scale, rounded once to the dtype. */
void gb_fp4_dequant(const uint8_t *w, const uint8_t *s, const float *g, int kind, i64 N, i64 Kp, i64 K, void *out,
                    int out_dt, int threads) {
    const i64 nb = Kp / 32, row_bytes = Kp / 2, row_scales = kind == 0 ? nb : 2 * nb;
#pragma omp parallel for schedule(static) num_threads(threads) if (N * K >= (1 << 16))
    for (i64 n = 0; n < N; n++) {
        const uint8_t *row = w + n * row_bytes, *sr = s + n * row_scales;
        const float gn = g ? g[n] : 1.0f;
        void *o = (char *)out + n * K * (out_dt ? 2 : 4);
        i64 first = 0; /* codes before it were written by the vector path */
#if defined(GB_FP4_VEC) && defined(__AVX512BF16__)
        dequant_row_vnni(row, sr, gn, kind, nb, K, o, out_dt);
        for (i64 ch = 0; ch * 16 < nb && (ch * 16 + chunk_blocks(ch, nb)) * 32 <= K; ch++)
            first = (ch * 16 + chunk_blocks(ch, nb)) * 32;
#endif
        for (i64 k = first; k < K; k++) {
            const i64 at = fp4_code_pos(k, nb);
            const int c = (at & 1) ? row[at >> 1] >> 4 : row[at >> 1] & 15;
            float lo, hi;
            block_scales(sr, kind, k / 32, nb, &lo, &hi);
            const float sc = (k % 32) < 16 ? lo : hi;
            store_out(o, k, FP4_VALUES[c] * (kind == 0 ? sc : sc * gn), out_dt);
        }
    }
}
