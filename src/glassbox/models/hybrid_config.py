"""ModelFacts of the hybrid families from their config.json dicts (read by models/config_reader.py, the one
module that opens config.json): Qwen3-Next and Qwen3.5 (Gated DeltaNet + gated attention, dense or
shared-expert MoE) and Nemotron-H / Nemotron 3 (Mamba-2, attention, MLP and (latent) MoE blocks).

Parameter counts are exact (as transformers counts ``parameters()``: Nemotron-H's router correction bias
is a buffer, not counted). ``state_bytes_per_seq`` is the planner's figure for a serving engine: the conv
window in the model's 16-bit dtype, the recurrent matrices at ``HybridSpec.ssm_bytes`` (Nemotron-H's
``mamba_ssm_cache_dtype``, float32 by default; the model's dtype for Qwen, vLLM's default).
"""

from __future__ import annotations

from typing import Any

from glassbox.models.facts import ModelFacts
from glassbox.models.families import family_of_type
from glassbox.models.hybrid_spec import GatedDeltaNetShape, HybridSpec, Mamba2Shape

QWEN_HYBRID_TYPES = ("qwen3_next", "qwen3_5_text", "qwen3_5_moe_text")
# set by the GGUF reader (models/gguf_hybrid.py): a Qwen3-Next held with Qwen3.5's split projections
SPLIT_PROJECTIONS_KEY = "glassbox_split_linear_projections"
# set by the GGUF reader (models/gguf_hybrid.py): a Qwen3.5 whose v heads are stored in llama.cpp's tiled order
TILED_V_HEADS_KEY = "glassbox_tiled_linear_value_heads"
_QWEN_LAYER_TYPES = {"linear_attention": "linear", "full_attention": "full"}
# Nemotron-H's pattern letters and transformers 5's layers_block_type names (older names too)
_NEMOTRON_PATTERN = {"M": "linear_attention", "*": "full_attention", "-": "mlp", "E": "moe"}
_NEMOTRON_LEGACY = {"mamba": "linear_attention", "attention": "full_attention"}


def _architecture(base: dict[str, Any]) -> str:
    """The config's architecture, or for one that names none its text model's."""
    family = family_of_type(str(base["model_type"]))  # a text model that names no architecture
    return str(base["architecture"] or (family.architecture if family is not None else ""))


def _qwen_layer_types(cfg: dict[str, Any], n_layers: int) -> list[str]:
    types = cfg.get("layer_types")
    if types is None:  # every full_attention_interval-th layer is full attention (default 4)
        interval = int(cfg.get("full_attention_interval") or 4)
        types = ["full_attention" if (i + 1) % interval == 0 else "linear_attention" for i in range(n_layers)]
    if len(types) != n_layers:
        raise ValueError(f"MODEL: layer_types has {len(types)} entries for {n_layers} layers")
    unknown = sorted({str(t) for t in types} - set(_QWEN_LAYER_TYPES))
    if unknown:
        raise ValueError(
            f"MODEL: unknown layer kind(s) {', '.join(map(repr, unknown))} in layer_types "
            f"(supported: {', '.join(_QWEN_LAYER_TYPES)})"
        )
    return [_QWEN_LAYER_TYPES[str(t)] for t in types]


