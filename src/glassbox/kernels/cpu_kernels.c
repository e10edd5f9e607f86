/* glassbox CPU kernels: the non-GEMM work of a Llama-family layer, one call each instead of a dozen
 * PyTorch ops, and a paged decode attention that reads the KV cache through the block tables.
 *
 * Compiled on first use by glassbox/kernels/native.py (cc -O3 -march=native -fopenmp) and called
 * through ctypes with raw tensor pointers; the Python side checks shapes, dtypes and contiguity.
 * Storage dtypes: dt == 0 float32, dt == 1 bfloat16. Arithmetic is float32 with the roundings of
 * the PyTorch reference path (each op's result rounded to the storage dtype), so that float32 runs
 * match transformers token for token and bf16 runs stay within the reference's rounding.
 * Build with -ffp-contract=off: no fused multiply-adds that the reference does not do.
 * The KV cache is in the storage dtype (kv8 == 0) or in 8 bits with a scale per token and head (kv8 == 1
 * int8, 2 fp8 e4m3: cpu_kv8.c).
 */
#include "cpu_common.h"
#include "cpu_kv8.h"

static void round_row(float *x, i64 n, int dt) {
    if (dt)
        for (i64 i = 0; i < n; i++) x[i] = bf2f(f2bf(x[i]));
}

/* x <- round(weight * round(x * rsqrt(mean(x^2) + eps))), as RMSNorm in the reference. */
static void rms_norm_inplace(float *x, const float *w, i64 n, float eps, int dt) {
    float ss = dot(x, x, n);
    float r = 1.0f / sqrtf(ss / (float)n + eps);
    for (i64 i = 0; i < n; i++) x[i] *= r;
    round_row(x, n, dt);
    for (i64 i = 0; i < n; i++) x[i] *= w[i];
    round_row(x, n, dt);
}

/* If res: x <- round(x + res) in place. Then out <- rms_norm(x) * w. Rows of length dim. */
void gb_add_rms_norm(void *x, const void *res, const void *w, void *out, i64 rows, i64 dim, float eps, int dt,
                     int threads) {
#pragma omp parallel for schedule(static) num_threads(threads) if (rows * dim >= (1 << 15))
    for (i64 r = 0; r < rows; r++) {
        float buf[dim], rb[dim], wf[dim];
        load_row(w, wf, dim, dt);
        load_row(at(x, r * dim, dt), buf, dim, dt);
        if (res) {
            load_row(cat_(res, r * dim, dt), rb, dim, dt);
            for (i64 i = 0; i < dim; i++) buf[i] += rb[i];
            round_row(buf, dim, dt);
            store_row(at(x, r * dim, dt), buf, dim, dt);
        }
        rms_norm_inplace(buf, wf, dim, eps, dt);
        store_row(at(out, r * dim, dt), buf, dim, dt);
    }
}

/* out[r, i] <- round(round(silu(gu[r, i])) * gu[r, inter + i]). */
void gb_silu_mul(const void *gu, void *out, i64 rows, i64 inter, int dt, int threads) {
#pragma omp parallel for schedule(static) num_threads(threads) if (rows * inter >= (1 << 15))
    for (i64 r = 0; r < rows; r++) {
        float g[inter], u[inter];
        load_row(cat_(gu, r * 2 * inter, dt), g, inter, dt);
        load_row(cat_(gu, r * 2 * inter + inter, dt), u, inter, dt);
        for (i64 i = 0; i < inter; i++) g[i] = g[i] / (1.0f + exp_f(-g[i]));
        round_row(g, inter, dt);
        for (i64 i = 0; i < inter; i++) g[i] *= u[i];
        round_row(g, inter, dt);
        store_row(at(out, r * inter, dt), g, inter, dt);
    }
}

/* One token's head in place: optional per-head RMSNorm, then rotate-half rotary on the first rd dims
 * with the position's cos/sin rows (already in float, from tables in the storage dtype). */
