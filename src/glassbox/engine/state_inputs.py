"""A hybrid model's caches and a step's state layout, for engine/torch_executor.py.

Each layer gets the cache its mixer reads (the model zips its layers with this list): an attention layer
its paged KV tensor, a Mamba-2 / Gated DeltaNet layer its float32 state rows (num_state_slots, conv +
recurrent elements; layers/state_cache.py), an FFN-only block (Nemotron-H's MLP / MoE) an empty tensor.
"""

from __future__ import annotations

import logging

import torch

from glassbox.config import EngineConfig
from glassbox.engine.kv_plan import KVCachePlan
from glassbox.engine.scheduler import ScheduledSeq
from glassbox.layers.host import to_device
from glassbox.layers.state_cache import StateBatch, StatePrefill
from glassbox.models.facts import ModelFacts
from glassbox.models.model_config import ModelConfig

logger = logging.getLogger(__name__)

STATE_DTYPE = torch.float32
STATE_BYTES = 4  # the engine keeps conv windows and recurrent matrices in float32 (HybridSpec.state_bytes)


def prefix_caching(config: EngineConfig, facts: ModelFacts) -> bool:
    """Whether the engine caches prefixes for this model; ValueError for a setting a hybrid model cannot
    run. A hybrid model's recurrent state after a prefix cannot be rebuilt from cached KV blocks, and no
    state checkpoints are kept yet: its prefix caching is off, and the log says so."""
    if facts.hybrid is None:
        return config.enable_prefix_caching
    if config.speculative is not None:
        raise ValueError(
            "--speculative-config: speculative decoding of a hybrid model (Mamba-2 / Gated DeltaNet layers, "
            "a recurrent state per sequence) is not supported yet"
        )
    if config.enable_prefix_caching:
        logger.warning(
            "prefix caching is off for this hybrid model: its recurrent state after a shared prefix cannot "
            "be rebuilt from cached KV blocks (state checkpoints are not kept yet); every prompt is computed"
        )
    return False


def state_bytes(mc: ModelConfig) -> int:
    """One sequence's state in the engine's cache (float32 throughout); 0 for a model without states."""
    return mc.hybrid.state_bytes(STATE_BYTES, STATE_BYTES) if mc.hybrid is not None else 0


def layer_caches(
    mc: ModelConfig, kv_shape: tuple[int, ...], kv_dtype: torch.dtype, plan: KVCachePlan, device: torch.device
) -> list[torch.Tensor]:
    """One cache per layer: KV (``kv_shape``) for attention layers; for a hybrid model also state rows."""
    if mc.hybrid is None:
        return [torch.zeros(kv_shape, dtype=kv_dtype, device=device) for _ in range(mc.num_layers)]
    logger.info(
        "recurrent states: %d slots x %.2f MiB = %.3f GiB (float32, %d layers)",
        *(plan.num_state_slots, plan.bytes_per_state / 2**20, plan.state_gib, mc.hybrid.state_layers()),
    )
    caches = []
    for kind, (conv, ssm) in zip(mc.hybrid.layer_mixers, mc.hybrid.layer_state_elements(), strict=True):
        if kind in ("full", "sliding"):
            caches.append(torch.zeros(kv_shape, dtype=kv_dtype, device=device))
        elif conv + ssm:
            caches.append(torch.zeros(plan.num_state_slots, conv + ssm, dtype=STATE_DTYPE, device=device))
        else:
            caches.append(torch.empty(0, device=device))
    return caches


def state_batch(
    decodes: list[ScheduledSeq], prefills: list[ScheduledSeq], device: torch.device
) -> StateBatch:
    """The state layout of a step whose rows are ``decodes`` (one token each) then ``prefills``."""
    slots: list[int] = []
    for s in decodes:
        assert s.num_new_tokens == 1 and s.seq.state_slot is not None, (
            "a hybrid decode row: one token, a slot"
        )
        slots.append(s.seq.state_slot)
    batch = StateBatch(to_device(slots, torch.long, device), len(decodes))
    row = len(decodes)
    for s in prefills:
        assert s.seq.state_slot is not None, "a scheduled sequence of a hybrid model holds a state slot"
        batch.prefills.append(StatePrefill(row, s.num_new_tokens, s.seq.state_slot, s.start == 0))
        row += s.num_new_tokens
    return batch
