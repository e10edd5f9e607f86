"""Which layers a load-time quantization replaces, and how a packed layer takes a tensor-parallel layer's
place (quant/at_load.py, quant/fp4/linear.py, models/loader.py's packed checkpoint weights)."""

from __future__ import annotations

from torch import nn


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
