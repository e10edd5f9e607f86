/* Hybrid models' decode recurrences on the CPU (float32), in place on the state cache: one token per
 * sequence, threads over (sequence, head). The PyTorch references are layers/gated_delta_rule.delta_step
 * and layers/ssd_scan.ssd_step; tests/test_hybrid_kernels.py holds them equal.
 *
 * The state of sequence n's head h starts at base + slots[n] * stride + h * rows * cols (float32,
 * row-major (rows, cols)): the state cache's rows (layers/state_cache.py) past their conv window. */
#include "cpu_common.h"

#define GB_MAX_COLS 1024 /* a head's value width (Gated DeltaNet's dv) kept on the stack */

/* Gated delta rule, per head with S (dk, dv), decay exp(g), write strength beta, normalized k, scaled q:
 *   S <- exp(g) S;  d = beta (v - S^T k);  S <- S + k d^T;  o = S^T q.
 * Two passes over S: the read S^T k, then the update and the readout together. */
void gb_delta_step(float *base, i64 stride, const i64 *slots, const float *q, const float *k, const float *v,
                   const float *g, const float *beta, float *out, i64 n_seqs, i64 heads, i64 dk, i64 dv,
                   int threads) {
#pragma omp parallel for collapse(2) schedule(static) num_threads(threads) if (n_seqs * heads > 1)
    for (i64 n = 0; n < n_seqs; n++) {
        for (i64 h = 0; h < heads; h++) {
            float *S = base + slots[n] * stride + h * dk * dv;
            const i64 nh = n * heads + h;
            const float *kk = k + nh * dk, *qq = q + nh * dk, *vv = v + nh * dv;
            const float decay = expf(g[nh]), b = beta[nh];
            float mem[GB_MAX_COLS], d[GB_MAX_COLS], o[GB_MAX_COLS];
            for (i64 j = 0; j < dv; j++) mem[j] = 0.0f;
            for (i64 i = 0; i < dk; i++) {
                const float *row = S + i * dv;
                const float ki = kk[i];
#pragma omp simd
                for (i64 j = 0; j < dv; j++) mem[j] += (row[j] * decay) * ki;
            }
            for (i64 j = 0; j < dv; j++) {
                d[j] = (vv[j] - mem[j]) * b;
                o[j] = 0.0f;
            }
            for (i64 i = 0; i < dk; i++) {
                float *row = S + i * dv;
                const float ki = kk[i], qi = qq[i];
#pragma omp simd
                for (i64 j = 0; j < dv; j++) {
                    const float s = row[j] * decay + ki * d[j];
                    row[j] = s;
                    o[j] += s * qi;
                }
            }
            memcpy(out + nh * dv, o, (size_t)dv * 4);
        }
    }
}

/* Mamba-2 (SSD), per head with H (P, N), step dt, A < 0, input x (P), B and C (N), skip D:
 *   H <- exp(dt A) H + dt x B^T;  y = H C + D x.
 * One pass over H. */
void gb_ssd_step(float *base, i64 stride, const i64 *slots, const float *x, const float *dt, const float *a,
                 const float *bmat, const float *cmat, const float *dskip, float *out, i64 n_seqs, i64 heads,
                 i64 p, i64 ns, int threads) {
#pragma omp parallel for collapse(2) schedule(static) num_threads(threads) if (n_seqs * heads > 1)
    for (i64 n = 0; n < n_seqs; n++) {
        for (i64 h = 0; h < heads; h++) {
            float *S = base + slots[n] * stride + h * p * ns;
            const i64 nh = n * heads + h;
            const float step = dt[nh], decay = expf(step * a[h]);
            const float *bb = bmat + nh * ns, *cc = cmat + nh * ns, *xx = x + nh * p;
            for (i64 i = 0; i < p; i++) {
                float *row = S + i * ns;
                const float xi = xx[i];
                float acc = 0.0f;
#pragma omp simd reduction(+ : acc)
                for (i64 s = 0; s < ns; s++) {
                    const float val = row[s] * decay + (step * bb[s]) * xi;
                    row[s] = val;
                    acc += val * cc[s];
                }
                out[nh * p + i] = acc + xi * dskip[h];
            }
        }
    }
}
