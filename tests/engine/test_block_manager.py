"""BlockManager bookkeeping: ref counts, prefix hashes, LRU reuse, integrity."""

from __future__ import annotations

from glassbox.engine.block_manager import BlockManager
from glassbox.engine.sequence import Sequence
from glassbox.sampling_params import SamplingParams


def _seq(i: int, tokens: list[int]) -> Sequence:
    return Sequence(i, f"r{i}", tokens, SamplingParams())


def _run_prefill(bm: BlockManager, seq: Sequence) -> None:
    bm.allocate(seq)
    bm.grow(seq, len(seq))
    seq.num_computed_tokens = len(seq)
    bm.commit(seq)


def test_allocate_grow_free_keeps_counts() -> None:
    bm = BlockManager(num_blocks=8, block_size=4)
    a = _seq(0, list(range(10)))
    assert bm.can_allocate(a, 10)
    _run_prefill(bm, a)
    assert len(a.block_table) == 3 and bm.num_free_blocks == 5
    bm.check_integrity([a])
    assert bm.can_grow(a, 12) and bm.can_grow(a, 32) and not bm.can_grow(a, 33)
    bm.free_seq(a)
    assert bm.num_free_blocks == 8
    bm.check_integrity([])


def test_prefix_hits_share_blocks_and_exclude_the_last_token() -> None:
    bm = BlockManager(num_blocks=8, block_size=4)
    a = _seq(0, list(range(12)))
    _run_prefill(bm, a)
    b = _seq(1, list(range(12)))  # identical prompt: 3 full blocks, but the last must be recomputed
    assert bm.prefix_hit_tokens(b) == 8
    bm.allocate(b)
    assert b.num_computed_tokens == 8 and b.block_table == a.block_table[:2]
    bm.grow(b, 12)
    bm.check_integrity([a, b])
    assert bm.blocks[a.block_table[0]].ref_count == 2
    c = _seq(2, [99] + list(range(1, 12)))  # differs in the first token: no hit at all
    assert bm.prefix_hit_tokens(c) == 0
    assert bm.stats.hits == 8 and bm.stats.queries == 24  # both prompts were looked up


def test_freed_blocks_stay_cached_until_reused_lru() -> None:
    bm = BlockManager(num_blocks=4, block_size=2)
    a = _seq(0, [1, 2, 3, 4, 5])
    _run_prefill(bm, a)
    bm.free_seq(a)
    assert bm.num_free_blocks == 4 and len(bm.cached) == 2
    b = _seq(1, [1, 2, 3, 4, 9])
    assert bm.prefix_hit_tokens(b) == 4  # the freed blocks are still findable
    # a sequence that needs every block evicts the cached ones
    c = _seq(2, [7] * 8)
    assert bm.can_allocate(c, 8)
    _run_prefill(bm, c)
    assert bm.prefix_hit_tokens(b) == 0
    bm.check_integrity([c])


def test_can_allocate_counts_free_cached_hits() -> None:
    bm = BlockManager(num_blocks=3, block_size=2)
    a = _seq(0, [1, 2, 3, 4, 5])
    _run_prefill(bm, a)
    bm.free_seq(a)
    # 2 hit blocks come out of the free pool, 1 more is needed for tokens 4..5: exactly 3
    b = _seq(1, [1, 2, 3, 4, 5, 6])
    assert bm.can_allocate(b, 2)
    assert not bm.can_allocate(b, 4)


def test_no_caching_when_disabled() -> None:
    bm = BlockManager(num_blocks=8, block_size=2, enable_prefix_caching=False)
    a = _seq(0, [1, 2, 3, 4, 5])
    _run_prefill(bm, a)
    assert bm.cached == {} and bm.prefix_hit_tokens(_seq(1, [1, 2, 3, 4, 5])) == 0
