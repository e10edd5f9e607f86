"""Weight-only int8 quantization (per output channel, symmetric), applied to a built model."""

from __future__ import annotations

import torch
from torch import nn

FUSED_MAX_ROWS = 32  # above this many rows the fused int8 kernel is slower than widening the weights


class Int8Linear(nn.Module):
    """y = x @ (w_int8 * scale)^T (+ bias); weights stored as int8 with one scale per output row."""

    def __init__(self, linear: nn.Linear) -> None:
        super().__init__()
        w = linear.weight.detach()
        w32 = w.float()
        scale = w32.abs().amax(dim=1).clamp(min=1e-8) / 127.0  # (N,)
        self.weight = nn.Parameter(
            torch.round(w32 / scale[:, None]).clamp(-127, 127).to(torch.int8), requires_grad=False
        )  # (N, K)
        self.scale = nn.Parameter(scale.to(w.dtype), requires_grad=False)  # (N,) in the compute dtype
        self.bias = linear.bias
        self.in_features, self.out_features = linear.in_features, linear.out_features
        self._fused = _has_int8pack(w.device, w.dtype)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        shape = x.shape
        x2 = x.reshape(-1, shape[-1])
        if self._fused and x2.shape[0] <= FUSED_MAX_ROWS:
            # few rows (decode): the fused kernel reads half the bytes of bf16
            y = torch.ops.aten._weight_int8pack_mm(x2, self.weight, self.scale)
        else:
            # many rows (prefill): compute-bound, so widen the weights once and use the dense GEMM
            y = (x2 @ self.weight.to(x2.dtype).t()) * self.scale
        if self.bias is not None:
            y = y + self.bias
        return y.reshape(*shape[:-1], self.out_features)


def _has_int8pack(device: torch.device, dtype: torch.dtype) -> bool:
    """Whether torch's fused int8 weight-only matmul runs here for this activation dtype."""
    try:
        x = torch.zeros(1, 32, device=device, dtype=dtype)
        w = torch.zeros(8, 32, device=device, dtype=torch.int8)
        s = torch.ones(8, device=device, dtype=dtype)
        torch.ops.aten._weight_int8pack_mm(x, w, s)
        return True
    except (RuntimeError, NotImplementedError, AttributeError):
        return False


def quantize_int8(model: nn.Module, skip: tuple[str, ...] = ()) -> int:
    """Replace every nn.Linear (except names ending in ``skip``) with Int8Linear; returns the count."""
    count = 0
    for name, module in list(model.named_modules()):
        for child_name, child in list(module.named_children()):
            full = f"{name}.{child_name}" if name else child_name
            if isinstance(child, nn.Linear) and not full.endswith(skip):
                setattr(module, child_name, Int8Linear(child))
                count += 1
    return count
