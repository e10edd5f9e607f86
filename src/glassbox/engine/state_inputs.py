"""A hybrid model's caches and a step's state layout, for engine/torch_executor.py.

Each layer gets the cache its mixer reads (the model zips its layers with this list): an attention layer
its paged KV tensor, a Mamba-2 / Gated DeltaNet layer its float32 state rows (num_state_slots, conv +
recurrent elements; layers/state_cache.py), an FFN-only block (Nemotron-H's MLP / MoE) an empty tensor.
"""

from __future__ import annotations

import itertools
import logging

import torch

from glassbox.config import EngineConfig
from glassbox.engine.block_manager import BlockManager
from glassbox.engine.kv_plan import KVCachePlan
from glassbox.engine.scheduler import ScheduledSeq, SchedulerOutput
from glassbox.engine.spec_states import ScratchRows
from glassbox.layers.host import to_device
from glassbox.layers.state_cache import DecodeWave, StateBatch, StatePrefill
from glassbox.models.facts import ModelFacts
from glassbox.models.model_config import ModelConfig

logger = logging.getLogger(__name__)

Rows = list[ScheduledSeq]  # a step's sequences, in row order

STATE_DTYPE = torch.float32
STATE_BYTES = 4  # the engine keeps conv windows and recurrent matrices in float32 (HybridSpec.state_bytes)
# with prefix caching, state checkpoints kept per running slot: a running sequence holds up to two (its
# prompt's and its latest tail), and finished ones stay cached until evicted
CHECKPOINTS_PER_SLOT = 2


def prefix_caching(config: EngineConfig, facts: ModelFacts) -> bool:
    """Whether the engine caches prefixes for this model. A hybrid model's prefix hits reach as deep as its
    state checkpoints (engine/state_checkpoints.py), and the log says what is kept."""
    if facts.hybrid is None:
        return config.enable_prefix_caching
    if config.enable_prefix_caching:
        logger.info(
            "prefix caching of a hybrid model: %d state checkpoints per slot, kept at the last block boundary "
            "before each prompt's end and at each sequence's latest one; a hit reaches the deepest of them",
            CHECKPOINTS_PER_SLOT,
        )
    return config.enable_prefix_caching


def spec_rows_per_slot(config: EngineConfig) -> int:
    """Scratch state rows per slot for speculative decoding (engine/spec_states.py): one per draft."""
    return config.speculative.num_speculative_tokens if config.speculative is not None else 0


def state_bytes(mc: ModelConfig, config: EngineConfig) -> int:
    """One slot's share of the state cache (float32 throughout): its state, with prefix caching its
    CHECKPOINTS_PER_SLOT checkpoints, with speculative decoding a scratch state per draft; 0 for a model
    without states."""
    if mc.hybrid is None:
        return 0
    rows = 1 + (CHECKPOINTS_PER_SLOT if config.enable_prefix_caching else 0) + spec_rows_per_slot(config)
    return rows * mc.hybrid.state_bytes(STATE_BYTES, STATE_BYTES)


def _rows_per_slot(plan: KVCachePlan, mc: ModelConfig) -> int:
    assert mc.hybrid is not None
    return plan.bytes_per_state // mc.hybrid.state_bytes(STATE_BYTES, STATE_BYTES)


def executor_scratch(plan: KVCachePlan, mc: ModelConfig, config: EngineConfig) -> ScratchRows | None:
    """The scratch rows the executor's state tensors hold for ``config``'s speculative decoding."""
    return scratch_rows(plan, mc, spec_rows_per_slot(config))


def scratch_rows(plan: KVCachePlan, mc: ModelConfig, spec_rows: int) -> ScratchRows | None:
    """Where a hybrid model's speculative scratch rows lie: the last ``spec_rows`` x slots rows of every
    state tensor (None: no hybrid model or no speculative decoding)."""
    if mc.hybrid is None or not spec_rows:
        return None
    slots = plan.num_state_slots
    return ScratchRows(slots * (_rows_per_slot(plan, mc) - spec_rows), spec_rows)


def block_manager(plan: KVCachePlan, caching: bool, mc: ModelConfig, spec_rows: int = 0) -> BlockManager:
    """The engine's block manager for ``plan``: its blocks, and a hybrid model's state slots, (with prefix
    caching) the state checkpoint rows beside them and (with speculative decoding) the scratch rows."""
    rows = plan.num_state_slots * (_rows_per_slot(plan, mc) - 1 - spec_rows) if mc.hybrid is not None else 0
    bm = BlockManager(
        plan.num_blocks, plan.block_size, caching, num_state_slots=plan.num_state_slots, num_checkpoints=rows
    )
    bm.scratch = scratch_rows(plan, mc, spec_rows)
    return bm


