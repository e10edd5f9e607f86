"""Attention over the paged KV cache (reference path: torch SDPA over the live blocks only)."""

from __future__ import annotations

from dataclasses import dataclass, field

import torch
import torch.nn.functional as F


@dataclass
class PrefillSeq:
    """One sequence computing ``q_len`` tokens after ``start`` already-cached tokens."""

    q_start: int  # first row of this sequence in the flat token batch
    q_len: int
    start: int  # tokens already in the cache before this step
    block_table: torch.Tensor  # (num_blocks_for_ctx,) int64


@dataclass
class AttentionMetadata:
    """Per-batch attention layout. Rows [0, num_decode) are decodes (one token each), then prefills."""

    slot_mapping: torch.Tensor  # (T,) int64: flat cache slot (block * block_size + offset) per token
    num_decode: int = 0
    decode_block_tables: torch.Tensor | None = None  # (num_decode, max_blocks) int64, padded with 0
    decode_context_lens: torch.Tensor | None = None  # (num_decode,) int64, tokens incl. the new one
    decode_max_len: int = 0
    prefills: list[PrefillSeq] = field(default_factory=list)


def write_kv(kv_cache: torch.Tensor, k: torch.Tensor, v: torch.Tensor, slots: torch.Tensor) -> None:
    """Store the new tokens' K and V. kv_cache (2, num_blocks, block_size, Hk, D); k, v (T, Hk, D)."""
    _, nb, bs, hk, d = kv_cache.shape
    kv_cache[0].view(nb * bs, hk, d).index_copy_(0, slots, k.to(kv_cache.dtype))
    kv_cache[1].view(nb * bs, hk, d).index_copy_(0, slots, v.to(kv_cache.dtype))


def _gather(cache: torch.Tensor, block_table: torch.Tensor, length: int) -> torch.Tensor:
    """The first ``length`` tokens of one sequence's blocks: (length, Hk, D)."""
    _, bs, hk, d = cache.shape
    return cache[block_table].reshape(-1, hk, d)[:length]


def paged_attention(
    q: torch.Tensor,  # (T, Hq, D)
    k: torch.Tensor,  # (T, Hk, D) the new tokens' keys (already written to the cache)
    v: torch.Tensor,  # (T, Hk, D)
    kv_cache: torch.Tensor,  # (2, num_blocks, block_size, Hk, D)
    meta: AttentionMetadata,
    scale: float,
    sliding_window: int | None,
) -> torch.Tensor:  # (T, Hq, D)
    out = torch.empty_like(q)
    hq, hk = q.shape[1], k.shape[1]
    gqa = hq != hk
    nd = meta.num_decode
    if nd:
        assert meta.decode_block_tables is not None and meta.decode_context_lens is not None
        _, nb, bs, _, d = kv_cache.shape
        mb = meta.decode_block_tables.shape[1]
        # (nd, mb * bs, Hk, D) -> (nd, Hk, L, D), only the live blocks of each sequence
        kc = kv_cache[0][meta.decode_block_tables].view(nd, mb * bs, hk, d).transpose(1, 2)
        vc = kv_cache[1][meta.decode_block_tables].view(nd, mb * bs, hk, d).transpose(1, 2)
        pos = torch.arange(mb * bs, device=q.device)
        lens = meta.decode_context_lens[:, None]
        mask = pos[None, :] < lens  # (nd, L)
        if sliding_window is not None:
            mask &= pos[None, :] >= lens - sliding_window
        o = F.scaled_dot_product_attention(
            q[:nd].unsqueeze(2).to(kc.dtype),  # (nd, Hq, 1, D)
            kc,
            vc,
            attn_mask=mask[:, None, None, :],
            scale=scale,
            enable_gqa=gqa,
        )
        out[:nd] = o.squeeze(2).to(q.dtype)
    for p in meta.prefills:
        rows = slice(p.q_start, p.q_start + p.q_len)
        qs = q[rows].transpose(0, 1).unsqueeze(0)  # (1, Hq, n, D)
        total = p.start + p.q_len
        if p.start == 0:
            ks, vs = k[rows], v[rows]
        else:
            ks = _gather(kv_cache[0], p.block_table, total)
            vs = _gather(kv_cache[1], p.block_table, total)
        ks = ks.transpose(0, 1).unsqueeze(0).to(qs.dtype)  # (1, Hk, total, D)
        vs = vs.transpose(0, 1).unsqueeze(0).to(qs.dtype)
        if p.start == 0 and sliding_window is None:
            o = F.scaled_dot_product_attention(qs, ks, vs, is_causal=True, scale=scale, enable_gqa=gqa)
        else:
            qpos = torch.arange(p.start, total, device=q.device)[:, None]
            kpos = torch.arange(total, device=q.device)[None, :]
            mask = kpos <= qpos
            if sliding_window is not None:
                mask &= kpos > qpos - sliding_window
            o = F.scaled_dot_product_attention(qs, ks, vs, attn_mask=mask, scale=scale, enable_gqa=gqa)
        out[rows] = o[0].transpose(0, 1)
    return out
