/* A whole decode step of a Llama-family layer stack in one call, for models whose linears are all block
 * weights (cpu_quant.c), GGUF K-quants (cpu_kquant.c) or bf16 tiles (cpu_bf16.c): the same kernels, in the same order, with the same
 * roundings as models/llama_native.py's per-op forward, without a Python call (and its checks) around each.
 *
 * A decode step of a small model runs ~10 kernels per layer; from Python each costs 5-20 us of ctypes,
 * tensor allocation and argument checks, as much as the GEMV itself on a thin layer. Here a step costs one
 * call. The caller (kernels/cpu_step.py) checks every weight and buffer once, at binding, and the step's
 * index tensors once per step (cpu_ops.check_step).
 */
#include "cpu_common.h"

/* the kernels it chains (cpu_kernels.c, cpu_quant.c) */
void gb_add_rms_norm(void *x, const void *res, const void *w, void *out, i64 rows, i64 dim, float eps, int dt,
                     int threads);
void gb_silu_mul(const void *gu, void *out, i64 rows, i64 inter, int dt, int threads);
void gb_qkv_rope_store(void *qkv, i64 T, i64 stride, i64 hq, i64 hk, i64 d, const void *qn_w, const void *kn_w,
                       float eps, const void *cos_t, const void *sin_t, i64 rd, const i64 *positions, void *k_cache,
                       void *v_cache, const i64 *slots, int dt, int kv8, int threads);
void gb_decode_attention(const void *qkv, i64 q_stride, const void *k_cache, const void *v_cache,
                         const i64 *block_tables, i64 max_blocks, const i64 *context_lens, i64 nd, i64 hq, i64 hk,
                         i64 d, i64 bs, float scale, i64 window, const float *sinks, void *out, int dt, int kv8,
                         int threads);
void gb_linear_blocks(const void *x, i64 M, i64 K, const uint8_t *w, const uint16_t *d, const uint16_t *o,
                      const uint8_t *z, float c, const float *bias, i64 N, i64 Kp, int bits, void *out, int dt,
                      int threads);
void gb_linear_kquant(const void *x, i64 M, i64 K, const uint8_t *codes, const uint8_t *meta, int kind,
                      const float *bias, i64 N, void *out, int dt, int threads);
void gb_linear_bf16t(const uint16_t *x, i64 M, i64 K, i64 ldx, const uint16_t *wp, const float *bias, i64 N,
                     void *out, i64 ldo, int dt, int threads);

/* One linear's block weights (quant/blocks/weights.py BlockWeights.pointers()), or with ``kind`` 4, 5 or 6 a
 * GGUF K-quant's (quant/blocks/kquant.py: ``codes`` and its meta bytes in ``scales``), or with ``kind`` 16 bf16
 * weights in tiles (quant/dense/bf16_tiles.py: the tiles in ``codes``). */
typedef struct {
    const uint8_t *codes;
    const uint16_t *scales;
    const uint16_t *offsets; /* or NULL */
    const uint8_t *zeros;    /* or NULL */
    const float *bias;       /* or NULL */
    i64 n, k, kp;
    float offset_factor;
    int bits;
    int kind; /* 0: block weights; 4, 5, 6: Q4_K, Q5_K, Q6_K (cpu_kquant.c); 16: bf16 tiles (cpu_bf16.c) */
} gb_step_linear;

typedef struct {
    const void *in_norm; /* (hidden,) in the storage dtype */
    const void *post_norm;
    const void *q_norm; /* (d,) or NULL */
    const void *k_norm;
    void *k_cache; /* this layer's caches (cpu_ops.PagedAttention) */
    void *v_cache;
    const float *sinks; /* (hq,) attention sinks or NULL */
    gb_step_linear qkv, o, gate_up, down;
    i64 window;
    float in_eps, post_eps, qk_eps;
    /* q/k/v that cannot share one weight (a Q4_K_M file's Q6_K attn_v): qkv is q, then these; else 1 part */
    gb_step_linear qkv_k, qkv_v;
    i64 qkv_parts;
} gb_step_layer;

