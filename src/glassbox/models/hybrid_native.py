"""Hybrid models on glassbox's CPU kernels: their decode recurrences in C (kernels/cpu_recurrent.c).

The loader binds a family here (models/loader.CPU_KERNEL_FORWARDS) where the C kernels build: each Gated
DeltaNet / Mamba-2 mixer runs its decode rows' one-step recurrence in place on the state rows (4-68x
faster than the PyTorch ops' gather, update and scatter at Qwen3-Next's and Nemotron 3 Super's widths on a
loaded 2-core machine: benchmarks/results/hybrid-decode-recurrence-2026-11-28.json); everything else,
prompt scans included,
stays on the PyTorch ops, which remain the reference (GLASSBOX_CPU_KERNELS=torch).
"""

from __future__ import annotations

import torch
from torch import nn

from glassbox.layers.gated_deltanet import GatedDeltaNet
from glassbox.layers.mamba2 import Mamba2Mixer


def bind(model: nn.Module, kv_caches: list[torch.Tensor], dtype: torch.dtype) -> nn.Module:
    """``model`` itself, its mixers switched to the C decode recurrences."""
    mixers = [m for m in model.modules() if isinstance(m, (GatedDeltaNet, Mamba2Mixer))]
    if not mixers:
        raise ValueError("no recurrent mixer to bind")
    for m in mixers:
        m.native = True
    return model
