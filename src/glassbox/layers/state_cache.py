"""The recurrent-state cache of hybrid models: a step's state layout and each layer's slot rows.

Every state-holding layer (Gated DeltaNet, Mamba-2) owns one float32 tensor (num_slots, conv + ssm
elements): row s is the state of the sequence holding slot s (engine/block_manager.py hands slots out),
[the conv window (K-1, conv_dim) | the recurrent matrices (heads, rows, cols)]. Float32 keeps the
recurrent matrices as transformers does; the conv window holds inputs of the model's dtype, exact in it.

A step's sequences arrive in the executor's row order: decode rows first (one token each, the one-step
recurrence), then prompt chunks (the chunked scan), each starting from its slot's state or, when its
first token is position 0, from zeros (``fresh``). The slot's row is overwritten with the state after the
sequence's last row in the step. A speculative verify step gives a sequence 1 + k decode rows (its last
token and k drafts): they step in ``waves``, the t-th row of every such sequence in wave t, each from the
state the row before it left; every row but the sequence's last writes its state to a scratch row
(engine/spec_states.py), so that the state after any accepted draft survives the step. Before that, the step's checkpoint copies run on every state cache
(engine/state_checkpoints.py): saves (a running slot's row to a checkpoint row), then restores (a
checkpoint row to the slot of a sequence admitted on a prefix hit).
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch


@dataclass
class StatePrefill:
    """One prompt chunk: rows [row, row + length) of the step, state slot ``slot``."""

    row: int
    length: int
    slot: int
    fresh: bool  # starts at position 0: its state starts from zeros, not from the slot


@dataclass
class DecodeWave:
    """Decode rows stepped together by the one-step recurrence: row ``rows[i]`` steps state row
    ``slots[i]`` in place, after ``src[i]`` was copied into it (the state the row before it left)."""

    rows: slice | torch.Tensor  # the step's rows: a slice, or (n,) int64 on the device
    slots: torch.Tensor  # (n,) int64: the state rows stepped (and written)
    src: torch.Tensor | None = None  # (n,) int64: rows copied into ``slots`` first; None: no copy


@dataclass
class StateBatch:
    """The state layout of one step (travels in AttentionMetadata.state)."""

    decode_slots: torch.Tensor  # (num_decode,) int64 on the device: the slot of decode row i
    num_decode: int  # rows [0, num_decode) are decode rows, one per sequence
    prefills: list[StatePrefill] = field(default_factory=list)
    # (src rows, dst rows) int64 on the device, each run as one gather and one scatter: speculative
    # commits, then checkpoint saves, then restores
    copies: list[tuple[torch.Tensor, torch.Tensor]] = field(default_factory=list)
    spec_waves: list[DecodeWave] | None = None  # a verify step's decode rows; None: one wave, in place

    def waves(self) -> list[DecodeWave]:
        """The decode rows' waves, in order: without drafts one, every decode row on its own slot."""
        if self.spec_waves is not None:
            return self.spec_waves
        return [DecodeWave(slice(0, self.num_decode), self.decode_slots)] if self.num_decode else []


def seed_wave(part: torch.Tensor, wave: DecodeWave) -> None:
    """Copy a wave's source rows into the rows it steps, in one state part (conv windows or matrices)."""
    if wave.src is not None:
        part.index_copy_(0, wave.slots, part.index_select(0, wave.src))


def apply_copies(cache: torch.Tensor, state: StateBatch) -> None:
    """Run the step's checkpoint copies on one layer's state rows (num_rows, width), in order."""
    for src, dst in state.copies:
        cache.index_copy_(0, dst, cache.index_select(0, src))


def conv_rows(cache: torch.Tensor, kernel: int, conv_dim: int) -> torch.Tensor:
    """The conv windows of every slot, a view (num_slots, kernel - 1, conv_dim) of ``cache``."""
    return cache[:, : (kernel - 1) * conv_dim].view(cache.shape[0], kernel - 1, conv_dim)


def ssm_rows(cache: torch.Tensor, conv_elements: int, shape: tuple[int, int, int]) -> torch.Tensor:
    """The recurrent matrices of every slot, a view (num_slots, heads, rows, cols) of ``cache``."""
    return cache[:, conv_elements:].view(cache.shape[0], *shape)


def state_width(conv_elements: int, ssm_elements: int) -> int:
    """Float32 elements of one slot's row."""
    return conv_elements + ssm_elements
