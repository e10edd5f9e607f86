"""Host values onto the device without synchronizing it.

A plain ``torch.tensor(values, device="cuda")`` copies from pageable memory, which makes the host wait
for the stream; a step's inputs instead go through pinned memory and non-blocking copies, so that the
host can prepare the next launch while the device computes. On the CPU these are plain tensors.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch

ALIGN_BYTES = 16  # every part of a packed copy starts here: Triton's JIT specializes 16-byte pointers


def to_device(
    values: Sequence[int] | Sequence[float], dtype: torch.dtype, device: torch.device
) -> torch.Tensor:
    """A host list on ``device`` without synchronizing: pinned and non-blocking on CUDA."""
    t = torch.tensor(values, dtype=dtype)
    if device.type != "cuda":
        return t
    return t.pin_memory().to(device, non_blocking=True)


def parts_to_device(
    parts: Sequence[Sequence[int]], dtype: torch.dtype, device: torch.device
) -> list[torch.Tensor]:
    """Several int lists in one copy (see :func:`to_device`): one flat tensor, a 1-D view per part.

    Each view starts at a 16-byte-aligned offset, so that a kernel launched on it gets the same compiled
    specialization whatever the parts' lengths (no recompiles between steps)."""
    per = max(1, ALIGN_BYTES // torch.empty((), dtype=dtype).element_size())
    flat: list[int] = []
    spans = []
    for p in parts:
        spans.append((len(flat), len(p)))
        flat.extend(p)
        flat.extend([0] * (-len(flat) % per))
    t = to_device(flat, dtype, device)
    return [t[start : start + n] for start, n in spans]
