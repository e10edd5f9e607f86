"""Speculative decoding of hybrid models: the recurrent states of a verify step's draft positions.

A verify step runs a sequence's last token and its k drafts as 1 + k decode rows. An attention layer keeps
the K/V of every row and the scheduler trims what was rejected; a Mamba-2 / Gated DeltaNet layer keeps one
state per sequence, so after j accepted drafts it must hold the state after row j, not after row k (vLLM
keeps the per-position states of the verify rows and commits the accepted one; this does the same). Here:

- each state slot has ``per_slot`` (= num_speculative_tokens) scratch rows in every state tensor, after the
  slots and the checkpoint rows: rows [base + slot * per_slot, base + (slot + 1) * per_slot);
- the rows of a verify step step one position at a time (layers/state_cache.DecodeWave): row i < n - 1 of a
  sequence with n rows writes its conv window and recurrent state to scratch row i, its last row to the
  slot itself, each starting from the state the row before left;
- when the step's acceptance is known (Scheduler.update), a sequence that accepted j < n - 1 drafts gets
  the copy scratch row j -> slot (BlockManager.keep_state), run at the start of the next step before
  anything else reads the slot (before the checkpoint saves and restores).

Memory: per_slot more state rows per slot, each a full state (HybridSpec.state_bytes, float32), out of the
same budget as the KV blocks (engine/state_inputs.state_bytes).
"""

from __future__ import annotations

import itertools
from dataclasses import dataclass
from typing import TYPE_CHECKING

import torch

from glassbox.layers.host import to_device
from glassbox.layers.state_cache import DecodeWave

if TYPE_CHECKING:
    from glassbox.engine.scheduler import ScheduledSeq


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
