"""``--quantization int4|int4-asym|int8``: a built model's linear layers (and embedding table; on the CPU the
routed MoE experts) in 32-value blocks.

Weight-only, per block: symmetric int4 as GGUF's Q4_0 and int8 as Q8_0, int4-asym as Q4_1 (a scale and a
min; quant/blocks/weights.py), applied to a built model as oneDNN packing is. A tied LM head shares its
blocks with the embedding table.
``--quantization mxfp4|nvfp4`` is quant/fp4/linear.py's, ``fp8`` quant/fp8/quantize.py's.
"""

from __future__ import annotations

from collections.abc import Callable

import torch
from torch import nn

from glassbox.quant.blocks.linear import BlockQuantEmbedding, BlockQuantLinear
from glassbox.quant.blocks.quantize import quantize
from glassbox.quant.blocks.weights import BlockWeights
from glassbox.quant.fp4.linear import quantize_model_fp4
from glassbox.quant.in_place import in_place_of, quantized_kind


def quantize_model(
    model: nn.Module,
    bits: int | str,
    asymmetric: bool = False,
    experts: bool = False,
    across: Callable[[torch.Tensor], torch.Tensor] | None = None,
) -> int:
    """Replace every nn.Linear and nn.Embedding with its block-quantized form (``bits`` 4 or 8; "mxfp4" or
    "nvfp4": ``quantize_model_fp4``; "fp8": ``quantize_model_fp8``); returns the count. ``asymmetric``:
    4-bit blocks with a min, and the token tables (embedding, LM head) in 8-bit blocks, as llama.cpp's Q4_1
    files keep them: on SmolLM2 their 4 bits alone cost ~5% perplexity (benchmarks/quant_quality.py).
    ``experts`` (where kernels run held experts: the CPU's, CUDA's fused block MoE; not FP8's on CUDA):
    the routed experts too, each expert's matrices in the same blocks (models/moe.py ``quantize_experts``).
    ``across`` (a tensor-parallel rank: ``distributed.load_max``): for fp8 and nvfp4, whose scales span a
    whole row or tensor, the largest magnitudes over the ranks that hold its parts (32-value blocks need
    none: each rank's K shard is whole blocks)."""
    if bits == "fp8":
        from glassbox.quant.fp8.quantize import quantize_model_fp8

        return quantize_model_fp8(model, experts, across)
    if isinstance(bits, str):
        return quantize_model_fp4(model, bits, experts, across)
    done: dict[int, BlockWeights] = {}  # id(weight parameter) -> its blocks (tied tables are one)
    head = getattr(model, "lm_head", None)
    tables = {id(m.weight) for m in model.modules() if quantized_kind(m) is nn.Embedding}
    tables |= {id(head.weight)} if head is not None and quantized_kind(head) is nn.Linear else set()

    def blocks(weight: torch.Tensor) -> BlockWeights:
        if id(weight) not in done:
            table = asymmetric and id(weight) in tables
            done[id(weight)] = quantize(weight, 8) if table else quantize(weight, bits, asymmetric)
        return done[id(weight)]

    count = 0
    for module in list(model.modules()):
        for name, child in list(module.named_children()):
            kind = quantized_kind(child)
            if kind is nn.Linear:
                assert isinstance(child, nn.Linear)
                bias = None if hasattr(child, "around") else child.bias  # a row-parallel bias: after the sum
                setattr(module, name, in_place_of(child, BlockQuantLinear(blocks(child.weight), bias)))
                count += 1
            elif kind is nn.Embedding:
                assert isinstance(child, nn.Embedding)
                table = BlockQuantEmbedding(blocks(child.weight), child.weight.dtype)
                setattr(module, name, in_place_of(child, table))
                count += 1
        hold = getattr(module, "quantize_experts", None)
        if experts and callable(hold):
            count += int(hold(lambda w: quantize(w, int(bits), asymmetric)))
    return count
