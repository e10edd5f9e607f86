"""Bidirectional attention over whole sequences laid end to end (encoders: no KV cache, no chunking).

The linears of an encoder run on the flat token rows (T, hidden), so a batch of mixed lengths computes no
padding there; only attention needs each sequence apart. When every sequence has the same length the rows
are viewed as (B, L); otherwise they are scattered into a zero-padded (B, L_max) layout and the padded keys
masked, one SDPA call for the whole batch, then gathered back.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F

from glassbox.layers.host import parts_to_device


@dataclass(frozen=True)
class Segments:
    """Sequences laid end to end: rows [offsets[i], offsets[i] + lens[i]) belong to sequence i."""

    lens: tuple[int, ...]
    offsets: tuple[int, ...]
    max_len: int
    # on the device
    first: torch.Tensor  # (N,) int64: each sequence's first row
    count: torch.Tensor  # (N,) int64: its rows
    owner: torch.Tensor  # (T,) int64: each row's sequence
    position: torch.Tensor  # (T,) int64: each row's position in its sequence, from 0
    index: (
        torch.Tensor | None
    )  # (T,) int64: each row's place in the (B * max_len) padded layout; None: no padding
    key_mask: torch.Tensor | None  # (B, 1, 1, max_len) bool: True on real keys; None: no padding

    @classmethod
    def build(cls, lens: list[int], device: torch.device) -> Segments:
        if not lens or min(lens) < 1:
            raise ValueError(f"every sequence needs at least one token, got lengths {lens}")
        offsets = [0]
        for n in lens[:-1]:
            offsets.append(offsets[-1] + n)
        width = max(lens)
        owner = [i for i, n in enumerate(lens) for _ in range(n)]
        position = [p for n in lens for p in range(n)]
        index = [i * width + p for i, p in zip(owner, position, strict=True)]
        first, count, owner_t, position_t, index_t = parts_to_device(
            [offsets, lens, owner, position, index], torch.long, device
        )
        if min(lens) == width:
            return cls(tuple(lens), tuple(offsets), width, first, count, owner_t, position_t, None, None)
        key_mask = (torch.arange(width, device=device)[None, :] < count[:, None])[:, None, None, :]
        return cls(tuple(lens), tuple(offsets), width, first, count, owner_t, position_t, index_t, key_mask)

    @property
    def num_tokens(self) -> int:
        return sum(self.lens)


def encoder_attention(
    q: torch.Tensor,  # (T, Hq, D)
    k: torch.Tensor,  # (T, Hk, D)
    v: torch.Tensor,  # (T, Hk, D)
    seg: Segments,
    scale: float,
) -> torch.Tensor:  # (T, Hq, D)
    """Each row attends to every row of its own sequence (no causal mask), softmax(q k^T scale) v."""
    t, hq, d = q.shape
    hk = k.shape[1]
    b, width = len(seg.lens), seg.max_len
    if seg.index is None:  # equal lengths: (B, L, H, D) views, no copies until the transpose
        qs, ks, vs = (x.view(b, width, x.shape[1], d).transpose(1, 2) for x in (q, k, v))
        o = F.scaled_dot_product_attention(qs, ks, vs, scale=scale, enable_gqa=hq != hk)
        return o.transpose(1, 2).reshape(t, hq, d)
    padded = []
    for x in (q, k, v):
        buf = x.new_zeros(b * width, x.shape[1], d)
        buf.index_copy_(0, seg.index, x)
        padded.append(buf.view(b, width, x.shape[1], d).transpose(1, 2))  # (B, H, L, D)
    qs, ks, vs = padded
    o = F.scaled_dot_product_attention(qs, ks, vs, attn_mask=seg.key_mask, scale=scale, enable_gqa=hq != hk)
    return o.transpose(1, 2).reshape(b * width, hq, d).index_select(0, seg.index)
