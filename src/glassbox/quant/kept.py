"""A checkpoint's weights kept in their own format (GGUF blocks, GPTQ/AWQ and compressed-tensors codes
repacked into blocks, FP8, FP4, a MoE layer's held experts), put into a built model in place of the float
layers their names address: which layer runs which kept weights is decided here, once."""

from __future__ import annotations

from collections.abc import Iterator

import torch
from torch import nn

from glassbox.quant.blocks.linear import AnyBlocks, BlockQuantEmbedding, BlockQuantLinear, block_weights
from glassbox.quant.fp4.linear import FP4Linear
from glassbox.quant.fp4.weights import FP4Weights
from glassbox.quant.fp8.linear import Fp8Linear
from glassbox.quant.fp8.weights import Fp8Weights
from glassbox.quant.held_experts import HeldExperts
from glassbox.quant.walk import in_place_of

Tensors = Iterator[tuple[str, torch.Tensor]]  # (HF name, tensor), one at a time
# Weights kept in a format of their own, by HF weight name (a MoE layer's experts: by module name)
Kept = AnyBlocks | Fp8Weights | FP4Weights | HeldExperts


def swap_in_kept(model: nn.Module, kept: dict[str, Kept], dtype: torch.dtype) -> None:
    """Replace each module whose weight is in ``packed`` by its block-quantized (FP8, FP4) form (a bias
    stays a parameter, loaded from the checkpoint by name); MoE experts (by module name) hold theirs."""
    params = dict(model.named_parameters(remove_duplicate=False))
    for name, blocks in kept.items():
        name = _module_name(model, name, params, isinstance(blocks, HeldExperts))
        if isinstance(blocks, HeldExperts):  # a MoE layer (models/moe.py MoEExperts) holds them
            experts = model.get_submodule(name)
            hold = getattr(experts, "hold", None)
            if not callable(hold):
                raise ValueError(f"{name}: held experts for a {type(experts).__name__}")
            try:
                hold(blocks)
            except ValueError as e:
                raise ValueError(f"{name}: {e}") from None
            continue
        parent_name, _, child = name.removesuffix(".weight").rpartition(".")
        parent = model.get_submodule(parent_name)
        old = getattr(parent, child)
        new: nn.Module
        bias = None if not isinstance(old, nn.Linear) or old.bias is None else torch.zeros(old.out_features)
        if hasattr(
            old, "around"
        ):  # a tensor-parallel layer keeps its bias (a row-parallel one: after the sum)
            bias = None
        if isinstance(blocks, Fp8Weights):
            if not isinstance(old, nn.Linear):
                raise ValueError(f"{name}: FP8 weights for a {type(old).__name__}, not a linear layer")
            new = Fp8Linear(blocks, bias).to(old.weight.device)
        elif isinstance(blocks, FP4Weights) and isinstance(old, nn.Linear):
            new = FP4Linear(blocks, bias)
        elif isinstance(old, nn.Embedding) and isinstance(blocks, AnyBlocks):
            # Gemma 3's table scales its rows: the blocks must too
            new = BlockQuantEmbedding(blocks, dtype, getattr(old, "scale", None))  # also its TP shard's
        elif isinstance(old, nn.Linear) and isinstance(blocks, AnyBlocks):
            new = BlockQuantLinear(blocks, bias)
        else:
            raise ValueError(f"{name}: packed weights for a {type(old).__name__}, not a linear or embedding")
        if (new.num_embeddings if isinstance(new, BlockQuantEmbedding) else new.out_features) != (
            blocks.out_features
        ) or (isinstance(old, nn.Linear) and old.in_features != blocks.in_features):
            raise ValueError(f"{name}: packed shape does not match the model")
        setattr(parent, child, in_place_of(old, new))


def _module_name(model: nn.Module, name: str, params: dict[str, nn.Parameter], experts: bool) -> str:
    """The model's name of a kept weight (``experts``: a MoE module) named as the checkpoint names it: the
    same, or where the family renames checkpoint tensors (Nemotron-H's ``backbone.*``, a multimodal
    checkpoint's text model) the module its ``checkpoint_view`` puts that weight (one expert's up matrix)
    into."""
    module = name if experts else name.removesuffix(".weight").rpartition(".")[0]
    try:
        model.get_submodule(module)
        return name
    except AttributeError:
        pass
    view = getattr(model, "checkpoint_view", None)
    found = view(f"{name}.0.up_proj.weight" if experts else name, params) if callable(view) else None
    if found is None:
        return name  # get_submodule then names what is missing
    target = found[0]
    return target.rpartition(".")[0] if experts else target


def held_size(model: nn.Module) -> tuple[int, int, list[str]]:
    """(bytes as held, weight elements, the formats kept in blocks, sorted) of a built model: its
    parameters plus every distinct kept weight (a tied table once: quant/blocks/linear.py block_weights)."""
    kept = block_weights(model)
    params = list(model.parameters())
    nbytes = sum(p.numel() * p.element_size() for p in params) + sum(w.nbytes for w in kept)
    elements = sum(p.numel() for p in params) + sum(w.out_features * w.in_features for w in kept)
    return nbytes, elements, sorted({w.label for w in kept})
