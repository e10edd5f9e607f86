"""The routed experts on CUDA: :class:`MoEExperts` run by kernels/triton_moe.py's fused grouped GEMMs.

The executor switches them on (:func:`use_triton_experts`) where the triton kernels run (CUDA with triton
installed); ``MoEExperts.forward`` then calls :func:`fused_forward` in eager steps and in the decode CUDA
graphs alike: no host read of the per-expert counts, and a batch reads only the experts its tokens chose.
Experts held in blocks (GGUF types, ``--quantization int4|int8``, MXFP4/NVFP4) are stacked on the device
(quant/blocks/moe_stack.py) for kernels/triton_block_moe.py's fused MoE, which reads them as stored. Experts
with an activation the kernels do not have keep the grouped path (``MoEExperts.grouped``, the reference
with ``MoEExperts.reference``)."""

from __future__ import annotations

import logging

import torch
from torch import nn

from glassbox.models.moe import ClampedSwiGLU, Gated, Glu, MoEExperts

logger = logging.getLogger(__name__)
SILU = ("silu", "swish")


def kernel_activation(experts: MoEExperts, glu: Glu | None = None) -> tuple[str, float, float] | None:
    """(kernels/triton_moe.py's activation, alpha, limit) for ``glu`` (the experts' own by default); None
    if it has none."""
    glu = experts.glu if glu is None else glu
    if isinstance(glu, ClampedSwiGLU):
        return "swiglu", glu.alpha, glu.limit
    if isinstance(glu, Gated) and glu.act in SILU:
        return "silu", 0.0, 0.0
    return None


def use_triton_experts(model: nn.Module) -> int:
    """Run every :class:`MoEExperts` of ``model`` on the fused triton kernels: those that hold their 3-D
    tensors as they are, those whose experts run as linears in blocks stacked on the model's device first
    (their linears let go). Returns how many. ValueError for held experts the kernels cannot take."""
    from glassbox.quant.blocks.moe_stack import stack_experts

    n = 0
    stacked_layers: dict[str, list[str]] = {}  # formats -> the layers whose experts were stacked
    for name, m in list(model.named_modules()):  # (stacking adds modules)
        if not isinstance(m, MoEExperts):
            continue
        if kernel_activation(m, m.linear_glu) is None:
            if m.linears:  # the grouped path reads the counts on the host: no graph could capture it
                raise ValueError(f"{name}: held experts with an activation the fused MoE does not have")
            continue
        device = m.gate_up_proj.device  # the model's (an emptied parameter stays there)
        if m.linears:
            stacked = stack_experts(m.linears, device)
            if isinstance(stacked, str):
                raise ValueError(f"{name}: its experts cannot run on the fused MoE: {stacked}")
            m.blocks, m.linears, m.kept = stacked, [], nn.ModuleList()
            stacked_layers.setdefault(stacked.labels, []).append(name)
        m.fused = torch.zeros((), dtype=torch.int64, device=device)
        m.fused_forward = fused_forward
        n += 1
    for labels, names in stacked_layers.items():
        logger.info(
            "routed experts of %d MoE layers in %s blocks, stacked for the fused block MoE",
            len(names),
            labels,
        )
    return n


def fused_forward(
    experts: MoEExperts, x: torch.Tensor, ids: torch.Tensor, weights: torch.Tensor
) -> torch.Tensor:
    """``MoEExperts.forward`` on the fused kernels: x (T, H), ids (T, k), weights (T, k) -> (T, H)."""
    from glassbox.kernels.triton_moe import fused_moe

    spec = kernel_activation(experts, experts.linear_glu)
    assert spec is not None and experts.fused is not None
    act, alpha, limit = spec
    if experts.blocks is not None:  # experts in blocks (quant/blocks/moe_stack.py)
        from glassbox.kernels.triton_block_moe import block_fused_moe

        s, glu = experts.blocks, experts.linear_glu
        interleaved = isinstance(glu, ClampedSwiGLU) and glu.interleaved
        return block_fused_moe(
            x, ids, weights, s.w1, s.w2, experts.num_experts, s.b1, s.b2, act, interleaved, alpha, limit,
            reads=experts.fused,
        )  # fmt: skip
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