def qwen_hybrid_facts(cfg: dict[str, Any], base: dict[str, Any]) -> ModelFacts:
    """Qwen3-Next (fused in_proj_qkvz/in_proj_ba, MoE per decoder_sparse_step/mlp_only_layers), Qwen3.5
    (dense MLP) and Qwen3.5-MoE (every layer MoE, top-k renormalized); ``base``: config_reader's fields."""
    mt, hidden, n_layers = base["model_type"], base["hidden_size"], base["num_layers"]
    heads, kv_heads, head_dim = base["num_heads"], base["num_kv_heads"], base["head_dim"]
    vocab, inter = base["vocab_size"], base["intermediate_size"]
    mixers = _qwen_layer_types(cfg, n_layers)
    gdn = GatedDeltaNetShape(
        num_k_heads=int(cfg.get("linear_num_key_heads", 16)),
        num_v_heads=int(cfg.get("linear_num_value_heads", 32)),
        head_k_dim=int(cfg.get("linear_key_head_dim", 128)),
        head_v_dim=int(cfg.get("linear_value_head_dim", 128)),
        conv_kernel=int(cfg.get("linear_conv_kernel_dim", 4)),
        fused_projections=mt == "qwen3_next" and not cfg.get(SPLIT_PROJECTIONS_KEY),
        tiled_v_heads=bool(cfg.get(TILED_V_HEADS_KEY)),
    )
    if gdn.num_v_heads % gdn.num_k_heads:
        raise ValueError(
            f"MODEL: linear_num_value_heads {gdn.num_v_heads} is not a multiple of linear_num_key_heads "
            f"{gdn.num_k_heads}"
        )
    bias = bool(cfg.get("attention_bias", False))
    q, kv = heads * head_dim, kv_heads * head_dim
    attn_layer = hidden * 2 * q + 2 * hidden * kv + q * hidden + 2 * head_dim  # q (+gate), k, v, o, q/k norms
    attn_layer += (2 * q + 2 * kv + hidden) if bias else 0
    nv = gdn.num_v_heads
    gdn_layer = (
        hidden * (gdn.conv_dim + gdn.value_dim + 2 * nv)  # [q | k | v], z, b, a
        + gdn.conv_dim * gdn.conv_kernel
        + 2 * nv  # dt_bias, A_log
        + gdn.head_v_dim  # the gated norm
        + gdn.value_dim * hidden  # out_proj
    )
    n_exp = 0 if mt == "qwen3_5_text" else int(cfg.get("num_experts") or 0)
    top_k = int(cfg.get("num_experts_per_tok") or 0) if n_exp else 0
    if mt == "qwen3_5_moe_text":
        is_moe = [True] * n_layers
    elif n_exp:
        step = int(cfg.get("decoder_sparse_step", 1) or 1)
        dense_only = set(cfg.get("mlp_only_layers") or [])
        is_moe = [i not in dense_only and (i + 1) % step == 0 for i in range(n_layers)]
    else:
        is_moe = [False] * n_layers
    moe_layers = sum(is_moe)
    exp_inter = int(cfg.get("moe_intermediate_size") or 0) if n_exp else 0
    shared_inter = int(cfg.get("shared_expert_intermediate_size") or 0) if n_exp else 0
    per_expert = 3 * hidden * exp_inter
    shared_layer = hidden * n_exp + (3 * hidden * shared_inter + hidden if shared_inter else 0)
    params = {
        "embed": vocab * hidden,
        "lm_head": vocab * hidden,
        "attention": mixers.count("full") * attn_layer,
        "mlp": (n_layers - moe_layers) * 3 * hidden * inter,
        "experts": moe_layers * n_exp * per_expert,
        "moe_shared": moe_layers * shared_layer,
        "mamba": mixers.count("linear") * gdn_layer,  # the recurrent mixers' group
        "norms": 2 * n_layers * hidden + hidden,
    }
    spec = HybridSpec(
        layer_mixers=tuple(mixers),
        gdn=gdn,
        attn_output_gate=True,
        norm_eps=base["rms_norm_eps"],
        ssm_bytes=2,
        mtp_layers=int(cfg.get("mtp_num_hidden_layers") or cfg.get("num_nextn_predict_layers") or 0),
    )
    ffn = max(top_k * exp_inter + shared_inter, inter if moe_layers < n_layers else 0)
    return ModelFacts(
        **{**base, "qk_norm": True, "qkv_bias": bias, "o_bias": bias, "architecture": _architecture(base)},
        layer_mixers=tuple(mixers),
        sliding_window=None,
        params=params,
        num_experts=n_exp,
        experts_per_token=top_k,
        moe_layers=moe_layers if n_exp else 0,
        params_per_expert=per_expert if n_exp else 0,
        moe_intermediate_size=exp_inter,
        shared_expert_intermediate_size=shared_inter,
        shared_expert_gated=shared_inter > 0,
        # Qwen3-Next: norm_topk_prob (default True); Qwen3.5-MoE's router always renormalizes
        norm_topk_prob=bool(n_exp) and (mt == "qwen3_5_moe_text" or bool(cfg.get("norm_topk_prob", True))),
        layer_moe=tuple(is_moe) if n_exp else (),
        ffn_width=max(ffn, 2 * gdn.value_dim),
        state_bytes_per_seq=spec.state_bytes(2, spec.ssm_bytes),
        mixer_flops_per_token=spec.mixer_flops_per_token(),
        hybrid=spec,
        notes=(
            "hybrid Gated DeltaNet / attention: KV only in the full-attention layers; each sequence also "
            "holds a fixed recurrent state",
            "multi-token-prediction layers not counted (used only for speculative decoding)",
        ),
    )


