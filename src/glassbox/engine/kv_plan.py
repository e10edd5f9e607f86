"""KV cache sizing, shared by the engine at start and the planner (torch-free).

Bytes per token come from the model description (``ModelFacts.kv_bytes_per_token``: every layer's K and
V); this turns a byte budget into whole blocks of ``block_size`` token slots.
"""

from __future__ import annotations

from dataclasses import dataclass

GiB = 1 << 30


@dataclass(frozen=True)
class KVCachePlan:
    num_blocks: int
    block_size: int
    bytes_per_block: int

    @property
    def num_tokens(self) -> int:
        return self.num_blocks * self.block_size

    @property
    def gib(self) -> float:
        return self.num_blocks * self.bytes_per_block / GiB


def blocks_that_fit(budget_bytes: float, bytes_per_token: float, block_size: int) -> int:
    """Whole KV blocks of ``block_size`` token slots in ``budget_bytes`` (0 when none fits)."""
    if budget_bytes <= 0:
        return 0
    return int(budget_bytes // (bytes_per_token * block_size))


def plan_kv_cache(budget_bytes: float, bytes_per_token: float, block_size: int) -> KVCachePlan:
    """The engine's cache: as many blocks as fit in ``budget_bytes``, at least one."""
    blocks = max(1, blocks_that_fit(budget_bytes, bytes_per_token, block_size))
    return KVCachePlan(blocks, block_size, round(bytes_per_token * block_size))
