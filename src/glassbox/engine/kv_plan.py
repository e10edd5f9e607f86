"""KV cache sizing, shared by the engine at start and the planner (torch-free).

Bytes per token come from the model description (``ModelFacts.kv_bytes_per_token``: every layer's K and
V); this turns a byte budget into whole blocks of ``block_size`` token slots. A hybrid model's recurrent
states (``HybridSpec.state_bytes``, one slot per running sequence) come out of the same budget first.
"""

from __future__ import annotations

from dataclasses import dataclass

GiB = 1 << 30


@dataclass(frozen=True)
class KVCachePlan:
    num_blocks: int
    block_size: int
    bytes_per_block: int
    num_state_slots: int = 0  # hybrid models: recurrent-state slots (at most one per running sequence)
    bytes_per_state: int = 0  # one slot's state in every state-holding layer

    @property
    def num_tokens(self) -> int:
        return self.num_blocks * self.block_size

    @property
    def gib(self) -> float:
        return self.num_blocks * self.bytes_per_block / GiB

    @property
    def state_gib(self) -> float:
        return self.num_state_slots * self.bytes_per_state / GiB


def blocks_that_fit(budget_bytes: float, bytes_per_token: float, block_size: int) -> int:
    """Whole KV blocks of ``block_size`` token slots in ``budget_bytes`` (0 when none fits)."""
    if budget_bytes <= 0:
        return 0
    return int(budget_bytes // (bytes_per_token * block_size))


def plan_kv_cache(budget_bytes: float, bytes_per_token: float, block_size: int) -> KVCachePlan:
    """The engine's cache: as many blocks as fit in ``budget_bytes``, at least one."""
    blocks = max(1, blocks_that_fit(budget_bytes, bytes_per_token, block_size))
    return KVCachePlan(blocks, block_size, round(bytes_per_token * block_size))


def plan_hybrid_cache(
    budget_bytes: float, bytes_per_token: float, block_size: int, bytes_per_state: int, max_num_seqs: int
) -> KVCachePlan:
    """A hybrid model's cache: a state slot for each of ``max_num_seqs`` sequences (fewer where the budget
    cannot give each slot a KV block too, at least one), then as many KV blocks as the rest holds."""
    per_block = bytes_per_token * block_size
    slots = max(1, min(max_num_seqs, int(budget_bytes // (bytes_per_state + per_block))))
    blocks = max(1, blocks_that_fit(budget_bytes - slots * bytes_per_state, bytes_per_token, block_size))
    return KVCachePlan(blocks, block_size, round(per_block), slots, bytes_per_state)


def plan_cache(
    budget_bytes: float, bytes_per_token: float, block_size: int, bytes_per_state: int, max_num_seqs: int
) -> KVCachePlan:
    """:func:`plan_kv_cache`, or for a hybrid model (``bytes_per_state`` > 0) :func:`plan_hybrid_cache`."""
    if bytes_per_state:
        return plan_hybrid_cache(budget_bytes, bytes_per_token, block_size, bytes_per_state, max_num_seqs)
    return plan_kv_cache(budget_bytes, bytes_per_token, block_size)


def fixed_plan(
    num_blocks: int, block_size: int, bytes_per_block: int, bytes_per_state: int, max_num_seqs: int
) -> KVCachePlan:
    """``num_blocks`` blocks as configured (--num-kv-blocks), and a hybrid model's state slots for
    ``max_num_seqs`` sequences beside them."""
    slots = max_num_seqs if bytes_per_state else 0
    return KVCachePlan(num_blocks, block_size, bytes_per_block, slots, bytes_per_state)


# The CPU cache by default (no --kv-cache-memory-gib / --num-kv-blocks): what --max-num-seqs sequences of
# --max-model-len tokens need, at most DEFAULT_KV_TOKENS token slots (at least one whole sequence), and never
# more than a quarter of the available RAM or 4 GiB (vLLM's CPU default). The token cap is what lets several
# models sit side by side: the demo model's server held 1.6 GB of KV at 256 x 2048 tokens, now 96 MiB.
DEFAULT_KV_TOKENS = 32768
CPU_KV_RAM_SHARE = 0.25
CPU_KV_MAX_BYTES = 4 * GiB
MIN_KV_BLOCKS = 64


def default_kv_tokens(max_model_len: int, max_num_seqs: int) -> int:
    """Token slots the cache gets by default (see DEFAULT_KV_TOKENS)."""
    return min(max_num_seqs * max_model_len, max(max_model_len, DEFAULT_KV_TOKENS))


def cpu_kv_budget(
    bytes_per_token: float,
    block_size: int,
    max_model_len: int,
    max_num_seqs: int,
    available_ram: int,
    bytes_per_state: int = 0,
) -> int:
    """The CPU cache's default bytes: ``default_kv_tokens`` worth (at least MIN_KV_BLOCKS blocks) and a hybrid
    model's state slot for each sequence (``bytes_per_state``), capped by CPU_KV_RAM_SHARE of the available
    RAM and CPU_KV_MAX_BYTES."""
    tokens = max(default_kv_tokens(max_model_len, max_num_seqs), MIN_KV_BLOCKS * block_size)
    wanted = tokens * bytes_per_token + max_num_seqs * bytes_per_state
    return int(min(available_ram * CPU_KV_RAM_SHARE, CPU_KV_MAX_BYTES, wanted))