typedef struct {
    i64 layers, hidden, inter, hq, hk, d, bs, rd;
    const void *cos_t, *sin_t; /* rotary tables (positions, rd) */
    const void *final_norm;
    float final_eps, scale;
    int dt, kv8;
} gb_step_model;

static void linear(const gb_step_linear *l, const void *x, i64 T, void *out, int dt, int threads) {
    if (l->kind == 16)
        gb_linear_bf16t((const uint16_t *)x, T, l->k, l->k, (const uint16_t *)l->codes, l->bias, l->n, out, l->n, dt,
                        threads);
    else if (l->kind)
        gb_linear_kquant(x, T, l->k, l->codes, (const uint8_t *)l->scales, l->kind, l->bias, l->n, out, dt, threads);
    else
        gb_linear_blocks(x, T, l->k, l->codes, l->scales, l->offsets, l->zeros, l->offset_factor, l->bias, l->n,
                         l->kp, l->bits, out, dt, threads);
}

/* q/k/v into qkv (T x width): one call, or each part into ``part`` (T x its n, at least the q part's size)
 * and copied to its columns (ConcatLinear's torch.cat in the per-op forward). */
static void qkv_linear(const gb_step_layer *l, const void *h, i64 T, char *qkv, i64 width, char *part, int dt,
                       int threads) {
    if (l->qkv_parts == 1) {
        linear(&l->qkv, h, T, qkv, dt, threads);
        return;
    }
    const gb_step_linear *parts[3] = {&l->qkv, &l->qkv_k, &l->qkv_v};
    const i64 esz = dt ? 2 : 4;
    i64 col = 0;
    for (i64 p = 0; p < l->qkv_parts; p++) {
        const i64 n = parts[p]->n;
        linear(parts[p], h, T, part, dt, threads);
        for (i64 t = 0; t < T; t++) memcpy(qkv + (t * width + col) * esz, part + t * n * esz, (size_t)(n * esz));
        col += n;
    }
}

/* x (T, hidden): the embedded tokens, the residual stream (updated in place); h (T, hidden): the final
 * norm's output. Every row decodes (row t is sequence t). scratch: T * (width + hq d + 2 inter + hidden)
 * values of the storage dtype, width = (hq + 2 hk) d. */
void gb_decode_step(const gb_step_model *m, const gb_step_layer *layers, void *x, void *h, i64 T,
                    const i64 *positions, const i64 *slots, const i64 *block_tables, i64 max_blocks,
                    const i64 *context_lens, void *scratch, int threads) {
    const int dt = m->dt;
    const i64 width = (m->hq + 2 * m->hk) * m->d, esz = dt ? 2 : 4;
    char *qkv = (char *)scratch;
    char *attn = qkv + T * width * esz;
    char *gate_up = attn + T * m->hq * m->d * esz;
    char *act = gate_up + T * 2 * m->inter * esz;
    char *tmp = act + T * m->inter * esz;
    gb_add_rms_norm(x, NULL, layers[0].in_norm, h, T, m->hidden, layers[0].in_eps, dt, threads);
    for (i64 i = 0; i < m->layers; i++) {
        const gb_step_layer *l = layers + i;
        qkv_linear(l, h, T, qkv, width, attn, dt, threads); /* attn: free until the attention writes it */
        gb_qkv_rope_store(qkv, T, width, m->hq, m->hk, m->d, l->q_norm, l->k_norm, l->qk_eps, m->cos_t, m->sin_t,
                          m->rd, positions, l->k_cache, l->v_cache, slots, dt, m->kv8, threads);
        gb_decode_attention(qkv, width, l->k_cache, l->v_cache, block_tables, max_blocks, context_lens, T, m->hq,
                            m->hk, m->d, m->bs, m->scale, l->window, l->sinks, attn, dt, m->kv8, threads);
        linear(&l->o, attn, T, tmp, dt, threads);
        gb_add_rms_norm(x, tmp, l->post_norm, h, T, m->hidden, l->post_eps, dt, threads);
        linear(&l->gate_up, h, T, gate_up, dt, threads);
        gb_silu_mul(gate_up, act, T, m->inter, dt, threads);
        linear(&l->down, act, T, tmp, dt, threads);
        const int last = i + 1 == m->layers;
        gb_add_rms_norm(x, tmp, last ? m->final_norm : layers[i + 1].in_norm, h, T, m->hidden,
                        last ? m->final_eps : layers[i + 1].in_eps, dt, threads);
    }
}