def nemotron_layer_types(cfg: dict[str, Any]) -> list[str]:
    """The block kind of each layer from ``hybrid_override_pattern`` (M, *, -, E) or transformers 5's
    ``layers_block_type``; ValueError naming an unknown kind."""
    pattern = cfg.get("hybrid_override_pattern")
    if isinstance(pattern, str):
        unknown = sorted(set(pattern) - set(_NEMOTRON_PATTERN))
        if unknown:
            raise ValueError(
                f"MODEL: unknown layer kind(s) {', '.join(map(repr, unknown))} in hybrid_override_pattern "
                f"(supported: M Mamba-2, * attention, - MLP, E MoE)"
            )
        return [_NEMOTRON_PATTERN[c] for c in pattern]
    types = cfg.get("layers_block_type") or cfg.get("layer_types")
    if not isinstance(types, list):
        raise ValueError("MODEL: a nemotron_h config needs hybrid_override_pattern or layers_block_type")
    kinds = [_NEMOTRON_LEGACY.get(str(t), str(t)) for t in types]
    unknown = sorted(set(kinds) - set(_NEMOTRON_PATTERN.values()))
    if unknown:
        raise ValueError(
            f"MODEL: unknown layer kind(s) {', '.join(map(repr, unknown))} in layers_block_type "
            f"(supported: {', '.join(_NEMOTRON_PATTERN.values())})"
        )
    return kinds