static void norm_rope_head(float *x, i64 d, const float *norm_w, float eps, const float *c, const float *s,
                           i64 rd, int dt) {
    if (norm_w) rms_norm_inplace(x, norm_w, d, eps, dt);
    const i64 half = rd / 2;
    float a[rd], b[rd];
    for (i64 i = 0; i < half; i++) {
        a[i] = x[i] * c[i];
        b[i] = -x[i + half] * s[i];
        a[i + half] = x[i + half] * c[i + half];
        b[i + half] = x[i] * s[i + half];
    }
    round_row(a, rd, dt);
    round_row(b, rd, dt);
    for (i64 i = 0; i < rd; i++) x[i] = a[i] + b[i];
    round_row(x, rd, dt);
}

/* qkv (T, stride) rows holding [q (hq*d) | k (hk*d) | v (hk*d)]: q and k normed and rotated in place,
 * then k and v stored at each token's cache slot. Caches are (slots, hk, d) in the same dtype, or with
 * kv8 (slots, hk, d + 4) bytes: 8-bit codes and a float32 scale per head (cpu_kv8.c). */
void gb_qkv_rope_store(void *qkv, i64 T, i64 stride, i64 hq, i64 hk, i64 d, const void *qn_w,
                       const void *kn_w, float eps, const void *cos_t, const void *sin_t, i64 rd,
                       const i64 *positions, void *k_cache, void *v_cache, const i64 *slots, int dt, int kv8,
                       int threads) {
    const i64 row8 = d + KV8_SCALE_BYTES;
#pragma omp parallel for schedule(static) num_threads(threads) if (T * (hq + hk) * d >= (1 << 15))
    for (i64 t = 0; t < T; t++) {
        float buf[d], qn[d], kn[d], c[rd], s[rd];
        if (qn_w) load_row(qn_w, qn, d, dt);
        if (kn_w) load_row(kn_w, kn, d, dt);
        load_row(cat_(cos_t, positions[t] * rd, dt), c, rd, dt);
        load_row(cat_(sin_t, positions[t] * rd, dt), s, rd, dt);
        for (i64 h = 0; h < hq + hk; h++) {
            void *row = at(qkv, t * stride + h * d, dt);
            load_row(row, buf, d, dt);
            norm_rope_head(buf, d, h < hq ? (qn_w ? qn : 0) : (kn_w ? kn : 0), eps, c, s, rd, dt);
            store_row(row, buf, d, dt);
            if (h < hq) continue;
            if (kv8)
                kv8_store_row((uint8_t *)k_cache + (slots[t] * hk + h - hq) * row8, buf, d, kv8);
            else
                store_row(at(k_cache, (slots[t] * hk + h - hq) * d, dt), buf, d, dt);
        }
        if (!kv8) {
            memcpy(at(v_cache, slots[t] * hk * d, dt), at(qkv, t * stride + (hq + hk) * d, dt),
                   (size_t)(hk * d * (dt ? 2 : 4)));
            continue;
        }
        for (i64 h = 0; h < hk; h++) {
            load_row(at(qkv, t * stride + (hq + hk + h) * d, dt), buf, d, dt);
            kv8_store_row((uint8_t *)v_cache + (slots[t] * hk + h) * row8, buf, d, kv8);
        }
    }
}

#if defined(__AVX512F__) && defined(__AVX512BF16__)
#include <immintrin.h>
#define GB_AVX512BF16 1
/* bf16 rows, n a multiple of 32: the products in float32 through vdpbf16ps. */
static inline float dot_bf16(const uint16_t *a, const uint16_t *b, i64 n) {
    __m512 acc = _mm512_setzero_ps();
    for (i64 i = 0; i < n; i += 32)
        acc = _mm512_dpbf16_ps(acc, (__m512bh)_mm512_loadu_si512(a + i), (__m512bh)_mm512_loadu_si512(b + i));
    return _mm512_reduce_add_ps(acc);
}
#else
#define GB_AVX512BF16 0
#endif