def layer_caches(
    mc: ModelConfig, kv_shape: tuple[int, ...], kv_dtype: torch.dtype, plan: KVCachePlan, device: torch.device
) -> list[torch.Tensor]:
    """One cache per layer: KV (``kv_shape``) for attention layers; for a hybrid model also state rows."""
    if mc.hybrid is None:
        return [torch.zeros(kv_shape, dtype=kv_dtype, device=device) for _ in range(mc.num_layers)]
    rows = plan.num_state_slots * _rows_per_slot(plan, mc)
    logger.info(
        "recurrent states: %d slots + %d checkpoint / speculative scratch rows x %.2f MiB = %.3f GiB (float32, %d layers)",
        *(plan.num_state_slots, rows - plan.num_state_slots, mc.hybrid.state_bytes(STATE_BYTES, STATE_BYTES)
          / 2**20, plan.state_gib, mc.hybrid.state_layers()),
    )  # fmt: skip
    caches = []
    for kind, (conv, ssm) in zip(mc.hybrid.layer_mixers, mc.hybrid.layer_state_elements(), strict=True):
        if kind in ("full", "sliding"):
            caches.append(torch.zeros(kv_shape, dtype=kv_dtype, device=device))
        elif conv + ssm:
            caches.append(torch.zeros(rows, conv + ssm, dtype=STATE_DTYPE, device=device))
        else:
            caches.append(torch.empty(0, device=device))
    return caches


def state_batch(
    decodes: list[ScheduledSeq],
    prefills: list[ScheduledSeq],
    device: torch.device,
    step: SchedulerOutput | None = None,
    scratch: ScratchRows | None = None,
) -> StateBatch:
    """The state layout of a step whose rows are ``decodes`` (one token each, or with speculative decoding
    a token and its drafts: their states in ``scratch``'s rows, engine/spec_states.py) then ``prefills``,
    with ``step``'s state copies (speculative commits, checkpoint saves, then restores)."""
    slots: list[int] = []
    for s in decodes:
        assert s.seq.state_slot is not None, "a hybrid decode row holds a slot"
        assert s.num_new_tokens == 1 or scratch is not None, "a hybrid verify row needs scratch rows"
        slots.append(s.seq.state_slot)
    row = sum(s.num_new_tokens for s in decodes)
    batch = StateBatch(to_device(slots, torch.long, device), row)
    if row > len(decodes):
        assert scratch is not None
        batch.spec_waves = verify_waves(decodes, scratch, device)
    for s in prefills:
        assert s.seq.state_slot is not None, "a scheduled sequence of a hybrid model holds a state slot"
        batch.prefills.append(StatePrefill(row, s.num_new_tokens, s.seq.state_slot, s.start == 0))
        row += s.num_new_tokens
    for copies in (step.state_commits, step.state_saves, step.state_restores) if step is not None else ():
        if copies:
            src, dst = (to_device([c[i] for c in copies], torch.long, device) for i in (0, 1))
            batch.copies.append((src, dst))
    return batch


def verify_waves(decodes: list[ScheduledSeq], scratch: ScratchRows, device: torch.device) -> list[DecodeWave]:
    """The decode rows of a step with drafts (each sequence's rows consecutive, in ``decodes`` order) as waves:
    wave t steps the t-th row of every sequence that has one, from the state row t - 1 left (its slot for
    t = 0), into scratch row t, or into the slot for the sequence's last row."""
    firsts = [0, *itertools.accumulate(s.num_new_tokens for s in decodes)]
    waves = []
    for t in range(max(s.num_new_tokens for s in decodes)):
        rows, dst, src = [], [], []
        for s, first in zip(decodes, firsts, strict=False):
            n, slot = s.num_new_tokens, s.seq.state_slot
            assert slot is not None, "a hybrid decode row holds a state slot"
            if t >= n:
                continue
            assert n - 1 <= scratch.per_slot, "more drafts than scratch rows"
            rows.append(first + t)
            dst.append(slot if t == n - 1 else scratch.row(slot, t))
            src.append(slot if t == 0 else scratch.row(slot, t - 1))
        idx = slice(rows[0], rows[-1] + 1) if rows == list(range(rows[0], rows[-1] + 1)) else None
        copy = None if src == dst else to_device(src, torch.long, device)
        waves.append(
            DecodeWave(idx if idx is not None else to_device(rows, torch.long, device),
                       to_device(dst, torch.long, device), copy)
        )  # fmt: skip
    return waves