void gb_dequant_block_rows(const uint8_t *w, const uint16_t *d, const uint16_t *o, const uint8_t *z, float c, i64 N,
                           i64 Kp, i64 K, int bits, const i64 *ids, i64 T, void *out, int out_dt);

/* The embedding table a burst looks tokens up in: rows of the storage dtype (``table``, V x hidden), or with
 * ``blocks.codes`` set block weights whose rows are dequantized (a GGUF Q8_0 token_embd). */
typedef struct {
    const void *table;
    gb_step_linear blocks;
} gb_step_embed;

/* Greedy decoding of ``steps`` tokens per row in one call, each a gb_decode_step followed by the LM head and
 * an argmax, for rows that the engine would otherwise decode one step at a time: the same kernels, so the
 * same tokens, without the engine's per-step host work (models/llama_burst.py).
 *
 * tokens: (steps + 1) x T; row 0 holds each sequence's last token, rows 1..steps receive the picks.
 * positions, context_lens (T): the first step's, advanced in place; slots (T): scratch. block_tables (T x
 * max_blocks) must hold every position written. logits: T x head->n values of the storage dtype (the LM
 * head's output as the per-op path rounds it; ties go to the lowest id, as torch.argmax). */
void gb_decode_burst(const gb_step_model *m, const gb_step_layer *layers, const gb_step_linear *head,
                     const gb_step_embed *emb, i64 *tokens, i64 T, i64 steps, i64 *positions, i64 *slots,
                     const i64 *block_tables, i64 max_blocks, i64 *context_lens, void *x, void *h, void *logits,
                     void *scratch, int threads) {
    const int dt = m->dt;
    const i64 esz = dt ? 2 : 4, V = head->n;
    for (i64 s = 0; s < steps; s++) {
        const i64 *ids = tokens + s * T;
        if (emb->blocks.codes) {
            const gb_step_linear *b = &emb->blocks;
            gb_dequant_block_rows(b->codes, b->scales, b->offsets, b->zeros, b->offset_factor, b->n, b->kp, b->k,
                                  b->bits, ids, T, x, dt);
        } else {
            for (i64 t = 0; t < T; t++)
                memcpy((char *)x + t * m->hidden * esz, (const char *)emb->table + ids[t] * m->hidden * esz,
                       (size_t)(m->hidden * esz));
        }
        for (i64 t = 0; t < T; t++)
            slots[t] = block_tables[t * max_blocks + positions[t] / m->bs] * m->bs + positions[t] % m->bs;
        gb_decode_step(m, layers, x, h, T, positions, slots, block_tables, max_blocks, context_lens, scratch,
                       threads);
        linear(head, h, T, logits, dt, threads);
        for (i64 t = 0; t < T; t++) {
            i64 best = 0;
            float top = 0.f;
            for (i64 v = 0; v < V; v++) {
                const float y = dt ? bf2f(((const uint16_t *)logits)[t * V + v]) : ((const float *)logits)[t * V + v];
                if (v == 0 || y > top) top = y, best = v;
            }
            tokens[(s + 1) * T + t] = best;
            positions[t]++;
            context_lens[t]++;
        }
    }
}
