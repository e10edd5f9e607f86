"""The routed experts on CUDA: :class:`MoEExperts` run by kernels/triton_moe.py's fused grouped GEMMs.

The executor switches them on (:func:`use_triton_experts`) where the triton kernels run (CUDA with triton
installed); ``MoEExperts.forward`` then calls :func:`fused_forward` in eager steps and in the decode CUDA
graphs alike: no host read of the per-expert counts, and a batch reads only the experts its tokens chose.
Experts held otherwise (packed CPU layouts, FP4) or with an activation the kernels do not have keep the
grouped path (``MoEExperts.grouped``, the reference with ``MoEExperts.reference``)."""

from __future__ import annotations

import torch
from torch import nn

from glassbox.models.moe import ClampedSwiGLU, Gated, MoEExperts

SILU = ("silu", "swish")


def kernel_activation(experts: MoEExperts) -> tuple[str, float, float] | None:
    """(kernels/triton_moe.py's activation, alpha, limit) for the experts' ``glu``; None if it has none."""
    glu = experts.glu
    if isinstance(glu, ClampedSwiGLU):
        return "swiglu", glu.alpha, glu.limit
    if isinstance(glu, Gated) and glu.act in SILU:
        return "silu", 0.0, 0.0
    return None


def use_triton_experts(model: nn.Module) -> int:
    """Run every :class:`MoEExperts` of ``model`` that holds its 3-D tensors on the fused triton kernels.
    Returns how many."""
    n = 0
    for m in model.modules():
        if isinstance(m, MoEExperts) and not m.linears and kernel_activation(m) is not None:
            m.fused = torch.zeros((), dtype=torch.int64, device=m.gate_up_proj.device)
            n += 1
    return n


def fused_forward(
    experts: MoEExperts, x: torch.Tensor, ids: torch.Tensor, weights: torch.Tensor
) -> torch.Tensor:
    """``MoEExperts.forward`` on the fused kernels: x (T, H), ids (T, k), weights (T, k) -> (T, H)."""
    from glassbox.kernels.triton_moe import fused_moe

    spec = kernel_activation(experts)
    assert spec is not None and experts.fused is not None
    act, alpha, limit = spec
    b1, b2 = experts.gate_up_proj_bias, experts.down_proj_bias
    return fused_moe(
        x, ids, weights, experts.gate_up_proj, experts.down_proj,
        None if b1 is None else b1.detach(), None if b2 is None else b2.detach(),
        act, alpha, limit, reads=experts.fused,
    )  # fmt: skip


def experts_read(experts: MoEExperts) -> tuple[int, int]:
    """(the experts whose weights the forwards read, their bytes as held), summed over forwards: grouped and
    fused (the device counter is read: a synchronization)."""
    fused = 0 if experts.fused is None else int(experts.fused.item())
    return experts.experts_read + fused, experts.bytes_read + fused * experts.expert_bytes()
