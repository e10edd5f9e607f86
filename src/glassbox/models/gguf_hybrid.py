"""GGUF files of the hybrid families under llama.cpp's names: ``qwen3next`` (Qwen3NextForCausalLM),
``qwen35`` and ``qwen35moe`` (Qwen3_5ForCausalLM, Qwen3_5MoeForCausalLM).

llama.cpp's converter (convert_hf_to_gguf.py, ``Qwen3NextModel``) writes a Qwen3-Next checkpoint with these
transforms, which the reader undoes so that every tensor equals the Hugging Face parameter:

- the (1 + w) RMSNorm weights (``input_layernorm``, ``post_attention_layernorm``, ``q_norm``, ``k_norm``,
  ``model.norm``) with the 1 added; the gated norm ``linear_attn.norm`` (plain w) unchanged;
- ``A_log`` as ``ssm_a`` = -exp(A_log) (no ``.weight`` suffix); ``dt_bias`` as ``ssm_dt.bias``;
- ``conv1d`` (C, 1, K) squeezed to (C, K);
- ``in_proj_qkvz`` (per key head [q | k | v | z]) cut into ``attn_qkv`` ([all q | all k | all v]: Qwen3.5's
  ``in_proj_qkv``) and ``attn_gate`` (all z: ``in_proj_z``); the model is therefore built with Qwen3.5's split
  projections (:data:`SPLIT_PROJECTIONS_KEY` in its config), and ``ssm_ba`` (``in_proj_ba`` as stored, per key
  head [b | a]) is reordered to [all b | all a] and cut into ``in_proj_b`` / ``in_proj_a`` by rows (a row
  permutation and cut: exact for raw GGML blocks too);
- the full-attention ``q_proj`` (per head [query | gate]) as ``attn_q`` unchanged (2 x heads x head_dim
  rows); ``post_attention_layernorm`` as ``post_attention_norm``; experts stacked as for Qwen2-MoE.

llama.cpp runs every layer as MoE (softmax top-k, renormalized; sigmoid-gated shared expert), the layers
``(i + 1) % full_attention_interval == 0`` as attention, and rotates ``rope.dimension_count`` of each head.

Qwen3.5 (convert_hf_to_gguf.py ``Qwen3_5TextModel`` / ``Qwen3_5MoeTextModel`` over
``_LinearAttentionVReorderBase`` over ``Qwen3NextModel``): the same norm, ``A_log``, ``dt_bias`` and conv
transforms on Qwen3.5's split projections (``attn_qkv``, ``attn_gate``, ``ssm_beta``, ``ssm_alpha``), and,
where there are more v heads than k heads, the v heads moved from Hugging Face's grouped order (v head
j = g r + i serves k head g) to the tiled order [k0 v0, k1 v0, ..., k0 v1, ...] (v head j serves k head
j % num_k_heads): the v rows of ``attn_qkv`` and the conv, the rows of ``attn_gate`` / ``ssm_beta`` /
``ssm_alpha``, ``ssm_a`` and ``ssm_dt``, and the COLUMNS of ``ssm_out``. A column order cannot be undone on
quantized blocks (a block runs along a row's input dimension), so nothing is undone: the model runs in the
file's order (:data:`TILED_V_HEADS_KEY` in its config: layers/gated_deltanet.py repeats q/k tiled), and the
per-head gated norm (one weight for every head) is the same in either order. The dense ``qwen35`` runs
every layer's dense MLP, ``qwen35moe`` every layer as MoE. Multi-token-prediction blocks (the last
``nextn_predict_layers`` blocks) are not read (``mtp_layer``).

Refused with one message each: the legacy fused ``ssm_in`` layout, a layer without a router, a v-head
count that is not a multiple of the k-head count. Torch-free.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, TypeVar

import numpy as np

from glassbox.models.gguf_nemotron_h import NEMOTRON_H_ARCHITECTURES
from glassbox.models.hybrid_config import SPLIT_PROJECTIONS_KEY, TILED_V_HEADS_KEY

T = TypeVar("T")

QWEN3NEXT, QWEN35, QWEN35MOE = "qwen3next", "qwen35", "qwen35moe"
HYBRID_GGUF_ARCHITECTURES = frozenset({QWEN3NEXT, QWEN35, QWEN35MOE})
# its attn_q holds each head's query and output gate: 2 x heads x head_dim rows
GATED_QUERY_ARCHITECTURES = frozenset({QWEN3NEXT, QWEN35, QWEN35MOE})
# no dense FFN anywhere: the converter writes no feed_forward_length (Qwen3_5MoeTextConfig has none)
NO_DENSE_FFN = frozenset({QWEN35MOE})

# GGUF part -> Hugging Face path within a layer (beside gguf_names.LAYER_NAMES, less its ffn_norm)
QWEN3NEXT_LAYER_NAMES = {
    "post_attention_norm": "post_attention_layernorm",
    "attn_qkv": "linear_attn.in_proj_qkv",
    "attn_gate": "linear_attn.in_proj_z",
    "ssm_ba": "linear_attn.in_proj_ba",  # cut into in_proj_b / in_proj_a (split_linear_rows)
    "ssm_conv1d": "linear_attn.conv1d",
    "ssm_norm": "linear_attn.norm",
    "ssm_out": "linear_attn.out_proj",
}
# Qwen3.5's four input projections as stored (v heads tiled: see the module docstring)
QWEN35_LAYER_NAMES = {
    **{k: v for k, v in QWEN3NEXT_LAYER_NAMES.items() if k != "ssm_ba"},
    "ssm_beta": "linear_attn.in_proj_b",
    "ssm_alpha": "linear_attn.in_proj_a",
}
# GGUF tensor name after "blk.N." -> the whole Hugging Face name after "model.layers.N." (no suffix added)
QWEN3NEXT_EXACT_NAMES = {"ssm_a": "linear_attn.A_log", "ssm_dt.bias": "linear_attn.dt_bias"}

_REFUSED_PARTS = {
    "ssm_in": "the legacy fused in_proj_qkvz layout (ssm_in) is not read; convert the model again with a "
    "current llama.cpp (attn_qkv + attn_gate)",
}


def refused_part(arch: str, part: str) -> str | None:
    """Why a tensor part of an ``arch`` file is not read, or None."""
    return _REFUSED_PARTS.get(part) if arch in HYBRID_GGUF_ARCHITECTURES else None


def hybrid_fields(
    arch: str, get: Callable[..., Any], shapes: dict[str, tuple[int, ...]], config: dict[str, Any]
) -> dict[str, Any]:
    """The HF config keys (Qwen3NextConfig's / Qwen3_5TextConfig's spelling) of a ``qwen3next`` / ``qwen35``
    / ``qwen35moe`` file, as llama.cpp runs it (``get(key, default)`` reads ``<arch>.<key>``; ``config``: the
    dense keys already read)."""
    mtp_blocks = int(get("nextn_predict_layers", 0) or 0)  # trailing blocks, not read (mtp_layer)
    layers = int(config["num_hidden_layers"]) - mtp_blocks
    k_heads, v_heads = int(get("ssm.group_count")), int(get("ssm.time_step_rank"))
    inner = int(get("ssm.inner_size"))
    if k_heads <= 0 or v_heads % k_heads or inner % v_heads:
        raise ValueError(f"GGUF {arch}: {v_heads} value heads over {k_heads} key heads, inner size {inner}")
    interval = int(get("full_attention_interval", 4) or 4)
    full = [(i + 1) % interval == 0 for i in range(layers)]
    fields: dict[str, Any] = {
        "num_hidden_layers": layers,
        "linear_num_key_heads": k_heads,
        "linear_num_value_heads": v_heads,
        "linear_key_head_dim": int(get("ssm.state_size")),
        "linear_value_head_dim": inner // v_heads,
        "linear_conv_kernel_dim": int(get("ssm.conv_kernel")),
        "full_attention_interval": interval,
        "layer_types": ["full_attention" if f else "linear_attention" for f in full],
    }
    if arch == QWEN35:  # every layer a dense MLP (qwen35.cpp)
        return fields | {TILED_V_HEADS_KEY: True}
    unrouted = [i for i in range(layers) if f"blk.{i}.ffn_gate_inp.weight" not in shapes]
    if unrouted:
        raise ValueError(f"GGUF {arch} file has no router (ffn_gate_inp) in layers {unrouted}; llama.cpp "
                         "runs every layer of it as MoE")  # fmt: skip
    used = int(get("expert_used_count"))
    ffn = int(config["intermediate_size"])
    shared = int(get("expert_shared_feed_forward_length", ffn) or ffn)
    fields |= {
        "num_experts": int(get("expert_count")),
        "num_experts_per_tok": used,
        "moe_intermediate_size": int(get("expert_feed_forward_length", ffn // used) or ffn // used),
        "shared_expert_intermediate_size": shared,
        "norm_topk_prob": True,  # qwen3next.cpp / qwen35moe.cpp: build_moe_ffn(..., norm_w = true, ...)
    }
    if arch == QWEN35MOE:
        return fields | {TILED_V_HEADS_KEY: True}
    return fields | {"decoder_sparse_step": 1, "mlp_only_layers": [], SPLIT_PROJECTIONS_KEY: True}


def mtp_layer(arch: str, gguf_name: str, metadata: dict[str, Any]) -> bool:
    """Whether ``gguf_name`` belongs to one of the trailing multi-token-prediction blocks of a hybrid file
    (``<arch>.nextn_predict_layers`` of ``<arch>.block_count``; Qwen3.5's, Nemotron 3's), which the engine
    does not read."""
    nextn = int(metadata.get(f"{arch}.nextn_predict_layers", 0) or 0)
    hybrid = arch in HYBRID_GGUF_ARCHITECTURES or arch in NEMOTRON_H_ARCHITECTURES
    if not hybrid or not nextn or not gguf_name.startswith("blk."):
        return False
    return int(gguf_name.split(".")[1]) >= int(metadata[f"{arch}.block_count"]) - nextn


def linear_row_order(arch: str, gguf_name: str, rows: T, config: dict[str, Any]) -> T:
    """``ssm_ba``'s rows (values or raw blocks; per key head [b (r) | a (r)], r = v/k heads) as [all b | all a]."""
    if arch != QWEN3NEXT or not gguf_name.endswith(".ssm_ba.weight"):
        return rows
    arr = np.asarray(rows)
    k = int(config["linear_num_key_heads"])
    r = int(config["linear_num_value_heads"]) // k
    out = arr.reshape(k, 2, r, *arr.shape[1:]).swapaxes(0, 1).reshape(arr.shape)
    return out  # type: ignore[return-value]


