"""The activation peak a CUDA device must leave room for: one long prefill run before the KV cache exists
(engine/torch_executor.py sizes the cache with the memory it took)."""

from __future__ import annotations

import torch

from glassbox.engine.kv_caches import kv_cache_tensors
from glassbox.kernels.attention_tiles import prefill_block_m
from glassbox.layers.attention import AttentionMetadata, PrefillSeq, build_paged_prefill
from glassbox.layers.state_cache import StateBatch, StatePrefill
from glassbox.models.causal_lm import CausalLM
from glassbox.models.model_config import ModelConfig


def profile_prefill(
    model: CausalLM,
    mc: ModelConfig,
    n: int,
    block_size: int,
    kv_dtype: torch.dtype,
    backend: str,
    dtype: torch.dtype,
    dev: torch.device,
) -> None:
    """A single ``n``-token prefill with no stored context, which exercises the largest activations, and
    the LM head on up to 256 of its rows; the attention reads its n tokens back (Triton, an 8-bit cache)
    from one real cache shared by the layers."""
    nb = -(-n // block_size)
    cache = kv_cache_tensors(mc, nb, block_size, kv_dtype, dev, one_per_shape=True)
    meta = AttentionMetadata(slot_mapping=torch.arange(n, device=dev), backend=backend)
    if mc.hybrid is not None:  # a hybrid model's state layers: one slot each, the prompt from zeros
        widths = [conv + ssm for conv, ssm in mc.hybrid.layer_state_elements()]
        cache = [torch.zeros(1, w, device=dev) if w else c for c, w in zip(cache, widths, strict=True)]
        meta.state = StateBatch(
            torch.zeros(0, dtype=torch.long, device=dev), 0, [StatePrefill(0, n, 0, True)]
        )
    if backend == "triton":
        block_m = prefill_block_m(mc.head_dim, kv_dtype, dtype, dev)
        meta.paged_prefill = build_paged_prefill([(0, n, list(range(nb)))], block_m, dev)
    else:
        meta.prefills = [PrefillSeq(0, n, 0, torch.arange(nb, device=dev))]
    with torch.inference_mode():
        ids = torch.zeros(n, dtype=torch.long, device=dev)
        hidden = model(ids, torch.arange(n, device=dev), cache, meta)
        model.compute_logits(hidden[-min(n, 256) :])
    if dev.type == "cuda":
        torch.cuda.synchronize()
