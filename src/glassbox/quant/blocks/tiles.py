"""Block weights' rows in tiles of 16 (quant/blocks/weights.py, kernels/cpu_quant.h ``tiled_index``).

An array of N rows of L elements (a weight's code bytes, or its per-block scales, offsets or zero codes)
whose first ``cut`` elements come in segments of ``seg`` (one 16-block chunk: 256 code bytes for 4 bits,
512 for 8, 16 scales) is stored tile after tile, tile t holding rows 16t .. 16t + R - 1 (R = 16, fewer in a
last tile when N is not a multiple of 16) in the tile's 16 L elements: segment s of its row r at (s R + r)
seg, then row r's last L - cut elements (the blocks past the last whole chunk) at cut R + r (L - cut). So a
batch-1 GEMV that takes 16 rows at a time, chunk by chunk, reads its weights front to back: one stream.
The arrays keep their (N, L) shape; only their order changes (no padding: the same bytes).
"""

from __future__ import annotations

import torch

TILE = 16


def _tile_group(g: torch.Tensor, seg: int, cut: int) -> torch.Tensor:
    """(T, R, L) rows, T tiles of R, to the tiles' order, flat."""
    t, r, length = g.shape
    head = g[:, :, :cut].reshape(t, r, cut // seg, seg).transpose(1, 2).reshape(t, r * cut)
    tail = g[:, :, cut:].reshape(t, r * (length - cut))
    return torch.cat([head, tail], dim=1).reshape(-1)


def _untile_group(flat: torch.Tensor, r: int, length: int, seg: int, cut: int) -> torch.Tensor:
    """The inverse of _tile_group: flat tiles of r rows to (T * r, L) rows."""
    g = flat.reshape(-1, r * length)
    t = g.shape[0]
    head = g[:, : cut * r].reshape(t, cut // seg, r, seg).transpose(1, 2).reshape(t, r, cut)
    tail = g[:, cut * r :].reshape(t, r, length - cut)
    return torch.cat([head, tail], dim=2).reshape(t * r, length)


def to_tiles(a: torch.Tensor, seg: int, cut: int) -> torch.Tensor:
    """(N, L) rows to the tiled order, (N, L) (contiguous)."""
    n, length = a.shape
    full = n // TILE * TILE
    parts = [_tile_group(a[:full].reshape(-1, TILE, length), seg, cut)]
    if full < n:
        parts.append(_tile_group(a[full:].reshape(1, n - full, length), seg, cut))
    return torch.cat(parts).reshape(n, length)


def from_tiles(a: torch.Tensor, seg: int, cut: int) -> torch.Tensor:
    """The tiled (N, L) back to rows, (N, L)."""
    n, length = a.shape
    full = n // TILE * TILE
    flat = a.reshape(-1)
    parts = [_untile_group(flat[: full * length], TILE, length, seg, cut)]
    if full < n:
        parts.append(_untile_group(flat[full * length :], n - full, length, seg, cut))
    return torch.cat(parts)


def gather_rows(a: torch.Tensor, rows: torch.Tensor, seg: int, cut: int) -> torch.Tensor:
    """Rows ``rows`` (1-D) of the tiled (N, L) ``a``, (len(rows), L) in value order (an embedding lookup):
    whole segments gathered (each starts at a multiple of ``seg``: every tile's L - cut is a multiple of
    ``seg`` / 16), then the rows' last L - cut elements."""
    n, length = a.shape
    assert TILE * (length - cut) % seg == 0, "tiles that do not start on a segment"
    flat = a.reshape(-1)
    rows = rows.long().reshape(-1, 1)
    t, r = rows // TILE, rows % TILE
    size = (n - t * TILE).clamp(max=TILE)  # rows in the row's tile
    at = t * TILE * length
    segments = flat[: flat.numel() // seg * seg].view(-1, seg)
    s = torch.arange(cut // seg, device=a.device).reshape(1, -1)
    head = segments[(at + (s * size + r) * seg) // seg].reshape(len(rows), cut)
    tail = flat[
        at + cut * size + r * (length - cut) + torch.arange(length - cut, device=a.device).reshape(1, -1)
    ]
    return torch.cat([head, tail], dim=1)