def split_linear_rows(name: str, config: dict[str, Any]) -> list[tuple[str, int, int]] | None:
    """(parameter, first row, end row) of ``in_proj_b`` / ``in_proj_a`` in a reordered ``in_proj_ba`` of a
    model held with split projections; None for any other tensor or model."""
    if not config.get(SPLIT_PROJECTIONS_KEY) or not name.endswith(".linear_attn.in_proj_ba.weight"):
        return None
    stem, nv = name[: -len("in_proj_ba.weight")], int(config["linear_num_value_heads"])
    return [(stem + "in_proj_b.weight", 0, nv), (stem + "in_proj_a.weight", nv, 2 * nv)]


def as_hf_values(arch: str, name: str, values: np.ndarray) -> np.ndarray:
    """A dequantized ``arch`` tensor as Hugging Face holds it (see the module's list of transforms)."""
    if arch not in HYBRID_GGUF_ARCHITECTURES:
        return values
    if name.endswith(".A_log"):
        return np.log(-values)  # ssm_a = -exp(A_log) < 0
    if name.endswith("norm.weight") and not name.endswith("linear_attn.norm.weight"):
        return values - np.float32(1)
    if name.endswith("conv1d.weight") and values.ndim == 2:
        return values[:, None, :]  # (C, K) -> (C, 1, K)
    return values
