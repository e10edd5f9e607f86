/* The 8-bit KV cache (cpu_kv8.c), for cpu_kernels.c's cache write and decode attention. */
#ifndef GB_CPU_KV8_H
#define GB_CPU_KV8_H
#include "cpu_common.h"

#define KV8_SCALE_BYTES 4 /* each (token, head) row: d codes, then its float32 scale */
#define KV8_INT8 1
#define KV8_FP8 2 /* e4m3fn */

/* x (d floats) -> dst: d codes of kind, then the scale. */
void kv8_store_row(uint8_t *dst, const float *x, i64 d, int kind);

/* cpu_kernels.c's attend over an 8-bit cache (same arguments; caches of (slots, hk, d + 4) bytes). */
void kv8_attend(const void *qkv, i64 q_stride, const void *k_cache, const void *v_cache, const i64 *table, i64 t0,
                i64 t1, i64 sq, i64 hq, i64 hk, i64 d, i64 bs, float scale, const float *sinks, void *out,
                float *part, int dt, int kind);
#endif
