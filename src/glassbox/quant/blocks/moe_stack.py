"""A MoE layer's experts kept in blocks, stacked for CUDA's fused block MoE (kernels/triton_block_moe.py).

``MoEExperts`` whose experts run as linears of one block format (quant/held_experts.py: GGUF Q4_0/Q4_1/
Q8_0 and K-quants, ``--quantization int4|int8`` blocks, MXFP4/NVFP4) are stacked at start on CUDA: every
expert's gate_up matrix by rows into one block weight (expert e's rows at e 2I), its down matrices into
another (at e H), in the Triton kernels' layout (K-quants and 4-bit floats re-laid:
quant/blocks/kquant_triton.py, quant/fp4/triton.py) on the device, the biases beside them in float32. The
per-expert linears are then let go. Experts of mixed formats, act-order blocks or FP8 are not stacked
(``stack_experts`` says why).
"""

from __future__ import annotations

import torch
from torch import nn

from glassbox.quant.blocks.kquant import KQuantWeights
from glassbox.quant.blocks.kquant_triton import TritonKQuant
from glassbox.quant.blocks.kquant_triton import for_triton as kquant_for_triton
from glassbox.quant.blocks.linear import BlockQuantLinear, concat_weights
from glassbox.quant.blocks.weights import BlockWeights
from glassbox.quant.fp4.linear import FP4Linear
from glassbox.quant.fp4.triton import TritonFP4
from glassbox.quant.fp4.triton import for_triton as fp4_for_triton
from glassbox.quant.fp4.weights import FP4Weights
from glassbox.quant.fp4.weights import concat as concat_fp4

StackedWeights = BlockWeights | TritonKQuant | TritonFP4


def _stack(
    linears: list[nn.Module], device: torch.device
) -> tuple[StackedWeights, torch.Tensor | None] | str:
    """The linears' weights stacked by rows on ``device`` in the kernels' layout and their biases (float32;
    zeros where one has none), or why they cannot be."""
    weights: list[BlockWeights | KQuantWeights | FP4Weights] = []
    biases: list[torch.Tensor | None] = []
    for lin in linears:
        if isinstance(lin, FP4Linear) and lin.triton is None:
            weights.append(lin.w)
        elif isinstance(lin, BlockQuantLinear) and isinstance(lin.w, BlockWeights | KQuantWeights):
            if lin.w.perm is not None:
                return "act-order blocks"
            weights.append(lin.w)
        else:
            return f"a {type(lin).__name__}"
        biases.append(lin.bias)
    if all(isinstance(w, FP4Weights) for w in weights):
        fp4 = concat_fp4([w for w in weights if isinstance(w, FP4Weights)])
        big: StackedWeights | KQuantWeights | None = None if fp4 is None else fp4_for_triton(fp4)
    elif any(isinstance(w, FP4Weights) for w in weights):
        big = None
    else:
        big = concat_weights([w for w in weights if not isinstance(w, FP4Weights)])
    if big is None:
        return "experts of different formats"
    big = kquant_for_triton(big) if isinstance(big, KQuantWeights) else big
    if all(b is None for b in biases):
        return big.to(device), None
    rows = [
        torch.zeros(w.out_features) if b is None else b.detach().float().cpu()
        for w, b in zip(weights, biases, strict=True)
    ]
    return big.to(device), torch.cat(rows).to(device)


class StackedExperts(nn.Module):
    """A layer's experts stacked for kernels/triton_block_moe.py: gate_up (E 2I rows) and down (E H rows),
    their arrays as (non-persistent) buffers, so that ``model.buffers()`` sees them, and as the engine's
    kept weights (``held_weights``: layers/block_linear.block_weights counts their bytes and formats)."""

    def __init__(
        self,
        held: tuple[StackedWeights, StackedWeights],
        b1: torch.Tensor | None,
        b2: torch.Tensor | None,
        experts: int,
    ) -> None:
        super().__init__()
        self.held = held
        self.w1, self.w2 = held[0].triton_args, held[1].triton_args
        self.b1, self.b2 = b1, b2  # (E 2I,), (E H,) float32
        for side, w in zip(("w1", "w2"), held, strict=True):
            for name, t in w.stored().items():
                self.register_buffer(f"{side}_{name}", t, persistent=False)
        size = sum(t.numel() * t.element_size() for t in (b1, b2) if t is not None)
        self.expert_bytes = (held[0].nbytes + held[1].nbytes + size) // experts  # one expert's, as held
        self.labels = "/".join(dict.fromkeys((held[0].label, held[1].label)))

    def held_weights(self) -> list[StackedWeights]:
        return list(self.held)


def stack_experts(pairs: list[tuple[nn.Module, nn.Module]], device: torch.device) -> StackedExperts | str:
    """Each expert's (gate_up, down) linears stacked on ``device``, or why they cannot be."""
    up = _stack([p[0] for p in pairs], device)
    if isinstance(up, str):
        return f"gate_up: {up}"
    down = _stack([p[1] for p in pairs], device)
    if isinstance(down, str):
        return f"down: {down}"
    (w1, b1), (w2, b2) = up, down
    return StackedExperts((w1, w2), b1, b2, len(pairs))
