"""The paged KV cache's tensors, one per layer, shaped as each layer's attention needs them.

Every layer's cache is (2, blocks, block_size, KV heads, row width) with the same blocks (one block table
per sequence serves all layers). Heads and widths may differ by layer (Gemma 4's full layers), and a layer
that attends over another's K/V (``ModelFacts.kv_owner``: Gemma 4's shared KV) holds no cache of its own:
its entry is its owner's tensor, so the list keeps one entry per layer and the bytes per token slot are
``ModelFacts.kv_bytes_per_token``'s.
"""

from __future__ import annotations

from collections.abc import Callable

import torch

from glassbox.layers.kv_quant import row_width
from glassbox.models.model_config import ModelConfig

# the widest head the Triton attention kernels are compiled and checked for (tests/kernels/test_triton_compile.py)
TRITON_MAX_HEAD_DIM = 256


def widest_head(cfg: ModelConfig) -> int:
    """The largest head dim of any layer."""
    return max(cfg.kv_shape(i)[1] for i in range(cfg.num_layers))


def kv_cache_tensors(
    cfg: ModelConfig,
    blocks: int,
    block_size: int,
    dtype: torch.dtype,
    device: torch.device,
    kv_heads: Callable[[int], int] | None = None,
    one_per_shape: bool = False,
) -> list[torch.Tensor]:
    """Zeroed caches, one entry per layer (a layer sharing another's KV: the owner's tensor). ``kv_heads``:
    layer -> a tensor-parallel rank's KV heads of it, else each layer's own; ``one_per_shape``: layers of
    one shape share one tensor (a scratch cache for a forward that only needs the shapes right)."""
    caches: list[torch.Tensor] = []
    by_shape: dict[tuple[int, ...], torch.Tensor] = {}
    for layer in range(cfg.num_layers):
        owner = cfg.kv_owner(layer)
        if owner != layer:
            caches.append(caches[owner])
            continue
        heads, dim = cfg.kv_shape(layer)
        shape = (2, blocks, block_size, heads if kv_heads is None else kv_heads(layer), row_width(dim, dtype))
        if one_per_shape and shape in by_shape:
            caches.append(by_shape[shape])
            continue
        cache = torch.zeros(shape, dtype=dtype, device=device)
        by_shape[shape] = cache
        caches.append(cache)
    return caches
