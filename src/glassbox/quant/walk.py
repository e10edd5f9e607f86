"""The one walk that applies a weight format to a built model: each linear (and token table) the format
replaces, in place, and each module that holds its matrices otherwise (MoE experts) asked to convert its own.

Load-time quantization (quant/at_load.py: blocks, FP8, FP4) and the CPU layouts (quant/dense/onednn.py) go
through :func:`swap_layers`; a checkpoint's kept weights are swapped in by name (quant/kept.py). Either way a
tensor-parallel layer keeps its collective around the new one (:func:`in_place_of`)."""

from __future__ import annotations

from collections.abc import Callable

import torch
from torch import nn

# (the layer, its bias as the new layer takes it: None for a row-parallel layer, added after the sum) -> new
MakeLinear = Callable[[nn.Linear, torch.Tensor | None], nn.Module]
MakeEmbedding = Callable[[nn.Embedding], nn.Module]


def quantized_kind(m: nn.Module) -> type[nn.Module] | None:
    """nn.Linear or nn.Embedding for the layers quantization replaces: those exactly (not their subclasses:
    routers, Gemma's scaled table), and the tensor-parallel ones (``around``) but Gemma's table; else None."""
    for kind in (nn.Linear, nn.Embedding):
        if type(m) is kind or (isinstance(m, kind) and hasattr(m, "around") and not hasattr(m, "scale")):
            return kind
    return None


def cuts_k(m: nn.Module) -> bool:
    """Whether ``m`` holds some of each row's input columns (a row-parallel layer): a scale over a whole row
    or tensor then needs the other ranks' parts (``distributed.load_max``)."""
    return bool(getattr(m, "cuts_k", False))


def in_place_of(old: nn.Module, new: nn.Module) -> nn.Module:
    """``new`` (``old``'s weight packed) as it replaces ``old``: a tensor-parallel layer's ``around(new)``
    (its all-reduce, vocabulary shard or logits all-gather around the packed weight, a row-parallel bias
    added after the sum: models/tensor_parallel.py), else ``new`` itself."""
    around = getattr(old, "around", None)
    return new if around is None else around(new)


def own_bias(layer: nn.Linear) -> torch.Tensor | None:
    """The bias a packed replacement of ``layer`` adds itself: none for a tensor-parallel layer, whose
    ``around`` adds a row-parallel bias after the sum and keeps a column-parallel one's."""
    return None if hasattr(layer, "around") else layer.bias


def swap_layers(
    model: nn.Module,
    linear: MakeLinear | None = None,
    embedding: MakeEmbedding | None = None,
    own: Callable[[nn.Module], int] | None = None,
    skip: frozenset[str] = frozenset(),
) -> int:
    """Replace every linear (``quantized_kind``) by ``linear(layer, own_bias(layer))`` and every token table
    by ``embedding(table)`` (each None: left), but children named in ``skip`` (``"lm_head"``); then call
    ``own(module)`` on every module, which converts the matrices a module holds itself (MoE experts) and
    returns how many. Returns the count of matrices converted."""
    count = 0
    for module in list(model.modules()):
        for name, child in list(module.named_children()):
            if name in skip:
                continue
            kind = quantized_kind(child)
            if kind is nn.Linear and linear is not None:
                assert isinstance(child, nn.Linear)
                setattr(module, name, in_place_of(child, linear(child, own_bias(child))))
                count += 1
            elif kind is nn.Embedding and embedding is not None:
                assert isinstance(child, nn.Embedding)
                setattr(module, name, in_place_of(child, embedding(child)))
                count += 1
        if own is not None:
            count += own(module)
    return count
