"""Reading a model's config.json into ModelFacts: the one module that parses config.json.

Parameter counts per group are exact (norms and biases included) for llama, mistral, qwen2, qwen3, qwen2_moe, qwen3_moe,
mixtral, gemma3_text, gemma4_text (models/gemma4_facts.py), gpt_oss, phi3, and (models/hybrid_config.py)
nemotron_h (hybrid Mamba-2 / latent MoE / attention), qwen3_next, qwen3_5_text and qwen3_5_moe_text (Gated
DeltaNet / gated attention). "Active"
parameters are those one token touches: everything except the embedding table (a decode step gathers one
row) and the routed experts not chosen (MoE: top-k of E per layer).
"""

from __future__ import annotations

import json
from dataclasses import replace
from pathlib import Path
from typing import Any

from glassbox.models.facts import ModelFacts, config_dtype, id_list, rope_parameters
from glassbox.models.families import family_of_type, model_types
from glassbox.models.gemma4_facts import gemma4_facts, with_defaults
from glassbox.models.gguf_reader import GGUFCheckpoint
from glassbox.models.hybrid_config import (
    QWEN_HYBRID_TYPES,
    nemotron_h_facts,
    nemotron_layer_types,
    qwen_hybrid_facts,
)
from glassbox.quant.config import gguf_native_quant, method_config, native_quant_from_config

CONFIG_FILE = "config.json"


def layer_kinds(cfg: dict[str, Any], n_layers: int) -> tuple[list[str], int | None]:
    """Per-layer attention kind from layer_types / sliding_window_pattern / sliding_window."""
    window = cfg.get("sliding_window")
    types = cfg.get("layer_types")
    if isinstance(types, list) and len(types) == n_layers:
        kinds = ["sliding" if "sliding" in str(t) else "full" for t in types]
        return kinds, (int(window) if window and "sliding" in kinds else None)
    pattern = cfg.get("sliding_window_pattern")
    if window and pattern:  # Gemma 3: every pattern-th layer is global
        kinds = ["full" if (i + 1) % int(pattern) == 0 else "sliding" for i in range(n_layers)]
        return kinds, int(window)
    use_sw = cfg.get("use_sliding_window", cfg.get("model_type") in ("mistral", "mixtral", "phi3"))
    if window and use_sw:
        limit = int(cfg.get("max_window_layers", n_layers))
        # Qwen2 convention: layers below max_window_layers use full attention.
        if cfg.get("model_type", "").startswith("qwen"):
            kinds = ["full" if i < limit else "sliding" for i in range(n_layers)]
        else:
            kinds = ["sliding"] * n_layers
        return kinds, (int(window) if "sliding" in kinds else None)
    return ["full"] * n_layers, None


def _attention_biases(cfg: dict[str, Any]) -> tuple[bool, bool]:
    """(q/k/v biases, o_proj bias): Qwen2 always biases q/k/v only; others follow attention_bias."""
    if cfg.get("model_type") == "qwen2":
        return True, False
    if cfg.get("model_type") == "qwen2_moe":  # transformers 5 names it qkv_bias (default True)
        return bool(cfg.get("qkv_bias", True)), False
    bias = bool(cfg.get("attention_bias", False))
    return bias, bias


def _attention_params(cfg: dict[str, Any], hidden: int, heads: int, kv_heads: int, head_dim: int) -> int:
    mt = cfg.get("model_type", "")
    q, kv = heads * head_dim, kv_heads * head_dim
    weights = hidden * q + 2 * hidden * kv + q * hidden
    qkv_bias, o_bias = _attention_biases(cfg)
    weights += (q + 2 * kv if qkv_bias else 0) + (hidden if o_bias else 0)
    if mt in ("qwen3", "qwen3_moe", "gemma3_text"):
        weights += 2 * head_dim  # q_norm, k_norm
    if mt == "gpt_oss":
        weights += heads  # attention sinks
    return weights


def _optional_float(value: Any) -> float | None:
    return None if value is None else float(value)


def _gemma3_fields(cfg: dict[str, Any], hidden: int) -> dict[str, Any]:
    """Gemma 3's own settings: each layer kind's rope, the attention and embedding scales.

    Global (full-attention) layers: rope_theta (default 1e6) with rope_scaling; local (sliding) layers:
    rope_local_base_freq (default 1e4), unscaled. transformers 5 writes both as rope_parameters per
    layer type."""
    if cfg.get("model_type") != "gemma3_text":
        return {}
    local_base = float(cfg.get("rope_local_base_freq") or 10000.0)
    return dict(
        rope=rope_parameters(cfg, "full_attention", default_theta=1_000_000.0),
        rope_local=rope_parameters(cfg, "sliding_attention", default_theta=local_base),
        query_pre_attn_scalar=float(cfg.get("query_pre_attn_scalar") or 256),
        embed_scale=hidden**0.5,
    )


