"""Prefix caching for hybrid models: recurrent-state checkpoints at block boundaries (bookkeeping only).

A hybrid model's state after a prefix cannot be rebuilt from cached KV blocks, so the block manager also
keeps copies of states ("checkpoints"), each the state after the tokens of a full block chain, keyed by
that chain's last block hash; a prefix hit is cut to the deepest cached block that has one, and the
sequence's slot starts as a copy of it. The copies are rows of the same per-layer state tensors as the
running slots: rows [num_slots, num_slots + num_rows).

What is kept, per sequence (vLLM's "align" mode keeps one per prompt; this adds the end of each
conversation turn, which an agent's next turn extends):
- the prompt checkpoint: the state after the last block boundary below the prompt's last token, B =
  ((prompt length - 1) // block_size) * block_size (the scheduler ends a prompt chunk there, so that the
  state exists), which a later request repeating or extending the prompt hits;
- one tail checkpoint: the state at the latest block boundary its decode passed (each new one replaces
  the previous), which is the end of the turn when the sequence finishes.
Checkpoints are evicted least recently used first, and dropped with their block when the block is reused.

Copies run on the device at the start of the next step (the executor, ``SchedulerOutput``): saves (a
running slot's state to a checkpoint row, decided when the step that reached the boundary is committed)
before restores (a checkpoint row to the slot of a sequence admitted with a hit), so that a checkpoint
saved and hit in the same schedule is written before it is read.
"""

from __future__ import annotations

from collections import OrderedDict
from dataclasses import dataclass, field


@dataclass
class StateCheckpoints:
    num_slots: int  # running slots: rows [0, num_slots); checkpoint rows follow
    num_rows: int  # checkpoint rows
    rows: OrderedDict[int, int] = field(default_factory=OrderedDict)  # block hash -> row, oldest first
    free_rows: list[int] = field(init=False)
    tails: dict[int, int] = field(default_factory=dict)  # seq_id -> hash of its tail checkpoint
    saves: list[tuple[int, int]] = field(default_factory=list)  # (slot, row) to copy at the next step
    restores: list[tuple[int, int]] = field(default_factory=list)  # (row, slot) to copy after the saves
    hits: int = 0  # sequences admitted with a restored state
    saved: int = 0  # checkpoints written

    def __post_init__(self) -> None:
        self.free_rows = list(range(self.num_slots + self.num_rows - 1, self.num_slots - 1, -1))

    def deepest(self, hashes: list[int]) -> int:
        """How many of a prefix's leading cached blocks (by ``hashes``) a hit may use: up to the deepest
        one with a checkpoint (0: none)."""
        for i in range(len(hashes) - 1, -1, -1):
            if hashes[i] in self.rows:
                return i + 1
        return 0

    def restore(self, block_hash: int, slot: int) -> None:
        """The checkpoint after block ``block_hash`` starts ``slot``'s state (a prefix hit)."""
        self.rows.move_to_end(block_hash)
        self.restores.append((self.rows[block_hash], slot))
        self.hits += 1

    def save(self, seq_id: int, slot: int, block_hash: int, tail: bool) -> None:
        """Keep ``slot``'s current state as the checkpoint after block ``block_hash``; a ``tail`` one
        replaces the sequence's previous tail."""
        if tail:
            old = self.tails.pop(seq_id, None)
            if old is not None and old != block_hash:
                self.drop(old)
            self.tails[seq_id] = block_hash
        if block_hash in self.rows:  # already kept (a repeated prefix): the same state
            self.rows.move_to_end(block_hash)
            return
        if not self.free_rows:
            if not self.rows:
                return
            self.drop(next(iter(self.rows)))  # least recently used
        row = self.free_rows.pop()
        self.rows[block_hash] = row
        self.saves.append((slot, row))
        self.saved += 1

    def drop(self, block_hash: int) -> None:
        """Forget the checkpoint after ``block_hash`` (its block was reused, or a newer tail replaced it)."""
        row = self.rows.pop(block_hash, None)
        if row is not None:
            self.free_rows.append(row)

    def forget(self, seq_id: int) -> None:
        """A sequence ended or was preempted: its tail checkpoint stays cached, no longer replaced."""
        self.tails.pop(seq_id, None)

    def take_copies(self) -> tuple[list[tuple[int, int]], list[tuple[int, int]]]:
        """(saves, restores) since the last call, for the next step to run in that order; each
        destination once (the last copy to it wins, as if they ran one by one)."""
        saves = list({dst: (src, dst) for src, dst in self.saves}.values())
        restores = list({dst: (src, dst) for src, dst in self.restores}.values())
        self.saves, self.restores = [], []
        return saves, restores

    def check_integrity(self, cached: dict[int, int]) -> None:
        used = list(self.rows.values())
        assert len(set(used)) == len(used), "a checkpoint row holds two checkpoints"
        assert not set(used) & set(self.free_rows), "a checkpoint row both used and free"
        assert len(used) + len(self.free_rows) == self.num_rows, "a checkpoint row lost"
        assert all(self.num_slots <= r < self.num_slots + self.num_rows for r in used + self.free_rows)
        assert all(h in cached for h in self.rows), "a checkpoint outlived its block"
