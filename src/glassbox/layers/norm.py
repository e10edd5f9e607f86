"""RMSNorm as Hugging Face computes it (float32 statistics, weight applied in the input dtype)."""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn


class RMSNorm(nn.Module):
    def __init__(self, hidden_size: int, eps: float = 1e-6) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.ones(hidden_size))
        self.eps = eps

    def forward(self, x: torch.Tensor) -> torch.Tensor:  # (..., hidden)
        h = F.rms_norm(x.float(), (x.shape[-1],), eps=self.eps)  # one fused op: h * rsqrt(mean(h^2) + eps)
        return self.weight * h.to(x.dtype)
