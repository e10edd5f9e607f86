"""The linear layer that runs ``FP4Weights`` (quant/fp4/weights.py: MXFP4, NVFP4), and
``--quantization mxfp4|nvfp4``.

As the block weights do (quant/blocks/linear.py): decode rows in bf16 run the int8-activation kernel
(kernels/cpu_fp4.c), other rows and float32 models multiply the dequantized weight (exact in float32), so
a float32 model gives what its dequantized checkpoint gives. Without the C kernels the dequantization is
the PyTorch reference.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import replace

import torch
import torch.nn.functional as F
from torch import nn

from glassbox.quant.blocks.linear import kernel_chosen
from glassbox.quant.formats import WeightFormat
from glassbox.quant.fp4.quantize import quantize
from glassbox.quant.fp4.triton import TritonFP4, for_triton
from glassbox.quant.fp4.weights import FP4Weights, native_library
from glassbox.quant.walk import swap_layers


def fp4_linear(x: torch.Tensor, w: FP4Weights, bias: torch.Tensor | None = None) -> torch.Tensor:
    """y = x W^T + b (``bias`` float32 or None): the kernel for decode rows in bf16, else the dequantized
    weight in x's dtype."""
    lead = x.shape[:-1]
    x2 = x.reshape(-1, w.in_features)
    rows = x2.shape[0]
    lib = native_library()
    if not kernel_chosen(rows) or x.dtype != torch.bfloat16 or x.device.type != "cpu" or lib is None:
        b = None if bias is None else bias.to(x.dtype)
        return F.linear(x, w.dequantize(x.dtype).to(x.device), b)
    x2 = x2.contiguous()
    if bias is not None and (bias.dtype != torch.float32 or not bias.is_contiguous()):
        bias = bias.float().contiguous()
    out = torch.empty(rows, w.out_features, dtype=x.dtype)
    lib.gb_fp4_linear(
        x2.data_ptr(), rows, w.in_features, *w.pointers(), None if bias is None else bias.data_ptr(),
        w.out_features, w.padded, out.data_ptr(), 1, torch.get_num_threads(),
    )  # fmt: skip
    return out.view(*lead, w.out_features)


class FP4Linear(nn.Module):
    """y = x W^T + b with W in ``FP4Weights`` (CPU), or on CUDA's Triton kernels after ``move_to_triton``."""

    def __init__(self, weights: FP4Weights, bias: torch.Tensor | None = None) -> None:
        super().__init__()
        self.w = weights
        # non-persistent buffers, so that ``model.buffers()`` sees the bytes they hold
        self.register_buffer("codes", weights.codes, persistent=False)
        self.register_buffer("scales", weights.scales, persistent=False)
        if weights.row_scale is not None:
            self.register_buffer("row_scale", weights.row_scale, persistent=False)
        self.in_features, self.out_features = weights.in_features, weights.out_features
        # float32 whatever the model's dtype (the kernel adds it in float); a parameter, so that a
        # checkpoint's bias loads into it by name
        self.bias = (
            None if bias is None else nn.Parameter(bias.detach().float().contiguous(), requires_grad=False)
        )
        self.nbytes = weights.nbytes
        self.triton: TritonFP4 | None = None  # the weights on CUDA's Triton kernels (``move_to_triton``)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.triton is not None:
            lead = x.shape[:-1]
            x2 = x.reshape(-1, self.in_features).contiguous()
            y = _triton(x2, self.triton, self.bias, kernel_chosen(x2.shape[0]))
            return y.view(*lead, self.out_features)
        return fp4_linear(x, self.w, self.bias)

    def move_to_triton(self, device: torch.device) -> None:
        """The weights re-laid for the Triton kernels (quant/fp4/triton.py) on ``device``, the CPU layout's
        buffers let go; the bias moved (layers/block_linear.to_triton calls this)."""
        self.triton = for_triton(self.w).to(device)
        w = self.w  # its CPU bytes let go (on a unified-memory machine they would be the device's too)
        self.w = replace(w, codes=w.codes.new_empty(w.out_features, 0), scales=w.scales.new_empty(0, 0))
        for name in ("codes", "scales", "row_scale"):
            self._buffers.pop(name, None)
        for name, t in (("codes", self.triton.codes), ("scales", self.triton.lo), ("scales_hi", self.triton.hi),
                        ("row_scale", self.triton.row_scale)):  # fmt: skip
            if t is not None:
                self.register_buffer(name, t, persistent=False)
        if self.bias is not None:
            self.bias = nn.Parameter(self.bias.detach().to(device), requires_grad=False)
        self.nbytes = self.triton.nbytes

    def held_weights(self) -> list[FP4Weights | TritonFP4]:
        return [self.w if self.triton is None else self.triton]


@torch.compiler.disable  # a launch, not a graph (as quant/blocks/linear.py's)
def _triton(x: torch.Tensor, w: TritonFP4, bias: torch.Tensor | None, decode: bool) -> torch.Tensor:
    from glassbox.kernels.triton_block_linear import block_matmul

    return block_matmul(x, w.triton_args, bias, decode)


def quantize_model_fp4(
    model: nn.Module,
    fmt: WeightFormat,
    experts: bool = True,
    across: Callable[[torch.Tensor], torch.Tensor] | None = None,
) -> int:
    """``--quantization mxfp4|nvfp4``: every ``nn.Linear`` but the LM head (attention, dense MLPs, shared
    experts; routers are ``RouterLinear`` and stay), and with ``experts`` (held experts: the CPU's kernels,
    CUDA's fused block MoE) the routed experts of modules that hold them otherwise (a
    ``quantize_experts`` method: models/moe.py), in ``kind``; embeddings and the LM head stay in the model's
    dtype, as FP4 checkpoints keep them. ``fmt``: nvfp4 or mxfp4 (quant/formats.py). ``across`` (tensor parallelism: ``distributed.load_max``): NVFP4's
    tensor scales from the whole tensors a rank holds part of, so that every rank's codes are the whole
    model's. Returns the matrices quantized."""

    kind = fmt.name

    def fp4(w: torch.Tensor) -> FP4Weights:
        if across is None or kind != "nvfp4":
            return quantize(w, kind)
        return quantize(w, kind, across(w.detach().float().abs().amax().reshape(1)))

    def own(module: nn.Module) -> int:
        hold = getattr(module, "quantize_experts", None)
        return int(hold(fp4)) if experts and callable(hold) else 0

    return swap_layers(
        model,
        linear=lambda layer, bias: FP4Linear(fp4(layer.weight), bias),
        own=own,
        skip=frozenset({"lm_head"}),
    )
