"""Attention over the paged KV cache.

Two backends: "torch" (the reference, torch SDPA over the live blocks; CPU and CUDA) and "triton"
(CUDA kernels in kernels/triton_attention.py that read the block tables directly; imported lazily).
An 8-bit cache (layers/kv_quant.py) is dequantized where the torch backend reads it; the triton kernels
read its codes and scales in place.

Attention sinks (gpt-oss): a learned logit per query head joins each row's softmax denominator and
contributes no value, p_j = exp(s_j) / (exp(sink) + sum_i exp(s_i)). The torch backend takes them (an
extra score column, as transformers' eager attention), the triton kernels as each head's softmax's start.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch
import torch.nn.functional as F

from glassbox.layers import kv_quant
from glassbox.layers.host import parts_to_device
from glassbox.layers.state_cache import StateBatch


@dataclass
class PrefillSeq:
    """One sequence computing ``q_len`` tokens after ``start`` already-cached tokens."""

    q_start: int  # first row of this sequence in the flat token batch
    q_len: int
    start: int  # tokens already in the cache before this step
    block_table: torch.Tensor  # (num_blocks_for_ctx,) int64


@dataclass
class PagedPrefill:
    """All prefill rows of a batch as one launch of the triton prefill kernel (built by the executor)."""

    block_tables: torch.Tensor  # (P, max_blocks) int32, one row per prefill sequence
    q_start: torch.Tensor  # (P,) int32: first row of each sequence within the prefill rows
    q_len: torch.Tensor  # (P,) int32
    ctx: torch.Tensor  # (P,) int32: tokens already cached before this step
    tile_seq: torch.Tensor  # (num_tiles,) int32: sequence index of each block_m-row query tile
    tile_m: torch.Tensor  # (num_tiles,) int32: first row of the tile within its sequence
    block_m: int


def build_paged_prefill(
    seqs: list[tuple[int, int, list[int]]],  # per prefill sequence: (start, q_len, block_table)
    block_m: int,
    device: torch.device,
) -> PagedPrefill:
    """The triton prefill layout; sequences' rows follow each other in this order after the decodes."""
    width = max(len(t) for _, _, t in seqs)
    tables = [t + [0] * (width - len(t)) for _, _, t in seqs]
    q_start, row = [], 0
    tiles: list[tuple[int, int, int]] = []  # (keys the tile reads, seq, first row)
    for i, (start, n, _) in enumerate(seqs):
        q_start.append(row)
        row += n
        tiles.extend((start + min(m + block_m, n), i, m) for m in range(0, n, block_m))
    tiles.sort(reverse=True)  # the longest tiles start first

    # one non-blocking copy (pinned on CUDA) for the six, each 16-byte aligned
    flat_tables = [b for t in tables for b in t]
    tab, q_start_t, q_len, ctx, tile_seq, tile_m = parts_to_device(
        [flat_tables, q_start, [n for _, n, _ in seqs], [s for s, _, _ in seqs], [t[1] for t in tiles],
         [t[2] for t in tiles]],
        torch.int32,
        device,
    )  # fmt: skip
    return PagedPrefill(
        block_tables=tab.view(len(seqs), width),
        q_start=q_start_t,
        q_len=q_len,
        ctx=ctx,
        tile_seq=tile_seq,
        tile_m=tile_m,
        block_m=block_m,
    )


@dataclass
class AttentionMetadata:
    """Per-batch attention layout. Rows [0, num_decode) are decodes (one token each), then prefills."""

    slot_mapping: torch.Tensor  # (T,) int64: flat cache slot (block * block_size + offset) per token
    num_decode: int = 0
    decode_block_tables: torch.Tensor | None = None  # (num_decode, max_blocks) int64, padded with 0
    decode_context_lens: torch.Tensor | None = None  # (num_decode,) int64, tokens incl. the new one
    prefills: list[PrefillSeq] = field(default_factory=list)
    backend: str = "torch"  # "torch" (reference SDPA) | "native" (CPU kernels) | "triton" (CUDA kernels)
    paged_prefill: PagedPrefill | None = None  # triton backend: the prefill rows' layout
    # False: every prefill row sees its whole sequence (a decoder run as an encoder: engine/encoder_forward.py;
    # whole sequences, torch backend only)
    causal: bool = True
    state: StateBatch | None = None  # hybrid models: the rows' recurrent-state slots (layers/state_cache.py)