def nemotron_h_facts(cfg: dict[str, Any], base: dict[str, Any]) -> ModelFacts:
    """Hybrid: 'M' Mamba-2 mixer, 'E' (latent) MoE, '*' attention, '-' dense MLP; one block per layer."""
    kinds = nemotron_layer_types(cfg)[: base["num_layers"]]
    hidden, n_layers = base["hidden_size"], len(kinds)
    heads, kv_heads, head_dim = base["num_heads"], base["num_kv_heads"], base["head_dim"]
    vocab = base["vocab_size"]
    mamba = Mamba2Shape(
        num_heads=int(cfg["mamba_num_heads"]),
        head_dim=int(cfg["mamba_head_dim"]),
        n_groups=int(cfg.get("n_groups", cfg.get("mamba_n_groups", 8))),
        state_size=int(cfg["ssm_state_size"]),
        conv_kernel=int(cfg.get("conv_kernel", cfg.get("mamba_d_conv", 4))),
        chunk_size=int(cfg.get("chunk_size", cfg.get("mamba_chunk_size", 128))),
        time_step_min=float(cfg.get("time_step_min", cfg.get("mamba_dt_min", 0.001))),
        conv_bias=bool(cfg.get("use_conv_bias", cfg.get("mamba_conv_bias", True))),
        proj_bias=bool(cfg.get("use_bias", False)),
    )
    d_inner, groups, state = mamba.d_inner, mamba.n_groups, mamba.state_size
    if mamba.num_heads % groups:
        raise ValueError(f"MODEL: mamba_num_heads {mamba.num_heads} is not a multiple of n_groups {groups}")
    in_proj = hidden * (2 * d_inner + 2 * groups * state + mamba.num_heads)
    conv = mamba.conv_dim * (mamba.conv_kernel + (1 if mamba.conv_bias else 0))
    bias = (in_proj // hidden + hidden) if mamba.proj_bias else 0
    mamba_layer = in_proj + conv + 3 * mamba.num_heads + d_inner + d_inner * hidden + bias
    n_exp, top_k = int(cfg.get("n_routed_experts", 0)), int(cfg.get("num_experts_per_tok", 0))
    exp_inter = int(cfg.get("moe_intermediate_size", 0))
    latent = int(cfg.get("moe_latent_size") or 0)
    exp_in = latent or hidden
    per_expert = 2 * exp_in * exp_inter  # relu^2 experts: up + down, no gate
    shared_inter = int(cfg.get("moe_shared_expert_intermediate_size", 0)) * int(
        cfg.get("n_shared_experts", 1)
    )
    shared_per_layer = hidden * n_exp + 2 * hidden * shared_inter + (2 * hidden * latent if latent else 0)
    n_m, n_e, n_a, n_d = (kinds.count(k) for k in ("linear_attention", "moe", "full_attention", "mlp"))
    mixers = tuple(
        "mamba" if k == "linear_attention" else "full" if k == "full_attention" else "none" for k in kinds
    )
    params = {
        "embed": vocab * hidden,
        "lm_head": vocab * hidden,
        "attention": n_a * (2 * hidden * heads * head_dim + 2 * hidden * kv_heads * head_dim),
        "mlp": n_d * 2 * hidden * int(cfg.get("intermediate_size", 0)),
        "experts": n_e * n_exp * per_expert,
        "moe_shared": n_e * shared_per_layer,
        "mamba": n_m * mamba_layer,
        "norms": n_layers * hidden + hidden,
    }
    ssm_bytes = 4 if str(cfg.get("mamba_ssm_cache_dtype", "float32")) == "float32" else 2
    spec = HybridSpec(
        layer_mixers=mixers,
        mamba=mamba,
        mlp_act=str(cfg.get("mlp_hidden_act", "relu2")),
        n_group=int(cfg.get("n_group", 1)),
        topk_group=int(cfg.get("topk_group", 1)),
        routed_scaling_factor=float(cfg.get("routed_scaling_factor", 1.0)),
        moe_latent_size=latent,
        norm_eps=float(cfg.get("layer_norm_epsilon", 1e-5)),
        ssm_bytes=ssm_bytes,
    )
    return ModelFacts(
        **{
            **base,
            "num_layers": n_layers,
            "rms_norm_eps": spec.norm_eps,
            "architecture": _architecture(base),
        },
        layer_mixers=mixers,
        sliding_window=None,
        params=params,
        num_experts=n_exp,
        experts_per_token=top_k if n_exp else 0,
        moe_layers=n_e if n_exp else 0,
        params_per_expert=per_expert if n_exp else 0,
        moe_intermediate_size=exp_inter,
        shared_expert_intermediate_size=shared_inter,
        norm_topk_prob=bool(cfg.get("norm_topk_prob", True)),
        layer_moe=tuple(k == "moe" for k in kinds) if n_exp else (),
        ffn_width=max(top_k * exp_inter + shared_inter, 2 * d_inner),
        state_bytes_per_seq=spec.state_bytes(2, ssm_bytes),
        mixer_flops_per_token=n_m * 6.0 * d_inner * state,  # SSD scan: state update + readout
        hybrid=spec,
        notes=(
            "hybrid Mamba-2/MoE: KV only in the attention layers; each sequence also holds a fixed Mamba state",
            "multi-token-prediction layer not counted (used only for speculative decoding)",
        ),
    )
