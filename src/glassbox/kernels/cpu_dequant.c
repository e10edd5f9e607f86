/* Block weights dequantized (quant/blocks/weights.py's prefill rows and float32 models): d q + o per value,
 * rounded once to the output dtype. The layout is cpu_quant.c's. */
#include "cpu_quant.h"

#ifdef GB_VNNI
/* One row's whole chunks, dequantized into out (row of K values, dt 0 float32 / 1 bf16): for each code vector
 * p, 16 codes at a time (4 codes of 4 blocks) widened, scaled and offset per block, stored as 4-value runs. */
static void dequant_chunks(const block_row *rw, float c, i64 chunks, int bits, void *out, int dt) {
    for (i64 ch = 0; ch < chunks; ch++) {
        const i64 b = ch * CHUNK, mo = ch * rw->mstep;
        const uint8_t *w = rw->w + ch * rw->wstep;
        const __m512 dv = _mm512_cvtph_ps(_mm256_loadu_si256((const __m256i *)(rw->d + mo)));
        const __m512 ov = block_offsets16(rw->o ? rw->o + mo : NULL, rw->z ? rw->z + mo : NULL, c, 0, dv);
        __m512 ds[4], os[4]; /* group g: lanes 4i..4i+3 hold block 4g + i's scale (offset) */
        for (int g = 0; g < 4; g++) {
            const __m512i idx = _mm512_setr_epi32(4 * g, 4 * g, 4 * g, 4 * g, 4 * g + 1, 4 * g + 1, 4 * g + 1, 4 * g + 1,
                                                  4 * g + 2, 4 * g + 2, 4 * g + 2, 4 * g + 2, 4 * g + 3, 4 * g + 3,
                                                  4 * g + 3, 4 * g + 3);
            ds[g] = _mm512_permutexvar_ps(idx, dv);
            os[g] = _mm512_permutexvar_ps(idx, ov);
        }
        for (int p = 0; p < 8; p++) {
            const __m512i v = chunk_vector(w, bits, p);
            for (int g = 0; g < 4; g++) { /* bytes 16g..16g+15: codes 4p..4p+3 of blocks 4g..4g+3 */
                const __m128i qg = g == 0   ? _mm512_extracti32x4_epi32(v, 0)
                                   : g == 1 ? _mm512_extracti32x4_epi32(v, 1)
                                   : g == 2 ? _mm512_extracti32x4_epi32(v, 2)
                                            : _mm512_extracti32x4_epi32(v, 3);
                const __m512 f = _mm512_fmadd_ps(_mm512_cvtepi32_ps(_mm512_cvtepu8_epi32(qg)), ds[g], os[g]);
                for (int i = 0; i < 4; i++) {
                    const i64 at = (b + 4 * g + i) * 32 + 4 * p;
                    if (dt) {
                        const __m256i h = (__m256i)_mm512_cvtneps_pbh(f);
                        uint64_t four;
                        memcpy(&four, (const char *)&h + 8 * i, 8);
                        memcpy((uint16_t *)out + at, &four, 8);
                    } else {
                        float tmp[16];
                        _mm512_storeu_ps(tmp, f);
                        memcpy((float *)out + at, tmp + 4 * i, 16);
                    }
                }
            }
        }
    }
}
#endif

/* Row n of W (N x K, rows in tiles of 16) dequantized into out (K values): d q + o per value, rounded once to
 * the dtype (dt 0 float32 / 1 bf16). */
static void dequant_row(const uint8_t *w, const uint16_t *d, const uint16_t *o, const uint8_t *z, float c, i64 N,
                        i64 Kp, i64 K, int bits, i64 n, void *out, int out_dt) {
    i64 first = 0; /* codes before it were written by the vector path */
#if defined(GB_VNNI) && defined(__AVX512BF16__)
    const i64 chunks = Kp / 32 / CHUNK, nb = Kp / 32, row_bytes = code_row_bytes(Kp, bits);
    first = chunks * CHUNK * 32 <= K ? chunks * CHUNK * 32 : 0;
    if (first > 0) {
        const i64 n1 = (n / TILE + 1) * TILE, next = N - n1 < TILE ? N - n1 : TILE; /* the next tile's rows */
        if (next > 0) { /* a sixteenth of the next tile per row (cpu_quant.h prefetch_part) */
            prefetch_part(w + n1 * row_bytes, next * row_bytes, n % TILE);
            prefetch_part(d + n1 * nb, next * nb * 2, n % TILE);
            if (o) prefetch_part(o + n1 * nb, next * nb * 2, n % TILE);
            if (z) prefetch_part(z + n1 * nb, next * nb, n % TILE);
        }
        const block_row rw = row_at(w, d, o, z, N, Kp, bits, n);
        dequant_chunks(&rw, c, chunks, bits, out, out_dt);
    }
#endif
    for (i64 k = first; k < K; k++) {
        const i64 mi = meta_at(N, n, k / 32, Kp);
        const int q = code_at(w, N, n, k, Kp, bits);
        const float db = h2f(d[mi]);
        const float ob = block_offset(o ? o + mi : NULL, z ? z + mi : NULL, c, 0, db);
        store_out(out, k, db * (float)q + ob, out_dt);
    }
}

/* W (N x K, rows in tiles of 16) dequantized, rows in order. */
void gb_dequant_blocks(const uint8_t *w, const uint16_t *d, const uint16_t *o, const uint8_t *z, float c, i64 N, i64 Kp, i64 K,
                       int bits, void *out, int out_dt, int threads) {
#pragma omp parallel for schedule(static) num_threads(threads) if (N * K >= (1 << 16))
    for (i64 n = 0; n < N; n++)
        dequant_row(w, d, o, z, c, N, Kp, K, bits, n, (char *)out + n * K * (out_dt ? 2 : 4), out_dt);
}

/* Rows ids[0..T) of W dequantized into out (T x K): an embedding lookup (cpu_step.c's decode bursts). */
void gb_dequant_block_rows(const uint8_t *w, const uint16_t *d, const uint16_t *o, const uint8_t *z, float c, i64 N,
                           i64 Kp, i64 K, int bits, const i64 *ids, i64 T, void *out, int out_dt) {
    for (i64 t = 0; t < T; t++)
        dequant_row(w, d, o, z, c, N, Kp, K, bits, ids[t], (char *)out + t * K * (out_dt ? 2 : 4), out_dt);
}