def write_kv(kv_cache: torch.Tensor, k: torch.Tensor, v: torch.Tensor, slots: torch.Tensor) -> None:
    """Store the new tokens' K and V. kv_cache (2, num_blocks, block_size, Hk, W); k, v (T, Hk, D)."""
    if kv_quant.is_8bit(kv_cache):
        kv_quant.store(kv_cache[0], kv_quant.quantize(k, kv_cache.dtype), slots)
        kv_quant.store(kv_cache[1], kv_quant.quantize(v, kv_cache.dtype), slots)
        return
    _, nb, bs, hk, d = kv_cache.shape
    kv_cache[0].view(nb * bs, hk, d).index_copy_(0, slots, k.to(kv_cache.dtype))
    kv_cache[1].view(nb * bs, hk, d).index_copy_(0, slots, v.to(kv_cache.dtype))


def gather_tokens(
    cache: torch.Tensor, block_table: torch.Tensor, length: int, dtype: torch.dtype
) -> torch.Tensor:
    """The first ``length`` tokens of one sequence's blocks: (length, Hk, D) in ``dtype``."""
    if kv_quant.is_8bit(cache):
        rows = kv_quant.select_blocks(cache, block_table)
        return kv_quant.dequantize(rows.reshape(-1, *rows.shape[2:])[:length], dtype)
    _, bs, hk, d = cache.shape
    return cache[block_table].reshape(-1, hk, d)[:length].to(dtype)


def _decode_attention(
    q: torch.Tensor,  # (nd, Hq, D) one query per sequence
    kv_cache: torch.Tensor,  # (2, num_blocks, block_size, Hk, D)
    block_tables: torch.Tensor,  # (nd, max_blocks)
    context_lens: torch.Tensor,  # (nd,)
    scale: float,
    sliding_window: int | None,
    sinks: torch.Tensor | None = None,  # (Hq,)
) -> torch.Tensor:  # (nd, Hq, D)
    """Decode attention over each sequence's live blocks with plain batched matmuls.

    For one query row per sequence this beats the fused SDPA kernels on CPU, whose setup cost
    dominates at these sizes. Softmax runs in float32.
    """
    nd, hq, d = q.shape
    _, _, bs, hk, _ = kv_cache.shape
    mb = block_tables.shape[1]
    g = hq // hk
    L = mb * bs
    # (nd * Hk, L, D): only the live blocks, heads split out so that plain bmm runs each (seq, head)
    flat = block_tables.reshape(-1)  # index_select copies whole blocks: far cheaper than fancy indexing
    if kv_quant.is_8bit(kv_cache):
        kc = kv_quant.dequantize(kv_quant.select_blocks(kv_cache[0], flat), q.dtype)
        vc = kv_quant.dequantize(kv_quant.select_blocks(kv_cache[1], flat), q.dtype)
    else:
        kc, vc = kv_cache[0].index_select(0, flat), kv_cache[1].index_select(0, flat)
    kc = kc.view(nd, L, hk, d).transpose(1, 2).reshape(nd * hk, L, d)
    vc = vc.view(nd, L, hk, d).transpose(1, 2).reshape(nd * hk, L, d)
    qg = q.to(kc.dtype).reshape(nd * hk, g, d)
    scores = torch.bmm(qg, kc.transpose(1, 2)).float().mul_(scale).view(nd, hk, g, L)
    pos = torch.arange(L, device=q.device)
    lens = context_lens[:, None]
    mask = pos[None, :] < lens  # (nd, L)
    if sliding_window is not None:
        mask &= pos[None, :] >= lens - sliding_window
    scores.masked_fill_(~mask[:, None, None, :], float("-inf"))
    if sinks is not None:
        column = sinks.float().view(1, hk, g, 1).expand(nd, hk, g, 1)
        probs = torch.cat([scores, column], dim=-1).softmax(dim=-1)[..., :L]
    else:
        probs = scores.softmax(dim=-1)
    probs = probs.to(vc.dtype).reshape(nd * hk, g, L)
    o = torch.bmm(probs, vc)  # (nd * Hk, G, D)
    return o.reshape(nd, hq, d).to(q.dtype)


