"""A decoder family's own forward run as an encoder: whole sequences in one pass, final hidden states out.

The family's layers write each token's K/V into a cache as they go; here that cache is one scratch buffer
of exactly the batch's tokens, shared by every layer and dropped after the pass: prefill attention on whole
sequences (start 0) attends to the fresh K/V and never reads it back, so nothing is kept. ``causal=False``
runs bidirectional attention (Gemma 3's ``use_bidirectional_attention``: layers/attention.prefill_attention).
"""

from __future__ import annotations

import torch

from glassbox.layers.attention import AttentionMetadata, PrefillSeq
from glassbox.layers.encoder_attention import Segments
from glassbox.models.causal_lm import CausalLM


def decoder_hidden(
    model: CausalLM, input_ids: torch.Tensor, seg: Segments, causal: bool, dtype: torch.dtype
) -> torch.Tensor:
    """(T,) ids of whole sequences laid end to end -> (T, hidden) final (normed) hidden states; ``dtype``:
    the model's activations (the scratch K/V's)."""
    cfg = model.config
    dev = input_ids.device
    t = seg.num_tokens
    scratch = torch.empty((2, t, 1, cfg.num_kv_heads, cfg.head_dim), dtype=dtype, device=dev)
    empty = torch.zeros(0, dtype=torch.long, device=dev)  # block tables: never read at start 0
    meta = AttentionMetadata(
        slot_mapping=torch.arange(t, device=dev),  # (T,) one slot per token, block size 1
        prefills=[PrefillSeq(off, n, 0, empty) for off, n in zip(seg.offsets, seg.lens, strict=True)],
        backend="torch",
        causal=causal,
    )
    caches = [scratch] * cfg.num_layers  # every layer writes the same scratch; nothing reads it
    return model(input_ids, seg.position, caches, meta)
