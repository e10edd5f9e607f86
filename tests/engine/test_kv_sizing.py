"""The CPU KV cache by default holds what --max-num-seqs sequences of --max-model-len tokens need, capped at
engine/kv_plan.DEFAULT_KV_TOKENS token slots, instead of a share of free RAM (the demo model's server held
1.6 GB of cache at 256 x 2048 tokens). Measured on the tensors the engine allocates, against the model
description's KV bytes per token (the planner's formula); --kv-cache-memory-gib still gives more."""

from __future__ import annotations

import pytest

from glassbox import LLM
from glassbox.engine.kv_plan import DEFAULT_KV_TOKENS, GiB
from glassbox.models.config_reader import facts_from_dir
from glassbox.models.sources import DEMO_MODEL_DIR

FACTS = facts_from_dir(DEMO_MODEL_DIR)
MAX_LEN = FACTS.max_context  # 2048


def _held(llm: LLM) -> tuple[int, int]:
    """(token slots, bytes) of the KV cache tensors the engine allocated."""
    ex = llm.engine.executor
    held = sum(t.numel() * t.element_size() for t in ex.kv_caches)
    return ex.num_kv_blocks * ex.block_size, held


@pytest.mark.parametrize(
    ("max_num_seqs", "tokens"),
    [(4, 4 * MAX_LEN), (256, DEFAULT_KV_TOKENS)],  # what 4 sequences need; 256 of them: the cap
    ids=["needed", "capped"],
)
def test_the_cpu_cache_holds_what_the_sequences_need(max_num_seqs: int, tokens: int) -> None:
    llm = LLM(model=str(DEMO_MODEL_DIR), device="cpu", max_num_seqs=max_num_seqs)
    slots, held = _held(llm)
    assert slots == tokens
    assert held == tokens * FACTS.kv_bytes_per_token(2.0)  # bf16 K and V of every layer


def test_kv_cache_memory_gib_gives_more() -> None:
    llm = LLM(model=str(DEMO_MODEL_DIR), device="cpu", max_num_seqs=4, kv_cache_memory_gib=0.25)
    slots, held = _held(llm)
    per_block = FACTS.kv_bytes_per_token(2.0) * 16
    assert slots == int(0.25 * GiB // per_block) * 16 > 4 * MAX_LEN
    assert held <= 0.25 * GiB
