"""RMSNorm as Hugging Face computes it: Llama's (float32 statistics, weight applied in the input dtype) and
Gemma's ((1 + weight), applied in float32)."""

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


class GemmaRMSNorm(nn.Module):
    """Gemma's RMSNorm: the weight is an offset from 1, and the whole product is taken in float32 before
    the cast back (Llama's casts first, then multiplies by the weight in the input dtype)."""

    def __init__(self, hidden_size: int, eps: float = 1e-6) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.zeros(hidden_size))  # zeros: the identity scale
        self.eps = eps

    def forward(self, x: torch.Tensor) -> torch.Tensor:  # (..., hidden)
        h = F.rms_norm(x.float(), (x.shape[-1],), eps=self.eps)
        return (h * (1.0 + self.weight.float())).to(x.dtype)
