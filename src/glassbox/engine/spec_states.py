"""Speculative decoding of hybrid models: the recurrent states of a verify step's draft positions.

A verify step runs a sequence's last token and its k drafts as 1 + k decode rows. An attention layer keeps
the K/V of every row and the scheduler trims what was rejected; a Mamba-2 / Gated DeltaNet layer keeps one
state per sequence, so after j accepted drafts it must hold the state after row j, not after row k (vLLM
keeps the per-position states of the verify rows and commits the accepted one; this does the same). Here:

- each state slot has ``per_slot`` (= num_speculative_tokens) scratch rows in every state tensor, after the
  slots and the checkpoint rows: rows [base + slot * per_slot, base + (slot + 1) * per_slot);
- the rows of a verify step step one position at a time (layers/state_cache.DecodeWave, built by
  engine/state_inputs.verify_waves): row i < n - 1 of a sequence with n rows writes its conv window and
  recurrent state to scratch row i, its last row to the slot itself, each starting from the state the row
  before left;
- when the step's acceptance is known (Scheduler.update), a sequence that accepted j < n - 1 drafts gets
  the copy scratch row j -> slot (BlockManager.keep_state), run at the start of the next step before
  anything else reads the slot (before the checkpoint saves and restores); with prefix caching, a block
  boundary the step passed without ending on it gets its tail checkpoint from the scratch row before it.

Memory: per_slot more state rows per slot, each a full state (HybridSpec.state_bytes, float32), out of the
same budget as the KV blocks (engine/state_inputs.state_bytes).
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class ScratchRows:
    """Where each slot's scratch rows lie in the state tensors."""

    base: int  # the first scratch row: after the slots and the checkpoint rows
    per_slot: int  # scratch rows per slot: the most drafts a sequence verifies in one step

    def row(self, slot: int, position: int) -> int:
        """The scratch row holding the state after row ``position`` (< per_slot) of ``slot``'s verify rows."""
        assert 0 <= position < self.per_slot, "a draft position past the scratch rows"
        return self.base + slot * self.per_slot + position

    def owner(self, row: int) -> int:
        """The slot a scratch row belongs to."""
        return (row - self.base) // self.per_slot
