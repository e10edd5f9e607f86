"""Routed experts stored one projection a tensor group (``...experts.E.gate_proj.weight_*``: FP8, GPTQ/AWQ
and compressed-tensors releases of Qwen3-MoE, Mixtral's w1/w3/w2 too), sorted out of a quantized
checkpoint's layers: the dense layers stay by weight name, the experts become ``HeldExperts`` by MoE module
for the kernels that hold them (the CPU's; CUDA's fused block MoE: quant/blocks/moe_stack.py), or are widened to
float32 (the format's definition) for the float fused MoE off the CPU."""

from __future__ import annotations

import logging
import re
from collections.abc import Callable, Iterator, Mapping
from itertools import chain
from typing import TypeVar

import torch

from glassbox.quant.held_experts import ExpertMatrix, HeldExperts

Tensors = Iterator[tuple[str, torch.Tensor]]
logger = logging.getLogger(__name__)

W = TypeVar("W", bound=ExpertMatrix)

_EXPERT = re.compile(r"^(.*\.experts)\.(\d+)\.(w1|w3|w2|gate_proj|up_proj|down_proj)$")
_PART = {"w1": "gate", "gate_proj": "gate", "w3": "up", "up_proj": "up", "w2": "down", "down_proj": "down"}


def held_experts(found: dict[str, dict[int, dict[str, ExpertMatrix]]], what: str) -> dict[str, HeldExperts]:
    """Each MoE layer's experts (by checkpoint module name, expert, part) as ``HeldExperts`` by the model's
    module name: per expert its gate and up matrices (outputs read as [gate | up]) and its down. ``what``
    names the format in errors."""
    held: dict[str, HeldExperts] = {}
    for module, experts in found.items():
        n = max(experts) + 1
        # gated experts (gate, up, down), or ungated ones (Nemotron-H's squared ReLU: up, down) throughout
        parts = ("gate", "up") if any("gate" in p for p in experts.values()) else ("up",)
        lacking = [e for e in range(n) if set(experts.get(e, {})) != {*parts, "down"}]
        if lacking:
            raise ValueError(
                f"{module}: {what} experts {lacking[:4]} lack a {', '.join(parts)} or down weight"
            )
        name = module.replace(".block_sparse_moe.", ".mlp.")  # Mixtral's module is glassbox's mlp
        held[name] = HeldExperts(
            [tuple(experts[e][p] for p in parts) for e in range(n)], [experts[e]["down"] for e in range(n)]
        )
    return held


def is_expert(prefix: str) -> bool:
    """Whether a layer (module name) is one expert's projection."""
    return _EXPERT.match(prefix) is not None


def sort_experts(
    layers: Mapping[str, W], cpu: bool, what: str
) -> tuple[dict[str, W], dict[str, HeldExperts], dict[str, W]]:
    """``layers`` (by module name) as (the dense layers by weight name, the experts held by MoE module with
    ``cpu``, else the experts by weight name: to be widened, one at a time, for the fused MoE's float
    parameters)."""
    dense: dict[str, W] = {}
    found: dict[str, dict[int, dict[str, ExpertMatrix]]] = {}
    widened: dict[str, W] = {}
    for prefix, w in layers.items():
        expert = _EXPERT.match(prefix)
        if expert is None:
            dense[f"{prefix}.weight"] = w
        elif cpu:
            found.setdefault(expert[1], {}).setdefault(int(expert[2]), {})[_PART[expert[3]]] = w
        else:
            widened[f"{prefix}.weight"] = w
    return dense, held_experts(found, what), widened


def widened_first(
    widened: Mapping[str, W], widen: Callable[[W], torch.Tensor], rest: Tensors, what: str
) -> Tensors:
    """The experts ``sort_experts`` handed on off the CPU, each widened to float32 by ``widen`` as it is
    read (one at a time), then the checkpoint's other tensors ``rest``; logged."""
    if widened:
        logger.info(
            "%s routed experts widened to the model's dtype off the CPU: %d matrices", what, len(widened)
        )
    return chain(((name, widen(w)) for name, w in widened.items()), rest)
