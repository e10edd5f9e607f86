"""``--quantization q8_0|q4_0|q4_1`` (int8, int4, int4-asym): a built model's linear layers and token tables
(and, where kernels hold them, its routed MoE experts) in 32-value blocks.

Weight-only, per block: symmetric 4 or 8 bits as GGUF's Q4_0 / Q8_0, q4_1 with a min per block as GGUF's
Q4_1 (quant/blocks/weights.py). A tied LM head shares its blocks with the embedding table.
"""

from __future__ import annotations

from collections.abc import Callable

import torch
from torch import nn

from glassbox.quant.blocks.linear import BlockQuantEmbedding, BlockQuantLinear
from glassbox.quant.blocks.quantize import quantize
from glassbox.quant.blocks.weights import BlockWeights
from glassbox.quant.formats import WeightFormat
from glassbox.quant.walk import quantized_kind, swap_layers


def quantize_blocks(
    model: nn.Module,
    fmt: WeightFormat,
    experts: bool = False,
    across: Callable[[torch.Tensor], torch.Tensor] | None = None,
) -> int:
    """Every nn.Linear and nn.Embedding in ``fmt``'s blocks (its ``bits``, ``asymmetric``); returns the count.
    An asymmetric format keeps the token tables (embedding, LM head) in 8-bit blocks, as llama.cpp's Q4_1
    files do: on SmolLM2 their 4 bits alone cost ~5% perplexity (benchmarks/quant_quality.py).
    ``experts``: the routed experts too, each expert's matrices in the same blocks (models/moe.py
    ``quantize_experts``). ``across`` is not needed: each tensor-parallel rank's K shard is whole blocks."""
    bits, asymmetric = fmt.bits, fmt.asymmetric
    done: dict[int, BlockWeights] = {}  # id(weight parameter) -> its blocks (tied tables are one)
    head = getattr(model, "lm_head", None)
    tables = {id(m.weight) for m in model.modules() if quantized_kind(m) is nn.Embedding}
    tables |= {id(head.weight)} if head is not None and quantized_kind(head) is nn.Linear else set()

    def blocks(weight: torch.Tensor) -> BlockWeights:
        if id(weight) not in done:
            table = asymmetric and id(weight) in tables
            done[id(weight)] = quantize(weight, 8) if table else quantize(weight, bits, asymmetric)
        return done[id(weight)]

    def own(module: nn.Module) -> int:
        hold = getattr(module, "quantize_experts", None)
        return int(hold(lambda w: quantize(w, bits, asymmetric))) if experts and callable(hold) else 0

    return swap_layers(
        model,
        linear=lambda layer, bias: BlockQuantLinear(blocks(layer.weight), bias),
        embedding=lambda table: BlockQuantEmbedding(blocks(table.weight), table.weight.dtype),
        own=own,
    )
