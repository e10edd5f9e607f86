"""bf16 prefill attention on CPU: bf16 GEMMs (oneDNN) per tile of query rows around native passes.

PyTorch's CPU SDPA runs bf16 attention at ~130 GFLOP/s on this project's 2-core test machine, slower than
the GEMMs around it (~900): at 1,024 prompt tokens it was 57% of a Qwen3-0.6B prefill. Here each tile of
query rows takes the scores Q K^T as batched bf16 GEMMs over the keys it can see (causal: the tile's
own prefix), native passes (cpu_kernels.c) turn them into masked probabilities, and a GEMM takes P V.

A bf16 GEMM rounds its output to bf16, and scores of magnitude 500 would lose ~1 in the last bits, ~0.1
after scaling: too coarse for a peaked softmax. So the scores are taken twice: once to find each row's
visible maximum, then with that maximum subtracted inside the GEMM (an extra query column of -max against
a row of ones under the keys), so that the entries near the maximum, which are all a softmax sees, come
out small and exact to ~1e-3. float32 models keep SDPA, the reference.
"""

from __future__ import annotations

import torch

from glassbox.kernels.cpu_ops import lib
from glassbox.layers.attention import PrefillSeq, gather_tokens
from glassbox.layers.kv_quant import KV8_DTYPES

SCORE_TILE_BYTES = 8 << 20  # the bf16 scores of one tile: sized to stay in the last-level cache
MAX_TILE, MIN_TILE = 128, 16
PAD = 16  # the extra GEMM depth for the -max column, kept a multiple of 16 bf16 values


def tile_rows(num_q_heads: int, keys: int) -> int:
    """Query rows per tile: as many as keep the tile's scores under SCORE_TILE_BYTES, within bounds."""
    rows = SCORE_TILE_BYTES // (2 * num_q_heads * max(keys, 1))
    return max(MIN_TILE, min(MAX_TILE, rows))


def prefill_attention_bf16(
    q: torch.Tensor,  # (T, Hq, D) bf16
    k: torch.Tensor,  # (T, Hk, D) the new tokens' keys (already written to the cache)
    v: torch.Tensor,  # (T, Hk, D)
    kv_cache: torch.Tensor,  # (2, num_blocks, block_size, Hk, W): bf16, or 8-bit (layers/kv_quant.py)
    prefills: list[PrefillSeq],
    scale: float,
    sliding_window: int | None,
    out: torch.Tensor,  # (T, Hq, D): each prefill's rows written
    sinks: torch.Tensor | None = None,  # (Hq,) attention sinks (gpt-oss)
) -> None:
    """Causal attention of each prefill chunk over its cached prefix and itself."""
    if q.dtype != torch.bfloat16 or kv_cache.dtype not in (torch.bfloat16, *KV8_DTYPES):
        raise ValueError(f"bf16 prefill attention got {q.dtype} queries and a {kv_cache.dtype} cache")
    fresh_ok = kv_cache.dtype == torch.bfloat16  # an 8-bit cache is read back for the chunk's own keys too
    hq, hk, d = q.shape[1], k.shape[1], q.shape[2]
    g = hq // hk
    window = sliding_window or 0
    kernels = lib()
    softmax, offsets = kernels.gb_prefill_softmax_bf16, kernels.gb_prefill_row_offsets_bf16
    threads = torch.get_num_threads()
    sinks32 = None if sinks is None else sinks.detach().float().contiguous()
    if sinks32 is not None and sinks32.shape != (hq,):
        raise ValueError(f"sinks of shape {tuple(sinks32.shape)} for {hq} query heads")
    sinks_ptr = None if sinks32 is None else sinks32.data_ptr()
    for p in prefills:
        total = p.start + p.q_len
        if p.start == 0 and fresh_ok:
            ks, vs = k[p.q_start : p.q_start + p.q_len], v[p.q_start : p.q_start + p.q_len]
        else:
            ks = gather_tokens(kv_cache[0], p.block_table, total, torch.bfloat16)
            vs = gather_tokens(kv_cache[1], p.block_table, total, torch.bfloat16)
        kt = torch.empty(hk, d + PAD, total, dtype=torch.bfloat16)  # keys as GEMM columns, then 1, 0...
        kt[:, :d] = ks.permute(1, 2, 0)
        kt[:, d] = 1.0
        kt[:, d + 1 :] = 0.0
        vh = vs.transpose(0, 1).contiguous()  # (Hk, total, D)
        tile = tile_rows(hq, total)
        for s0 in range(0, p.q_len, tile):
            m = min(tile, p.q_len - s0)
            first = p.start + s0  # the tile's first query position
            end = first + m  # keys [lo, end) are all the tile can see
            lo = max(0, first - window + 1) if window else 0
            rows = slice(p.q_start + s0, p.q_start + s0 + m)
            qt = torch.empty(hk, g * m, d + PAD, dtype=torch.bfloat16)  # queries, then -max, 0...
            qt[:, :, d + 1 :] = 0.0
            qt[:, :, :d] = q[rows].reshape(m, hk, g, d).permute(1, 2, 0, 3).reshape(hk, g * m, d)
            rough = torch.bmm(qt[:, :, :d], kt[:, :d, lo:end])  # (Hk, g m, end - lo) bf16
            cols, q0 = end - lo, first - lo
            offsets(
                rough.data_ptr(), hk * g * m, m, cols, q0, window, qt[:, :, d].data_ptr(), d + PAD, threads
            )
            scores = torch.bmm(qt, kt[:, :, lo:end])  # s - max: exact near the maximum
            softmax(
                scores.data_ptr(), hk * g * m, m, cols, q0, window, scale, sinks_ptr,
                qt[:, :, d].data_ptr(), d + PAD, threads,
            )  # fmt: skip
            o = torch.bmm(scores, vh[:, lo:end])  # (Hk, g m, D)
            out[rows] = o.view(hk, g, m, d).permute(2, 0, 1, 3).reshape(m, hq, d)