/* q . k over d values of the storage dtype. */
static inline float score(const void *q, const void *k, i64 d, int dt) {
    if (!dt) return dot((const float *)q, (const float *)k, d);
#if GB_AVX512BF16
    if (d % 32 == 0) return dot_bf16((const uint16_t *)q, (const uint16_t *)k, d);
#endif
    const uint16_t *a = (const uint16_t *)q, *b = (const uint16_t *)k;
    float s = 0.0f;
#pragma omp simd reduction(+ : s)
    for (i64 i = 0; i < d; i++) s += bf2f(a[i]) * bf2f(b[i]);
    return s;
}

/* Attention of sequence sq's query heads over its positions [t0, t1), a block at a time, every head of a
 * token together (contiguous in the cache); online softmax in float32, started from the sinks where given
 * (start_heads). GQA: kv head h serves query heads h * g .. h * g + g - 1. With part == NULL the result is normalized and stored in out; otherwise each
 * query head's partial state (running max, sum of exps, unnormalized sum: d + 2 floats) goes to part.
 * (Software prefetch of the next block was tried and slowed it: the hardware prefetcher follows these
 * block-long contiguous reads by itself.) */
static inline __attribute__((always_inline)) void attend(const void *qkv, i64 q_stride, const void *k_cache,
                                                         const void *v_cache, const i64 *table, i64 t0, i64 t1,
                                                         i64 sq, i64 hq, i64 hk, i64 d, i64 bs, float scale,
                                                         const float *sinks, void *out, float *part, int dt) {
    const i64 g = hq / hk;
    float acc[hq][d], sc[hq][bs], m[hq], l[hq], vf[d];
    start_heads(hq, d, acc, m, l, sinks);
    const void *q0 = cat_(qkv, sq * q_stride, dt);
    for (i64 b = t0 / bs; b * bs < t1; b++) {
        const i64 blk = table[b];
        const i64 lo = t0 > b * bs ? t0 - b * bs : 0;
        const i64 hi = t1 < (b + 1) * bs ? t1 - b * bs : bs;
        for (i64 p = lo; p < hi; p++)
            for (i64 j = 0; j < hq; j++) {
                const void *k = cat_(k_cache, ((blk * bs + p) * hk + j / g) * d, dt);
                sc[j][p] = score(cat_(q0, j * d, dt), k, d, dt) * scale;
            }
        softmax_block(hq, d, bs, lo, hi, sc, m, l, acc);
        for (i64 p = lo; p < hi; p++)
            for (i64 h = 0; h < hk; h++) { /* each V row widened to float once, used by its g query heads */
                load_row(cat_(v_cache, ((blk * bs + p) * hk + h) * d, dt), vf, d, dt);
                for (i64 j = h * g; j < (h + 1) * g; j++) {
                    const float w = sc[j][p];
                    for (i64 i = 0; i < d; i++) acc[j][i] += w * vf[i];
                }
            }
    }
    finish_heads(hq, d, acc, m, l, part, out, sq, dt);
}

/* attend, compiled separately for the common bf16 head sizes (loops of known length unroll and keep their
 * sums in registers: a quarter faster) and once for any other size and dtype. */
static void attend_any(const void *qkv, i64 q_stride, const void *k_cache, const void *v_cache,
                       const i64 *table, i64 t0, i64 t1, i64 sq, i64 hq, i64 hk, i64 d, i64 bs, float scale,
                       const float *sinks, void *out, float *part, int dt, int kv8) {
    (void)kv8; /* the signature of kv8_attend, so that decode picks either */
    if (dt == 1 && d == 128)
        attend(qkv, q_stride, k_cache, v_cache, table, t0, t1, sq, hq, hk, 128, bs, scale, sinks, out, part, 1);
    else if (dt == 1 && d == 64)
        attend(qkv, q_stride, k_cache, v_cache, table, t0, t1, sq, hq, hk, 64, bs, scale, sinks, out, part, 1);
    else
        attend(qkv, q_stride, k_cache, v_cache, table, t0, t1, sq, hq, hk, d, bs, scale, sinks, out, part, dt);
}

