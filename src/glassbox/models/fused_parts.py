"""Checkpoint tensors that hold several of glassbox's parameters, cut into them by rows as they are read.

Phi-3 (and Phi-4, Phi-4-mini: ``Phi3ForCausalLM``, GGUF ``phi3``) stores each layer's Q, K and V
projections as one ``self_attn.qkv_proj`` (GGUF ``attn_qkv``) and its gate and up projections as one
``mlp.gate_up_proj`` (GGUF ``ffn_up``, 2 x the FFN width: gate first, as transformers' Phi3MLP chunks it).
The engine runs Phi-3 on the Llama layers, which load q/k/v and gate/up apart and fuse them again
(models/llama.py), so every other part of the engine (quantization at load, the CPU kernels, the planner's
groups) sees a Llama checkpoint. Rows are independent in every stored format (floats and GGML blocks run
along a row), so a cut by rows is exact for raw blocks too. Torch-free.
"""

from __future__ import annotations

import re
from collections.abc import Iterator
from typing import Any, TypeVar

from glassbox.models.families import family_of_type
from glassbox.models.gguf_hybrid import split_linear_rows

_FUSED = re.compile(
    r"^(?P<layer>model\.layers\.\d+)\.(?P<part>self_attn\.qkv_proj|mlp\.gate_up_proj)\.weight$"
)

T = TypeVar("T")


def is_fused(model_type: str) -> bool:
    """Whether a family stores q/k/v and gate/up fused (models/families.py ``fused``)."""
    family = family_of_type(model_type)
    return family is not None and family.fused


def fused_rows(name: str, config: dict[str, Any]) -> list[tuple[str, int, int]] | None:
    """(parameter name, first row, end row) of each part of the checkpoint tensor ``name`` of a model with
    this HF ``config``, or None where the tensor is one parameter."""
    linear = split_linear_rows(name, config)  # a GGUF Qwen3-Next's in_proj_ba
    if linear is not None:
        return linear
    if not is_fused(str(config.get("model_type", ""))):
        return None
    m = _FUSED.match(name)
    if m is None:
        return None
    heads = int(config["num_attention_heads"])
    head_dim = int(config.get("head_dim") or int(config["hidden_size"]) // heads)
    if m["part"] == "self_attn.qkv_proj":
        q, kv = heads * head_dim, int(config.get("num_key_value_heads") or heads) * head_dim
        sizes = {"q_proj": q, "k_proj": kv, "v_proj": kv}
        module = "self_attn"
    else:
        inter = int(config["intermediate_size"])
        sizes = {"gate_proj": inter, "up_proj": inter}
        module = "mlp"
    parts, start = [], 0
    for proj, rows in sizes.items():
        parts.append((f"{m['layer']}.{module}.{proj}.weight", start, start + rows))
        start += rows
    return parts


def fused_config(cfg: Any) -> dict[str, Any]:
    """The HF config fields ``fused_rows`` reads, from a ModelFacts or an engine ModelConfig (the same
    attribute names): what the safetensors and tensor-parallel readers have in hand instead of config.json."""
    return {
        "model_type": cfg.model_type,
        "hidden_size": cfg.hidden_size,
        "num_attention_heads": cfg.num_heads,
        "num_key_value_heads": cfg.num_kv_heads,
        "head_dim": cfg.head_dim,
        "intermediate_size": cfg.intermediate_size,
    }


def split_rows(name: str, rows: T, n_rows: int, config: dict[str, Any]) -> Iterator[tuple[str, T]]:
    """(name, rows) once, or each part of a fused tensor with its rows (``rows[a:b]``: an array or tensor of
    values or of raw blocks, whose first axis holds ``n_rows`` rows); ValueError on a size mismatch."""
    parts = fused_rows(name, config)
    if parts is None:
        yield name, rows
        return
    if parts[-1][2] != n_rows:
        raise ValueError(f"{name}: {n_rows} rows, expected {parts[-1][2]} for its fused parts")
    for part, a, b in parts:
        yield part, rows[a:b]  # type: ignore[index]


def split_fused(tensors: Iterator[tuple[str, Any]], config: dict[str, Any]) -> Iterator[tuple[str, Any]]:
    """A stream of (HF name, tensor) with every fused tensor cut into its parameters' tensors."""
    for name, tensor in tensors:
        yield from split_rows(name, tensor, int(tensor.shape[0]), config)
