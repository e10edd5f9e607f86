"""Paged KV blocks and, for hybrid models, recurrent-state slots: allocate, free, ref-count and hash (prefix
caching). Bookkeeping only, no policy."""

from __future__ import annotations

from collections import OrderedDict
from dataclasses import dataclass, field

from glassbox.engine.sequence import Sequence
from glassbox.engine.spec_states import ScratchRows
from glassbox.engine.state_checkpoints import StateCheckpoints


def block_hash(parent: int | None, token_ids: tuple[int, ...]) -> int:
    """Key of a full block: its tokens and everything before them (through the parent's hash)."""
    return hash((parent, token_ids))


@dataclass
class Block:
    block_id: int
    ref_count: int = 0
    hash: int | None = None  # set once the block is full and registered in the prefix cache


@dataclass
class PrefixCacheStats:
    queries: int = 0  # prompt tokens looked up
    hits: int = 0  # prompt tokens served from the cache


@dataclass
class BlockManager:
    """A pool of ``num_blocks`` KV blocks of ``block_size`` tokens.

    Invariants (``check_integrity``): a block is either referenced (ref_count > 0, in no free list) or
    free (ref_count == 0, in ``free``); a free block with a hash is still findable in ``cached`` until
    it is reused (LRU: ``free`` is ordered oldest-freed first).

    Hybrid models (``num_state_slots`` > 0): every sequence that holds blocks also holds one recurrent-state
    slot (the row of each Mamba / Gated DeltaNet layer's state cache it reads and writes), taken with its
    first blocks (``allocate``) and given back with them (``free_seq``); ``can_allocate`` also needs a
    free slot. A slot is either free or held by exactly one sequence. With prefix caching they also keep
    ``num_checkpoints`` state checkpoints at block boundaries (engine/state_checkpoints.py): a prefix hit
    reaches only as deep as a checkpoint, whose state the sequence's slot starts from.
    """

    num_blocks: int
    block_size: int
    enable_prefix_caching: bool = True
    blocks: list[Block] = field(init=False)
    free: OrderedDict[int, None] = field(init=False)
    cached: dict[int, int] = field(init=False)  # hash -> block_id
    stats: PrefixCacheStats = field(default_factory=PrefixCacheStats)
    num_state_slots: int = 0  # hybrid models: recurrent-state slots; 0: the model keeps no state
    free_slots: list[int] = field(init=False)  # a stack: the lowest slot is handed out first
    num_checkpoints: int = 0  # hybrid models with prefix caching: state checkpoint rows after the slots
    checkpoints: StateCheckpoints | None = field(init=False, default=None)
    # hybrid models with speculative decoding: each slot's scratch rows (engine/spec_states.py), and the
    # (scratch row, slot) copies that commit an accepted draft's state, run first in the next step
    scratch: ScratchRows | None = None
    state_commits: list[tuple[int, int]] = field(default_factory=list)

    def __post_init__(self) -> None:
        self.blocks = [Block(i) for i in range(self.num_blocks)]
        self.free = OrderedDict((i, None) for i in range(self.num_blocks))
        self.cached = {}
        self.free_slots = list(range(self.num_state_slots - 1, -1, -1))
        if self.num_state_slots and self.num_checkpoints and self.enable_prefix_caching:
            self.checkpoints = StateCheckpoints(self.num_state_slots, self.num_checkpoints)

    # -- queries -----------------------------------------------------------
    @property
    def num_free_blocks(self) -> int:
        return len(self.free)

    @property
    def usage(self) -> float:
        """Share of blocks held by live sequences (cached-free blocks count as free)."""
        return 1.0 - len(self.free) / self.num_blocks

    @property
    def num_free_slots(self) -> int:
        return len(self.free_slots)

    def blocks_needed(self, num_tokens: int) -> int:
        return (num_tokens + self.block_size - 1) // self.block_size

    def _prefix_hits(self, seq: Sequence) -> tuple[list[int], list[int]]:
        """Cached block ids and hashes for the leading full blocks of ``seq``.

        Only blocks that end before the last token are eligible: at least one token must be computed
        so that the model produces logits for it. A sequence still owed prompt logprobs gets none: their
        positions must be computed (as vLLM skips the lookup for such requests).
        """
        if not self.enable_prefix_caching or seq.needs_prompt_logprobs:
            return [], []
        ids: list[int] = []
        hashes: list[int] = []
        parent: int | None = None
        max_blocks = (len(seq) - 1) // self.block_size
        for i in range(max_blocks):
            h = block_hash(parent, tuple(seq.token_ids[i * self.block_size : (i + 1) * self.block_size]))
            bid = self.cached.get(h)
            if bid is None:
                break
            ids.append(bid)
            hashes.append(h)
            parent = h
        if self.num_state_slots:  # a hybrid model: as deep as a state checkpoint reaches
            keep = self.checkpoints.deepest(hashes) if self.checkpoints is not None else 0
            return ids[:keep], hashes[:keep]
        return ids, hashes

    def prefix_hit_tokens(self, seq: Sequence) -> int:
        return len(self._prefix_hits(seq)[0]) * self.block_size

    # -- allocation (paired: can_* then the act) ----------------------------
    def can_allocate(self, seq: Sequence, num_tokens: int) -> bool:
        """Whether a new (blockless) ``seq`` can get blocks for its first ``num_tokens`` uncached tokens."""
        hit_ids, _ = self._prefix_hits(seq)
        cached_tokens = len(hit_ids) * self.block_size
        # Hits on free cached blocks take them out of the free pool too.
        free_hits = sum(1 for b in hit_ids if self.blocks[b].ref_count == 0)
        need = self.blocks_needed(cached_tokens + num_tokens) - len(hit_ids)
        slot_ok = self.num_state_slots == 0 or bool(self.free_slots)
        return slot_ok and need + free_hits <= len(self.free)

    def allocate(self, seq: Sequence) -> int:
        """Give a blockless ``seq`` its prefix-cache hits; returns the number of cached tokens."""
        assert not seq.block_table, "allocate() is for sequences without blocks"
        hit_ids, hashes = self._prefix_hits(seq)
        for bid in hit_ids:
            self._ref(bid)
        seq.block_table = list(hit_ids)
        seq.block_hashes = list(hashes)
        seq.num_hashed_blocks = len(hit_ids)
        cached = len(hit_ids) * self.block_size
        seq.num_computed_tokens = cached
        if self.num_state_slots:
            assert seq.state_slot is None and self.free_slots, "allocate() without can_allocate()"
            seq.state_slot = self.free_slots.pop()
            if hit_ids and self.checkpoints is not None:  # the slot starts from the hit's checkpoint
                self.checkpoints.restore(hashes[-1], seq.state_slot)
        self.stats.queries += len(seq)
        self.stats.hits += cached
        return cached

    def can_grow(self, seq: Sequence, num_tokens: int) -> bool:
        """Whether ``seq`` can hold ``num_tokens`` tokens in all (blocks beyond its table come from free)."""
        return self.blocks_needed(num_tokens) - len(seq.block_table) <= len(self.free)

    def grow(self, seq: Sequence, num_tokens: int) -> None:
        """Extend ``seq``'s block table to hold ``num_tokens`` tokens."""
        need = self.blocks_needed(num_tokens) - len(seq.block_table)
        assert need <= len(self.free), "grow() without can_grow()"
        for _ in range(need):
            seq.block_table.append(self._take_free())

    def trim(self, seq: Sequence, num_tokens: int) -> None:
        """Give back ``seq``'s blocks past the first ``num_tokens`` tokens (speculative decoding: the slots
        of rejected drafts), newest first. Such blocks were never full of computed tokens: no hash."""
        keep = self.blocks_needed(num_tokens)
        while len(seq.block_table) > keep:
            bid = seq.block_table.pop()
            assert self.blocks[bid].hash is None, "a trimmed block was in the prefix cache"
            self._unref(bid)

    def free_seq(self, seq: Sequence) -> None:
        """Release all of ``seq``'s blocks (newest first, so the oldest prefix stays cached longest)."""
        for bid in reversed(seq.block_table):
            self._unref(bid)
        seq.block_table = []
        seq.block_hashes = []
        seq.num_hashed_blocks = 0
        if seq.state_slot is not None:
            self.free_slots.append(seq.state_slot)
            seq.state_slot = None
        if self.checkpoints is not None:
            self.checkpoints.forget(seq.seq_id)

    def commit(self, seq: Sequence) -> None:
        """Register the blocks that ``seq`` has completely computed in the prefix cache."""
        if not self.enable_prefix_caching:
            return
        full = min(seq.num_computed_tokens // self.block_size, len(seq.block_table))
        bs = self.block_size
        while seq.num_hashed_blocks < full:
            i = seq.num_hashed_blocks
            parent = seq.block_hashes[i - 1] if i > 0 else None
            h = block_hash(parent, tuple(seq.token_ids[i * bs : (i + 1) * bs]))
            bid = seq.block_table[i]
            block = self.blocks[bid]
            if block.hash is None and h not in self.cached:
                block.hash = h
                self.cached[h] = bid
            seq.block_hashes.append(h)
            seq.num_hashed_blocks += 1
        if self.checkpoints is not None:
            self._checkpoint(seq)

    def chunk_end(self, seq: Sequence, start: int, n: int) -> int:
        """Tokens of ``seq`` to compute from ``start``, at most ``n``: a hybrid model's prompt chunk stops at
        the prompt's checkpoint boundary, so that the state there exists (a state checkpoint)."""
        if self.checkpoints is None:
            return n
        boundary = self._prompt_boundary(seq)
        return boundary - start if start < boundary < start + n else n

    def keep_state(self, seq: Sequence, start: int, num_rows: int) -> None:
        """After ``commit``: a hybrid sequence's verify step ran ``num_rows`` rows from position ``start`` and
        its tokens are valid up to its computed count (row ``row``, the last accepted draft). Its slot holds
        the state after the last row, so the state after ``row`` comes back from its scratch row at the
        start of the next step; with prefix caching, a block boundary the step passed (not ended on:
        ``commit`` saved that one) gets its tail checkpoint from the scratch row of the row before it."""
        slot, scratch = seq.state_slot, self.scratch
        if scratch is None or slot is None:
            return
        n = seq.num_computed_tokens
        row = n - start - 1
        if row != num_rows - 1:
            self.state_commits.append((scratch.row(slot, row), slot))
        b = (n - 1) // self.block_size * self.block_size  # the last boundary below n
        prompt = self._prompt_boundary(seq)  # 0: a one-block prompt, never checkpointed (_checkpoint)
        crossed = prompt > 0 and start < b and b > prompt and n % self.block_size != 0
        if self.checkpoints is not None and crossed:
            if len(seq.block_hashes) >= b // self.block_size:
                h = seq.block_hashes[b // self.block_size - 1]
                self.checkpoints.save(seq.seq_id, scratch.row(slot, b - 1 - start), h, tail=True)

    def take_state_commits(self) -> list[tuple[int, int]]:
        """The speculative commits (scratch row, slot) the next step runs before any other state copy."""
        commits, self.state_commits = self.state_commits, []
        return commits

    def take_state_copies(self) -> tuple[list[tuple[int, int]], list[tuple[int, int]]]:
        """(saves, restores) of state rows the next step runs first (engine/state_checkpoints.py)."""
        return self.checkpoints.take_copies() if self.checkpoints is not None else ([], [])

    def _prompt_boundary(self, seq: Sequence) -> int:
        """The last block boundary before the prompt's last token (0: the prompt fits in one block)."""
        return (len(seq.prompt_token_ids) - 1) // self.block_size * self.block_size

    def _checkpoint(self, seq: Sequence) -> None:
        """Keep the state of a sequence whose computed tokens end on a block boundary at or past its
        prompt's: the prompt checkpoint, then each new tail replacing the last."""
        assert self.checkpoints is not None and seq.state_slot is not None
        n, boundary, bs = seq.num_computed_tokens, self._prompt_boundary(seq), self.block_size
        if boundary == 0 or n < boundary or n % bs or len(seq.block_hashes) < n // bs:
            return
        self.checkpoints.save(seq.seq_id, seq.state_slot, seq.block_hashes[n // bs - 1], tail=n > boundary)

    def reset_prefix_cache(self) -> None:
        for h, bid in list(self.cached.items()):
            if self.blocks[bid].ref_count == 0:
                self.blocks[bid].hash = None
                del self.cached[h]
                if self.checkpoints is not None:
                    self.checkpoints.drop(h)

    # -- internals -----------------------------------------------------------
    def _take_free(self) -> int:
        bid, _ = self.free.popitem(last=False)  # least recently freed
        block = self.blocks[bid]
        if block.hash is not None:
            del self.cached[block.hash]
            if self.checkpoints is not None:  # a state after this block is of no use without it
                self.checkpoints.drop(block.hash)
            block.hash = None
        block.ref_count = 1
        return bid

    def _ref(self, bid: int) -> None:
        block = self.blocks[bid]
        if block.ref_count == 0:
            del self.free[bid]
        block.ref_count += 1

    def _unref(self, bid: int) -> None:
        block = self.blocks[bid]
        assert block.ref_count > 0, f"block {bid} freed twice"
        block.ref_count -= 1
        if block.ref_count == 0:
            self.free[bid] = None

    def check_integrity(self, live: list[Sequence] | None = None) -> None:
        """Assert the pool's invariants; with ``live`` also that ref counts equal the block tables' uses and
        that every state slot is free or held by one live sequence (one holding blocks)."""
        assert len(self.blocks) == self.num_blocks
        for b in self.blocks:
            assert b.ref_count >= 0
            assert (b.ref_count == 0) == (b.block_id in self.free), f"block {b.block_id} free-list mismatch"
            if b.hash is not None:
                assert self.cached.get(b.hash) == b.block_id, f"block {b.block_id} hash not indexed"
        for h, bid in self.cached.items():
            assert self.blocks[bid].hash == h
        if self.checkpoints is not None:
            self.checkpoints.check_integrity(self.cached)
        assert len(set(self.free_slots)) == len(self.free_slots), "a state slot free twice"
        assert all(0 <= s < self.num_state_slots for s in self.free_slots), "a free slot out of range"
        # a pending commit: from the slot's own scratch row. It stays due when its sequence ends (a
        # checkpoint save may read the slot after it); the slot's next holder starts from zeros or from a
        # restore, which runs after the commits
        for src, slot in self.state_commits:
            assert self.scratch is not None and self.scratch.owner(src) == slot, "a commit across slots"
        if self.scratch is not None:  # scratch rows after the slots and the checkpoint rows
            assert self.scratch.base >= self.num_state_slots + self.num_checkpoints, "scratch rows overlap"
        if live is not None:
            held = [seq.state_slot for seq in live if seq.state_slot is not None]
            assert len(set(held)) == len(held), "a state slot held by two sequences"
            assert not set(held) & set(self.free_slots), "a held state slot is also free"
            assert len(held) + len(self.free_slots) == self.num_state_slots, "a state slot lost"
            for seq in live:  # hybrid: a sequence holds a slot exactly while it holds blocks
                assert (seq.state_slot is not None) == (self.num_state_slots > 0 and bool(seq.block_table))
            counts = [0] * self.num_blocks
            for seq in live:
                assert len(set(seq.block_table)) == len(seq.block_table), "a block twice in one table"
                for bid in seq.block_table:
                    counts[bid] += 1
            for b in self.blocks:
                assert b.ref_count == counts[b.block_id], f"block {b.block_id}: ref {b.ref_count} != uses"
