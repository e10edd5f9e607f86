"""GGUF files of Nemotron-H under llama.cpp's names: ``nemotron_h`` (Mamba-2, attention and squared-ReLU MLP
blocks: Nemotron-H, Nemotron Nano 2) and ``nemotron_h_moe`` (Mamba-2, attention and routed MoE blocks,
Nemotron 3's latent MoE where the file has ``moe_latent_size``), both NemotronHForCausalLM. A trailing
multi-token-prediction block (``nextn_predict_layers``, Nemotron 3's) is not read (gguf_hybrid.mtp_layer).

llama.cpp's converter (convert_hf_to_gguf.py ``NemotronHModel`` over ``GraniteHybridModel`` over
``Mamba2Model``; ``nemotron_h_moe`` where the config has ``num_experts_per_tok``) writes:

- ``backbone.layers.N.norm`` as ``attn_norm``, the mixer's parts as ``ssm_*`` (Mamba-2), ``attn_*``,
  ``ffn_up`` / ``ffn_down`` (MLP), ``ffn_gate_inp`` / ``ffn_{up,down}_exps`` (stacked (E, I, D) / (E, D, I))
  / ``ffn_{up,down}_shexp`` / ``ffn_latent_{down,up}`` (MoE), the router's correction bias as
  ``exp_probs_b.bias``; norms as stored (no + 1);
- ``A_log`` as ``ssm_a`` = -exp(A_log) of shape (H, 1) and ``D`` as ``ssm_d`` (H, 1) (no ``.weight``),
  ``dt_bias`` as ``ssm_dt.bias``, ``conv1d`` squeezed to (C, K), the gated norm (d_inner,) as
  (n_groups, d_inner / n_groups): undone here (:func:`nemotron_h_values`);
- the attention's q/k rows permuted per head as for llama (``undo_permute``; the layers have no rotary
  embedding, so llama.cpp never needs them back): read back in Hugging Face's order by gguf_reader's
  row un-permutation (a row permutation: exact on quantized blocks too).

Layer kinds as llama.cpp tells them (src/models/nemotron-h.cpp): Mamba-2 where ``head_count_kv[i]`` and
``feed_forward_length[i]`` are both 0, attention where only the latter is, else the MoE block where the
block has a router (``ffn_gate_inp``), the MLP where not.

llama.cpp does not clamp dt in its scan (``time_step_min`` 0 here, as llama.cpp runs the file;
transformers clamps prompt rows at the config's time_step_min, 1e-3 by default, so the two differ only
where softplus(dt + dt_bias) < 1e-3: the tests' models stay far above it) and the chunk length is not in
the file (transformers' default 128: it orders the sums, it does not change the result). Refused with
one message each: a layer whose tensors are not of its kind, a grouped router (``expert_group_count`` > 1)
without ``expert_group_used_count``. Torch-free.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np

NEMOTRON_H, NEMOTRON_H_MOE = "nemotron_h", "nemotron_h_moe"
NEMOTRON_H_ARCHITECTURES = frozenset({NEMOTRON_H, NEMOTRON_H_MOE})
TIME_STEP_MIN = 0.0  # llama.cpp's ssm_scan: softplus(dt + bias), unclamped
CHUNK_SIZE = 128  # transformers' NemotronHConfig default; not in the file

# GGUF part -> glassbox's (Hugging Face's, backbone -> model) path within a layer
NEMOTRON_H_LAYER_NAMES = {
    "attn_norm": "norm",
    "ssm_in": "mixer.in_proj",
    "ssm_conv1d": "mixer.conv1d",
    "ssm_norm": "mixer.norm",
    "ssm_out": "mixer.out_proj",
    "attn_q": "mixer.q_proj",
    "attn_k": "mixer.k_proj",
    "attn_v": "mixer.v_proj",
    "attn_output": "mixer.o_proj",
    "ffn_up": "mixer.up_proj",
    "ffn_down": "mixer.down_proj",
    "ffn_gate_inp": "mixer.gate",
    "ffn_up_exps": "mixer.experts.up_proj",  # stacked (E, I, D): a parameter without ".weight"
    "ffn_down_exps": "mixer.experts.down_proj",
    "ffn_up_shexp": "mixer.shared_experts.up_proj",
    "ffn_down_shexp": "mixer.shared_experts.down_proj",
    "ffn_latent_down": "mixer.fc1_latent_proj",
    "ffn_latent_up": "mixer.fc2_latent_proj",
}
STACKED_EXPERT_PATHS = frozenset({"mixer.experts.up_proj", "mixer.experts.down_proj"})
# GGUF tensor name after "blk.N." -> the whole name after "model.layers.N."
NEMOTRON_H_EXACT_NAMES = {
    "ssm_a": "mixer.A_log",
    "ssm_d": "mixer.D",
    "ssm_dt.bias": "mixer.dt_bias",
    "exp_probs_b.bias": "mixer.gate.e_score_correction_bias",
}
# the tensor each layer kind must hold (llama.cpp reads the kind from the metadata, then these)
_KIND_TENSOR = {"M": "ssm_in", "*": "attn_q", "-": "ffn_up", "E": "ffn_gate_inp"}
_KIND_NAME = {"M": "Mamba-2", "*": "attention", "-": "MLP", "E": "MoE"}


def _per_layer(value: Any, layers: int, key: str) -> list[int]:
    """A per-layer metadata array, or one value for every layer."""
    values = [int(v) for v in value] if isinstance(value, list) else [int(value)] * layers
    if len(values) != layers:
        raise ValueError(f"GGUF metadata {key} has {len(values)} entries for {layers} blocks")
    return values


def _pattern(arch: str, kv: list[int], ffn: list[int], shapes: dict[str, tuple[int, ...]]) -> str:
    """``hybrid_override_pattern`` as llama.cpp reads the layer kinds (models/nemotron-h.cpp: recurrent where
    head_count_kv and feed_forward_length are both 0, else attention where feed_forward_length is 0, else
    the MoE where the block has a router, else the MLP), each checked against its tensors."""
    kinds = "".join(
        ("M" if not k else "*") if not f else "E" if f"blk.{i}.ffn_gate_inp.weight" in shapes else "-"
        for i, (k, f) in enumerate(zip(kv, ffn, strict=True))
    )
    for i, kind in enumerate(kinds):
        if f"blk.{i}.{_KIND_TENSOR[kind]}.weight" not in shapes:
            raise ValueError(
                f"GGUF {arch} block {i} is a {_KIND_NAME[kind]} block by its metadata (head_count_kv "
                f"{kv[i]}, feed_forward_length {ffn[i]}) but has no {_KIND_TENSOR[kind]} tensor; a layout "
                "llama.cpp does not run (a dense MLP block in a nemotron_h_moe file?)"
            )
    return kinds


def nemotron_h_config(
    arch: str, metadata: dict[str, Any], shapes: dict[str, tuple[int, ...]], dtype: str
) -> dict[str, Any]:
    """The HF config.json-equivalent dict (NemotronHConfig's spelling) of a ``nemotron_h[_moe]`` file."""

    def get(name: str, default: Any = ValueError) -> Any:
        key = f"{arch}.{name}"
        if key in metadata:
            return metadata[key]
        if default is ValueError:
            raise ValueError(f"GGUF metadata lacks {key}, which a {arch} model needs")
        return default

    blocks = int(get("block_count"))
    layers = blocks - int(get("nextn_predict_layers", 0) or 0)  # less the MTP block (gguf_hybrid.mtp_layer)
    kv = _per_layer(get("attention.head_count_kv"), blocks, f"{arch}.attention.head_count_kv")[:layers]
    ffn = _per_layer(get("feed_forward_length"), blocks, f"{arch}.feed_forward_length")[:layers]
    pattern = _pattern(arch, kv, ffn, shapes)
    heads = int(get("attention.head_count"))
    q = next((shapes[f"blk.{i}.attn_q.weight"] for i, k in enumerate(pattern) if k == "*"), None)
    head_dim = int(get("attention.key_length", q[0] // heads if q else 0))
    inner, m_heads = int(get("ssm.inner_size")), int(get("ssm.time_step_rank"))
    eps = get("attention.layer_norm_rms_epsilon", None)  # the converter writes layer_norm_epsilon
    config: dict[str, Any] = {
        "architectures": ["NemotronHForCausalLM"],
        "model_type": "nemotron_h",
        "hidden_size": int(get("embedding_length")),
        "num_hidden_layers": layers,
        "hybrid_override_pattern": pattern,
        "num_attention_heads": heads,
        "num_key_value_heads": max(kv) or heads,
        "head_dim": head_dim,
        "intermediate_size": max(ffn),
        "vocab_size": int(shapes["token_embd.weight"][0]),
        "layer_norm_epsilon": float(eps if eps is not None else get("attention.layer_norm_epsilon")),
        "mamba_num_heads": m_heads,
        "mamba_head_dim": inner // m_heads,
        "n_groups": int(get("ssm.group_count")),
        "ssm_state_size": int(get("ssm.state_size")),
        "conv_kernel": int(get("ssm.conv_kernel")),
        "chunk_size": CHUNK_SIZE,
        "time_step_min": TIME_STEP_MIN,
        "use_conv_bias": any(n.endswith(".ssm_conv1d.bias") for n in shapes),
        "use_bias": any(n.endswith(".ssm_in.bias") for n in shapes),
        "mlp_hidden_act": "relu2",
        "mlp_bias": False,
        "attention_bias": False,
        "mamba_ssm_cache_dtype": "float32",
        "tie_word_embeddings": "output.weight" not in shapes,
        "torch_dtype": dtype,
    }
    if inner % m_heads or m_heads % config["n_groups"]:
        raise ValueError(
            f"GGUF {arch}: ssm inner size {inner} over {m_heads} heads in {config['n_groups']} groups"
        )
    if "E" in pattern:
        config.update(_moe_fields(arch, get))
    context = get("context_length", None)
    if context is not None:
        config["max_position_embeddings"] = int(context)
    for name in ("bos", "eos", "padding"):
        token_id = metadata.get(f"tokenizer.ggml.{name}_token_id")
        if token_id is not None:
            config[f"{'pad' if name == 'padding' else name}_token_id"] = int(token_id)
    return config


def _moe_fields(arch: str, get: Callable[..., Any]) -> dict[str, Any]:
    """The router and experts: sigmoid scores, the correction bias for the choice, groups, the weights
    renormalized (``expert_weights_norm``) and scaled (``expert_weights_scale``)."""
    groups = int(get("expert_group_count", 1) or 1)
    used_groups = get("expert_group_used_count", None)
    if groups > 1 and used_groups is None:
        raise ValueError(
            f"GGUF {arch} file routes over {groups} expert groups (expert_group_count) but does not say how "
            f"many are kept ({arch}.expert_group_used_count); not read"
        )
    latent = int(get("moe_latent_size", 0) or 0)
    return {
        "n_routed_experts": int(get("expert_count")),
        "num_experts_per_tok": int(get("expert_used_count")),
        "moe_intermediate_size": int(get("expert_feed_forward_length")),
        "moe_shared_expert_intermediate_size": int(get("expert_shared_feed_forward_length")),
        "n_shared_experts": int(get("expert_shared_count", 1) or 1),
        "norm_topk_prob": bool(get("expert_weights_norm", True)),
        "routed_scaling_factor": float(get("expert_weights_scale", 1.0)),
        "n_group": groups,
        "topk_group": int(used_groups if used_groups is not None else 1),
        "moe_latent_size": latent or None,
    }


def nemotron_h_values(name: str, values: np.ndarray) -> np.ndarray:
    """A dequantized tensor as Hugging Face holds it: A_log = log(-ssm_a) and D as (H,), conv1d (C, 1, K),
    the gated norm flat (d_inner,)."""
    if name.endswith(".A_log"):
        return np.log(-values.reshape(-1))
    if name.endswith(".D"):
        return values.reshape(-1)
    if name.endswith("conv1d.weight") and values.ndim == 2:
        return values[:, None, :]
    if name.endswith("mixer.norm.weight"):
        return values.reshape(-1)
    return values