/* Decode attention, one query token per sequence, reading K/V through the block tables.
 * q rows at qkv + s * q_stride (hq * d values); caches (num_blocks * bs, hk, d); block_tables (nd,
 * max_blocks); out (nd, hq * d). window > 0 keeps only the last `window` positions. sinks: NULL, or hq float32
 * logits that join each head's softmax denominator (gpt-oss). With enough sequences each thread takes whole
 * sequences; with fewer, each sequence's positions are split into block-aligned parts (at least two per
 * thread) whose partial softmax states are merged at the end (the sinks counted in the first part only). */
void gb_decode_attention(const void *qkv, i64 q_stride, const void *k_cache, const void *v_cache,
                         const i64 *block_tables, i64 max_blocks, const i64 *context_lens, i64 nd, i64 hq,
                         i64 hk, i64 d, i64 bs, float scale, i64 window, const float *sinks, void *out, int dt,
                         int kv8, int threads) {
    void (*attend_fn)(const void *, i64, const void *, const void *, const i64 *, i64, i64, i64, i64, i64, i64,
                      i64, float, const float *, void *, float *, int, int) = kv8 ? kv8_attend : attend_any;
    const i64 parts = nd >= 2 * threads ? 1 : (2 * threads + nd - 1) / nd;
    float *scratch = parts > 1 ? (float *)malloc(sizeof(float) * (size_t)(nd * parts * hq * (d + 2))) : NULL;
    const i64 split = scratch ? parts : 1; /* out of memory: whole sequences */
#pragma omp parallel for schedule(dynamic, 1) num_threads(threads) if (nd * split > 1)
    for (i64 task = 0; task < nd * split; task++) {
        const i64 sq = task / split, pt = task % split, len = context_lens[sq];
        const i64 start = (window > 0 && len > window) ? len - window : 0;
        const i64 *table = block_tables + sq * max_blocks;
        if (split == 1) {
            attend_fn(qkv, q_stride, k_cache, v_cache, table, start, len, sq, hq, hk, d, bs, scale, sinks, out, NULL,
                      dt, kv8);
            continue;
        }
        const i64 first = start / bs * bs, nblk = (len - first + bs - 1) / bs;
        const i64 chunk = (nblk + split - 1) / split * bs;
        const i64 a = first + pt * chunk, b = first + (pt + 1) * chunk;
        attend_fn(qkv, q_stride, k_cache, v_cache, table, a > start ? a : start, b < len ? b : len, sq, hq, hk,
                  d, bs, scale, pt == 0 ? sinks : NULL, NULL, scratch + (sq * split + pt) * hq * (d + 2), dt, kv8);
    }
    if (split == 1) return;
#pragma omp parallel for schedule(static) num_threads(threads) if (nd * hq * d >= (1 << 15))
    for (i64 task = 0; task < nd * hq; task++) {
        const i64 sq = task / hq, j = task % hq;
        float mx = -INFINITY, sum = 0.0f, res[d];
        for (i64 pt = 0; pt < split; pt++) {
            const float mp = scratch[((sq * split + pt) * hq + j) * (d + 2)];
            mx = mp > mx ? mp : mx;
        }
        memset(res, 0, sizeof(float) * (size_t)d);
        for (i64 pt = 0; pt < split; pt++) {
            const float *pj = scratch + ((sq * split + pt) * hq + j) * (d + 2);
            const float w = pj[1] > 0.0f ? exp_f(pj[0] - mx) : 0.0f; /* an empty part adds nothing */
            sum += w * pj[1];
            for (i64 i = 0; i < d; i++) res[i] += w * pj[2 + i];
        }
        const float inv = 1.0f / sum;
        for (i64 i = 0; i < d; i++) res[i] *= inv;
        store_row(at(out, sq * hq * d + j * d, dt), res, d, dt);
    }
    free(scratch);
}

