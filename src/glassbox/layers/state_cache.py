"""The recurrent-state cache of hybrid models: a step's state layout and each layer's slot rows.

Every state-holding layer (Gated DeltaNet, Mamba-2) owns one float32 tensor (num_slots, conv + ssm
elements): row s is the state of the sequence holding slot s (engine/block_manager.py hands slots out),
[the conv window (K-1, conv_dim) | the recurrent matrices (heads, rows, cols)]. Float32 keeps the
recurrent matrices as transformers does; the conv window holds inputs of the model's dtype, exact in it.

A step's sequences arrive in the executor's row order: decode rows first (one token each, the one-step
recurrence), then prompt chunks (the chunked scan), each starting from its slot's state or, when its
first token is position 0, from zeros (``fresh``). The slot's row is overwritten with the state after the
sequence's last row in the step. Before that, the step's checkpoint copies run on every state cache
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
class StateBatch:
    """The state layout of one step (travels in AttentionMetadata.state)."""

    decode_slots: torch.Tensor  # (num_decode,) int64 on the device: the slot of decode row i
    num_decode: int  # rows [0, num_decode) are decode rows, one per sequence
    prefills: list[StatePrefill] = field(default_factory=list)
    # (src rows, dst rows) int64 on the device, each run as one gather and one scatter: saves, then restores
    copies: list[tuple[torch.Tensor, torch.Tensor]] = field(default_factory=list)


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