def paged_attention(
    q: torch.Tensor,  # (T, Hq, D)
    k: torch.Tensor,  # (T, Hk, D) the new tokens' keys (already written to the cache)
    v: torch.Tensor,  # (T, Hk, D)
    kv_cache: torch.Tensor,  # (2, num_blocks, block_size, Hk, D)
    meta: AttentionMetadata,
    scale: float,
    sliding_window: int | None,
    sinks: torch.Tensor | None = None,  # (Hq,) attention sinks (gpt-oss), or None
) -> torch.Tensor:  # (T, Hq, D)
    if meta.backend == "triton":
        return _triton_paged_attention(q, kv_cache, meta, scale, sliding_window, sinks)
    out = torch.empty_like(q)
    nd = meta.num_decode
    if nd:
        assert meta.decode_block_tables is not None and meta.decode_context_lens is not None
        out[:nd] = _decode_attention(
            q[:nd], kv_cache, meta.decode_block_tables, meta.decode_context_lens, scale, sliding_window, sinks
        )
    prefill_attention(q, k, v, kv_cache, meta.prefills, scale, sliding_window, out, sinks, meta.causal)
    return out


def prefill_attention(
    q: torch.Tensor,  # (T, Hq, D)
    k: torch.Tensor,  # (T, Hk, D) the new tokens' keys (already written to the cache)
    v: torch.Tensor,  # (T, Hk, D)
    kv_cache: torch.Tensor,  # (2, num_blocks, block_size, Hk, D)
    prefills: list[PrefillSeq],
    scale: float,
    sliding_window: int | None,
    out: torch.Tensor,  # (T, Hq, D): each prefill's rows written
    sinks: torch.Tensor | None = None,  # (Hq,)
    causal: bool = True,
) -> None:
    """Causal attention of each prefill chunk over its cached prefix and itself (PyTorch SDPA; with sinks,
    the explicit softmax of :func:`attention_with_sinks`). An 8-bit cache is read back for the chunk's own
    keys too, so that a prompt's answer does not depend on how it was chunked or whether its prefix was
    cached. Not ``causal``: whole sequences (start 0), each row sees every row of its sequence, or in a
    sliding layer those within ``sliding_window // 2`` positions either side (transformers' bidirectional
    window, Gemma 3's ``use_bidirectional_attention``)."""
    gqa = q.shape[1] != k.shape[1]
    fresh_ok = not kv_quant.is_8bit(kv_cache)
    for p in prefills:
        rows = slice(p.q_start, p.q_start + p.q_len)
        qs = q[rows].transpose(0, 1).unsqueeze(0)  # (1, Hq, n, D)
        total = p.start + p.q_len
        if p.start == 0 and fresh_ok:
            ks, vs = k[rows], v[rows]
        else:
            ks = gather_tokens(kv_cache[0], p.block_table, total, q.dtype)
            vs = gather_tokens(kv_cache[1], p.block_table, total, q.dtype)
        ks = ks.transpose(0, 1).unsqueeze(0).to(qs.dtype)  # (1, Hk, total, D)
        vs = vs.transpose(0, 1).unsqueeze(0).to(qs.dtype)
        if p.start == 0 and sliding_window is None and sinks is None:
            o = F.scaled_dot_product_attention(qs, ks, vs, is_causal=causal, scale=scale, enable_gqa=gqa)
        else:
            qpos = torch.arange(p.start, total, device=q.device)[:, None]
            kpos = torch.arange(total, device=q.device)[None, :]
            if causal:
                mask = kpos <= qpos
                if sliding_window is not None:
                    mask &= kpos > qpos - sliding_window
            else:
                assert p.start == 0, "bidirectional attention runs on whole sequences"
                mask = (kpos - qpos).abs() <= (total if sliding_window is None else sliding_window // 2)
            if sinks is not None:
                o = attention_with_sinks(qs, ks, vs, mask, scale, sinks)
            else:
                o = F.scaled_dot_product_attention(qs, ks, vs, attn_mask=mask, scale=scale, enable_gqa=gqa)
        out[rows] = o[0].transpose(0, 1)


def attention_with_sinks(
    q: torch.Tensor,  # (B, Hq, n, D)
    k: torch.Tensor,  # (B, Hk, L, D)
    v: torch.Tensor,  # (B, Hk, L, D)
    mask: torch.Tensor,  # (n, L) bool: True where a query sees a key
    scale: float,
    sinks: torch.Tensor,  # (Hq,)
) -> torch.Tensor:  # (B, Hq, n, D)
    """Attention whose softmax has each head's sink logit as one more column (dropped after), in the order
    of transformers' eager gpt-oss attention: scores, mask, the sink column, the row max off, softmax (in
    float32). GQA without copies: each kv head's g query heads as one batch of g n rows."""
    b, hq, n, d = q.shape
    hk = k.shape[1]
    qg = q.reshape(b, hk, hq // hk, n, d)
    scores = torch.matmul(qg, k.unsqueeze(2).transpose(3, 4)).float() * scale  # (B, Hk, g, n, L)
    scores = scores.masked_fill(~mask, float("-inf"))
    column = sinks.float().view(1, hk, hq // hk, 1, 1).expand(*scores.shape[:-1], 1)
    logits = torch.cat([scores, column], dim=-1)
    logits = logits - logits.max(dim=-1, keepdim=True).values
    probs = logits.softmax(dim=-1)[..., :-1]
    return torch.matmul(probs.to(v.dtype), v.unsqueeze(2)).view(b, hq, n, d)


def _triton_paged_attention(
    q: torch.Tensor,  # (T, Hq, D)
    kv_cache: torch.Tensor,  # (2, num_blocks, block_size, Hk, D)
    meta: AttentionMetadata,
    scale: float,
    sliding_window: int | None,
    sinks: torch.Tensor | None,  # (Hq,)
) -> torch.Tensor:  # (T, Hq, D)
    from glassbox.kernels import triton_attention as ta

    dtype = q.dtype
    if not kv_quant.is_8bit(kv_cache):  # a 16-bit cache's dtype runs the dots; an 8-bit one's codes take q's
        q = q.to(kv_cache.dtype)
    q = q.contiguous()
    out = torch.empty_like(q)
    nd = meta.num_decode
    if nd:
        assert meta.decode_block_tables is not None and meta.decode_context_lens is not None
        ta.decode_attention(
            q[:nd], kv_cache[0], kv_cache[1], meta.decode_block_tables, meta.decode_context_lens,
            scale, sliding_window, out[:nd], sinks=sinks,
        )  # fmt: skip
    pp = meta.paged_prefill
    if pp is not None and q.shape[0] > nd:
        ta.prefill_attention(
            q[nd:], kv_cache[0], kv_cache[1], pp.block_tables, pp.tile_seq, pp.tile_m, pp.q_start,
            pp.q_len, pp.ctx, scale, sliding_window, out[nd:], pp.block_m, sinks,
        )  # fmt: skip
    return out.to(dtype)