def _gpt_oss_moe(cfg: dict[str, Any]) -> dict[str, Any]:
    """gpt-oss's routing (top-k of the logits, softmax over the k), biases, and clamped SwiGLU experts."""
    return dict(
        moe_router="topk_softmax",
        moe_bias=True,
        swiglu_limit=float(cfg.get("swiglu_limit", 7.0)),
        swiglu_alpha=float(cfg.get("swiglu_alpha", 1.702)),
    )


def _quantization_config(cfg: dict[str, Any]) -> dict[str, Any]:
    qc = cfg.get("quantization_config")
    return dict(qc) if isinstance(qc, dict) else {}


def _common(cfg: dict[str, Any], name: str) -> dict[str, Any]:
    """The fields every family shares: shapes, settings, dtype, token ids, quantization."""
    mt = str(cfg["model_type"])
    hidden, heads = int(cfg["hidden_size"]), int(cfg["num_attention_heads"])
    dtype, declared = config_dtype(cfg)
    archs = cfg.get("architectures") or []
    qkv_bias, o_bias = _attention_biases(cfg)
    bos = id_list(cfg.get("bos_token_id"))
    fields = dict(
        name=name,
        model_type=mt,
        architecture=str(archs[0]) if archs else "",
        hidden_size=hidden,
        num_layers=int(cfg["num_hidden_layers"]),
        vocab_size=int(cfg["vocab_size"]),
        num_heads=heads,
        num_kv_heads=int(cfg.get("num_key_value_heads") or heads),
        head_dim=int(cfg.get("head_dim") or hidden // heads),
        intermediate_size=int(cfg.get("intermediate_size") or 0),
        rms_norm_eps=float(cfg.get("rms_norm_eps", 1e-6)),
        hidden_act=str(cfg.get("hidden_act") or cfg.get("hidden_activation") or "silu"),
        qkv_bias=qkv_bias,
        o_bias=o_bias,
        mlp_bias=bool(cfg.get("mlp_bias", False)),
        qk_norm=mt in ("qwen3", "qwen3_moe", "gemma3_text"),
        attention_sinks=mt == "gpt_oss",
        rope=rope_parameters(cfg, default_theta=150000.0 if mt == "gpt_oss" else 10000.0),
        tie_word_embeddings=bool(cfg.get("tie_word_embeddings", mt == "gemma3_text")),
        dtype=dtype,
        dtype_declared=declared,
        native_quant=native_quant_from_config(cfg, dtype),
        quantization_config=_quantization_config(cfg),
        max_context=int(cfg.get("max_position_embeddings") or 0),
        bos_token_id=bos[0] if bos else None,
        eos_token_ids=tuple(id_list(cfg.get("eos_token_id"))),
        final_logit_softcapping=_optional_float(cfg.get("final_logit_softcapping")),
        attn_logit_softcapping=_optional_float(cfg.get("attn_logit_softcapping")),
    )
    return fields | _gemma3_fields(cfg, hidden)


def transformer_facts(cfg: dict[str, Any], name: str) -> ModelFacts:
    base = _common(cfg, name)
    mt, hidden, n_layers = base["model_type"], base["hidden_size"], base["num_layers"]
    heads, kv_heads, head_dim = base["num_heads"], base["num_kv_heads"], base["head_dim"]
    vocab, inter = base["vocab_size"], base["intermediate_size"]
    kinds, window = layer_kinds(cfg, n_layers)
    attn = n_layers * _attention_params(cfg, hidden, heads, kv_heads, head_dim)
    norms_per_layer = 4 if mt == "gemma3_text" else 2
    norms = n_layers * norms_per_layer * hidden + hidden

    n_exp = int(cfg.get("num_local_experts") or cfg.get("num_experts") or 0)
    top_k = int(cfg.get("num_experts_per_tok") or cfg.get("experts_per_token") or 0)
    mlp = experts = shared = per_expert = moe_layers = exp_inter = shared_inter = 0
    ffn_width = inter
    is_moe: list[bool] = []
    if n_exp:
        exp_inter = int(cfg.get("moe_intermediate_size") or inter)
        if mt == "gpt_oss":  # fused gate_up (+bias) and down (+bias)
            per_expert = 3 * hidden * exp_inter + 2 * exp_inter + hidden
            router = hidden * n_exp + n_exp
        else:
            per_expert = 3 * hidden * exp_inter
            router = hidden * n_exp
        sparse_step = int(cfg.get("decoder_sparse_step", 1) or 1)
        dense_only = set(cfg.get("mlp_only_layers") or [])
        is_moe = [i not in dense_only and (i + 1) % sparse_step == 0 for i in range(n_layers)]
        moe_layers = sum(is_moe)
        experts = moe_layers * n_exp * per_expert
        shared_inter = int(cfg.get("shared_expert_intermediate_size") or 0)
        shared_per_layer = router + (3 * hidden * shared_inter + hidden if shared_inter else 0)
        shared = moe_layers * shared_per_layer
        mlp = (n_layers - moe_layers) * 3 * hidden * inter
        ffn_width = max(top_k * exp_inter + shared_inter, inter if moe_layers < n_layers else 0)
    else:
        mlp = n_layers * 3 * hidden * inter
        if base["mlp_bias"]:
            mlp += n_layers * (2 * inter + hidden)
    params = {
        "embed": vocab * hidden,
        "lm_head": vocab * hidden,
        "attention": attn,
        "mlp": mlp,
        "experts": experts,
        "moe_shared": shared,
        "mamba": 0,
        "norms": norms,
    }
    return ModelFacts(
        **base,
        layer_mixers=tuple(kinds),
        sliding_window=window,
        params=params,
        num_experts=n_exp,
        experts_per_token=top_k if n_exp else 0,
        moe_layers=moe_layers if n_exp else 0,
        params_per_expert=per_expert if n_exp else 0,
        moe_intermediate_size=exp_inter,
        shared_expert_intermediate_size=shared_inter,
        shared_expert_gated=mt == "qwen2_moe" and shared_inter > 0,
        # Mixtral renormalizes its top-k always; Qwen2/3-MoE where the config says so (default False)
        norm_topk_prob=bool(n_exp) and (mt == "mixtral" or bool(cfg.get("norm_topk_prob", False))),
        **(_gpt_oss_moe(cfg) if mt == "gpt_oss" and n_exp else {}),
        layer_moe=tuple(is_moe),
        ffn_width=ffn_width,
    )


def facts_from_config(cfg: dict[str, Any], name: str = "model") -> ModelFacts:
    """Build ModelFacts from a config.json dict (multimodal configs: their ``text_config``; the engine runs the
    text model of an architecture its family lists as ``multimodal``)."""
    outer = str((cfg.get("architectures") or [""])[0])
    if "text_config" in cfg and "hidden_size" not in cfg:
        text = dict(cfg["text_config"])
        text.setdefault("quantization_config", cfg.get("quantization_config"))
        text.setdefault("torch_dtype", cfg.get("torch_dtype") or cfg.get("dtype"))
        text.setdefault("model_type", f"{cfg.get('model_type', '')}_text")
        text.setdefault("tie_word_embeddings", cfg.get("tie_word_embeddings", False))
        text_family = family_of_type(str(text["model_type"]))
        if not text.get("architectures") and text_family is not None:
            text["architectures"] = [text_family.architecture]  # the text model alone
        cfg = text
    mt = str(cfg.get("model_type", ""))
    family = family_of_type(mt)
    if family is None:
        raise ValueError(f"MODEL: model_type {mt!r} is not supported; supported: {', '.join(model_types())}")
    mt = family.model_type  # "gemma3": its text model
    cfg = {**cfg, "model_type": mt}
    if outer in family.multimodal:
        cfg["architectures"] = [family.architecture]
    if mt == "nemotron_h":  # transformers 5 writes layers_block_type and no num_hidden_layers
        cfg.setdefault("num_hidden_layers", len(nemotron_layer_types(cfg)))
        return nemotron_h_facts(cfg, _common(cfg, name))
    if mt in QWEN_HYBRID_TYPES:
        return qwen_hybrid_facts(cfg, _common(cfg, name))
    if mt == "gemma4_text":
        cfg = with_defaults(cfg)
        return gemma4_facts(cfg, _common(cfg, name))
    return transformer_facts(cfg, name)


def read_config(model_dir: str | Path, missing_ok: bool = False) -> dict[str, Any]:
    """A model directory's config.json as a dict, with a ModelOpt hf_quant_config.json folded in.

    The one place config.json is parsed. FileNotFoundError when it is missing (``missing_ok``: {})."""
    path = Path(model_dir)
    if path.is_dir():
        path = path / CONFIG_FILE
    if not path.is_file():
        if missing_ok:
            return {}
        raise FileNotFoundError(f"config.json not found in model directory {path.parent}")
    cfg: dict[str, Any] = json.loads(path.read_text())
    quant_file = path.parent / "hf_quant_config.json"  # ModelOpt checkpoints keep it beside config.json
    if "quantization_config" not in cfg and quant_file.is_file():
        section = json.loads(quant_file.read_text()).get("quantization", {})  # algo, group size, exclusions
        cfg["quantization_config"] = method_config("modelopt", **{"quant_algo": "", **section})
    return cfg


def facts_from_dir(model_dir: str | Path, name: str | None = None) -> ModelFacts:
    """ModelFacts of a Hugging Face model directory (or a config.json path)."""
    path = Path(model_dir)
    cfg = read_config(path)
    folder = path if path.is_dir() else path.parent
    return facts_from_config(cfg, name or folder.name or str(model_dir))


def facts_from_gguf(checkpoint: GGUFCheckpoint, name: str) -> ModelFacts:
    """ModelFacts of a GGUF checkpoint: its config, and its formats as stored (bits per weight per group)."""
    facts = facts_from_config(checkpoint.config, name)
    quant = gguf_native_quant(checkpoint.stored_sizes(), checkpoint.tensor_types, facts.tie_word_embeddings)
    return replace(facts, native_quant=quant)
