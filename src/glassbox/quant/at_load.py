"""``--quantization FORMAT``: a built model's weights quantized into a format of quant/formats.py, by the
function its row names (``at_load``: quant/blocks/at_load.py, quant/fp8/quantize.py, quant/fp4/linear.py).

Every such function takes (model, format, experts, across) and returns how many matrices it quantized:
``experts`` (where kernels run held experts: the CPU's, CUDA's fused block MoE) the routed experts too;
``across`` (a tensor-parallel rank: ``distributed.load_max``) the largest magnitude over the ranks that hold
parts of a row or tensor, for formats whose scales span one (fp8's rows, nvfp4's tensors).
"""

from __future__ import annotations

import importlib
from collections.abc import Callable

import torch
from torch import nn

from glassbox.quant.formats import WeightFormat


def quantize_at_load(
    model: nn.Module,
    fmt: WeightFormat,
    experts: bool = False,
    across: Callable[[torch.Tensor], torch.Tensor] | None = None,
) -> int:
    """Quantize ``model`` in place into ``fmt``; returns the count of matrices. ValueError for a format with
    no load-time quantization."""
    if fmt.at_load is None:
        raise ValueError(f"{fmt.name} weights are read from checkpoints, not made at load")
    module, _, function = fmt.at_load.partition(":")
    quantize: Callable[..., int] = getattr(importlib.import_module(module), function)
    return quantize(model, fmt, experts, across)
