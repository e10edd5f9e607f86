"""The short depthwise causal convolution of Mamba-2 and Gated DeltaNet layers, carried across steps.

Each channel c of the output at position t is sum_k w[c, k] x[t - K + 1 + k, c] (+ bias), then SiLU; the
K - 1 inputs before a step's first row come from the sequence's conv window (zeros at position 0), and the
window after the step is the last K - 1 inputs seen.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F


def conv_prompt(
    x: torch.Tensor,  # (L, C) one sequence's new inputs
    window: torch.Tensor | None,  # (K-1, C) the inputs before them; None: position 0 (zeros)
    weight: torch.Tensor,  # (C, K)
    bias: torch.Tensor | None,  # (C,)
) -> tuple[torch.Tensor, torch.Tensor]:  # (SiLU(conv) (L, C), the new window (K-1, C))
    k = weight.shape[1]
    before = x.new_zeros(k - 1, x.shape[1]) if window is None else window.to(x.dtype)
    full = torch.cat([before, x], dim=0)  # (K-1+L, C)
    out = F.conv1d(full.t().unsqueeze(0), weight.unsqueeze(1), bias, groups=x.shape[1])  # (1, C, L)
    return F.silu(out[0].t()), full[full.shape[0] - (k - 1) :]


def conv_decode(
    x: torch.Tensor,  # (N, C) one new input per sequence
    windows: torch.Tensor,  # (N, K-1, C) each sequence's window
    weight: torch.Tensor,  # (C, K)
    bias: torch.Tensor | None,  # (C,)
) -> tuple[torch.Tensor, torch.Tensor]:  # (SiLU(conv) (N, C), the new windows (N, K-1, C))
    full = torch.cat([windows.to(x.dtype), x.unsqueeze(1)], dim=1)  # (N, K, C)
    out = (full * weight.t().unsqueeze(0)).sum(dim=1)
    if bias is not None:
        out = out + bias
    return F.silu(out), full[:, 1:]
