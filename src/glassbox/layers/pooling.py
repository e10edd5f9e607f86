"""Pooling: one vector per sequence from its token rows, in sentence-transformers' modes.

Rows are whole sequences laid end to end (layers/encoder_attention.Segments), so no mask is needed: each
sequence's rows are exactly its tokens. Sums accumulate in float32 (as sentence-transformers does for 16-bit
inputs); the result is float32.
"""

from __future__ import annotations

import torch

from glassbox.layers.encoder_attention import Segments

# sentence-transformers' names; several modes concatenate their vectors in the order given
POOLING_MODES = ("cls", "max", "mean", "mean_sqrt_len_tokens", "weightedmean", "lasttoken")


def pool(hidden: torch.Tensor, seg: Segments, modes: tuple[str, ...]) -> torch.Tensor:
    """(T, H) token rows -> (N, H * len(modes)) float32, one row per sequence."""
    unknown = [m for m in modes if m not in POOLING_MODES]
    if unknown or not modes:
        raise ValueError(f"pooling modes must be some of {POOLING_MODES}, got {modes}")
    rows = hidden.float()
    n, width = len(seg.lens), rows.shape[1]
    lens = seg.count.float()[:, None]  # (N, 1)
    out = []
    total: torch.Tensor | None = None
    for mode in modes:
        if mode == "cls":
            out.append(rows.index_select(0, seg.first))
        elif mode == "lasttoken":
            out.append(rows.index_select(0, seg.first + seg.count - 1))
        elif mode == "max":
            init = rows.new_full((n, width), float("-inf"))
            out.append(init.scatter_reduce(0, seg.owner[:, None].expand_as(rows), rows, reduce="amax"))
        elif mode in ("mean", "mean_sqrt_len_tokens"):
            if total is None:
                total = rows.new_zeros(n, width).index_add_(0, seg.owner, rows)
            out.append(total / (lens if mode == "mean" else lens.sqrt()))
        else:  # weightedmean: token i (from 1) of a sequence weighs i
            weight = (seg.position + 1).float()[:, None]  # (T, 1)
            num = rows.new_zeros(n, width).index_add_(0, seg.owner, rows * weight)
            out.append(num / (lens * (lens + 1) / 2))
    return out[0] if len(out) == 1 else torch.cat(out, dim=-1)
