"""Model facts from a Hugging Face config.json: parameter counts per group, attention layout, KV bytes.

Counts are exact for the supported families (norms and biases included): llama, mistral, qwen2, qwen3,
qwen2_moe, qwen3_moe, mixtral, gemma3_text, gpt_oss, nemotron_h (hybrid Mamba-2 / latent MoE / attention).
"Active" parameters are those one token touches: everything except the embedding table (a decode step
gathers one row) and the routed experts not chosen (MoE: top-k of E per layer).
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from glassbox.perf.model_presets import PRESETS
from glassbox.perf.quant import NativeQuant, native_quant_from_config

SUPPORTED_TYPES = (
    "llama",
    "mistral",
    "qwen2",
    "qwen3",
    "qwen2_moe",
    "qwen3_moe",
    "mixtral",
    "gemma3_text",
    "gpt_oss",
    "nemotron_h",
)
_DTYPES = {"bfloat16": "bf16", "float16": "fp16", "float32": "fp32"}


@dataclass(frozen=True)
class ModelFacts:
    """Shapes and parameter counts of one model (counts in parameters, bytes in bytes)."""

    name: str
    model_type: str
    hidden_size: int
    num_layers: int
    vocab_size: int
    num_heads: int
    num_kv_heads: int
    head_dim: int
    layer_mixers: tuple[str, ...]  # per layer: "full" | "sliding" (both hold KV) | "mamba" | "none"
    sliding_window: int | None
    params: dict[str, int]  # per quant.GROUPS; "experts" = all routed experts of all layers
    num_experts: int = 0
    experts_per_token: int = 0
    moe_layers: int = 0
    params_per_expert: int = 0  # one routed expert in one layer
    ffn_width: int = 0  # widest FFN activation per token (activation-memory estimate)
    tie_word_embeddings: bool = False
    state_bytes_per_seq: int = 0  # recurrent (Mamba) state per sequence: SSM + conv, read+written each step
    mixer_flops_per_token: float = 0.0  # recurrent-scan FLOPs per token beyond the linear projections
    dtype: str = "bf16"
    native_quant: NativeQuant | None = None
    max_context: int = 0
    notes: tuple[str, ...] = field(default_factory=tuple)

    @property
    def kv_layers(self) -> tuple[int, int]:
        """(full-attention layers, sliding-window layers)."""
        return self.layer_mixers.count("full"), self.layer_mixers.count("sliding")

    @property
    def total_params(self) -> int:
        """Parameters stored once (a tied lm_head shares the embedding table)."""
        total = sum(self.params.values())
        return total - self.params["lm_head"] if self.tie_word_embeddings else total

    @property
    def active_params(self) -> int:
        """Parameters one token reads: all but the embedding table and the unchosen routed experts."""
        dense = sum(v for k, v in self.params.items() if k not in ("embed", "experts"))
        return dense + self.moe_layers * self.experts_per_token * self.params_per_expert

    @property
    def is_moe(self) -> bool:
        return self.num_experts > 0

    def kv_bytes_per_token(self, bytes_per_element: float = 2.0) -> float:
        """KV bytes one token adds while the context is shorter than any sliding window."""
        full, sliding = self.kv_layers
        return (full + sliding) * 2 * self.num_kv_heads * self.head_dim * bytes_per_element

    def kv_bytes(self, seq_len: int, bytes_per_element: float = 2.0) -> float:
        """KV cache of one sequence of ``seq_len`` tokens; sliding layers keep at most the window."""
        full, sliding = self.kv_layers
        per_layer_token = 2 * self.num_kv_heads * self.head_dim * bytes_per_element
        window = min(seq_len, self.sliding_window or seq_len)
        return per_layer_token * (full * seq_len + sliding * window)

    def attention_flops(self, num_new: int, context_before: int) -> float:
        """QK^T and PV FLOPs for ``num_new`` causal queries after ``context_before`` cached tokens.

        Per layer and query attending to n keys: 4 * heads * head_dim * n (2 FLOPs per MAC, two matmuls).
        """
        full, sliding = self.kv_layers
        keys_full = num_new * context_before + num_new * (num_new + 1) / 2
        keys_sliding = _sliding_keys(num_new, context_before, self.sliding_window or 0) if sliding else 0.0
        return 4.0 * self.num_heads * self.head_dim * (full * keys_full + sliding * keys_sliding)

    def describe_attention(self) -> str:
        full, sliding = self.kv_layers
        mamba = self.layer_mixers.count("mamba")
        gqa = f"GQA {self.num_heads}q/{self.num_kv_heads}kv x {self.head_dim}"
        parts = [f"{full} full"]
        if sliding:
            parts.append(f"{sliding} sliding (window {self.sliding_window})")
        if mamba:
            parts.append(f"{mamba} Mamba-2 (no KV)")
        return f"{gqa}; layers: " + ", ".join(parts)


def _sliding_keys(n: int, c: int, w: int) -> float:
    """sum_{i=1..n} min(c + i, w): keys seen by n new queries in a window of w after c cached tokens."""
    if w <= 0:
        return 0.0
    if c >= w:
        return float(n * w)
    m = min(n, w - c)  # queries still inside the window's growth phase
    return m * c + m * (m + 1) / 2 + (n - m) * w


def _layer_kinds(cfg: dict[str, Any], n_layers: int) -> tuple[list[str], int | None]:
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
    use_sw = cfg.get("use_sliding_window", cfg.get("model_type") == "mistral")
    if window and use_sw:
        limit = int(cfg.get("max_window_layers", n_layers))
        # Qwen2 convention: layers below max_window_layers use full attention.
        if cfg.get("model_type", "").startswith("qwen"):
            kinds = ["full" if i < limit else "sliding" for i in range(n_layers)]
        else:
            kinds = ["sliding"] * n_layers
        return kinds, (int(window) if "sliding" in kinds else None)
    return ["full"] * n_layers, None


def _attention_params(cfg: dict[str, Any], hidden: int, heads: int, kv_heads: int, head_dim: int) -> int:
    mt = cfg.get("model_type", "")
    q, kv = heads * head_dim, kv_heads * head_dim
    weights = hidden * q + 2 * hidden * kv + q * hidden
    bias = cfg.get("attention_bias", False)
    if mt in ("qwen2", "qwen2_moe"):  # q/k/v carry biases, o_proj does not
        weights += q + 2 * kv
    elif bias:
        weights += q + 2 * kv + hidden
    if mt in ("qwen3", "qwen3_moe", "gemma3_text"):
        weights += 2 * head_dim  # q_norm, k_norm
    if mt == "gpt_oss":
        weights += heads  # attention sinks
    return weights


def _transformer_facts(cfg: dict[str, Any], name: str) -> ModelFacts:
    mt = cfg["model_type"]
    hidden, n_layers = int(cfg["hidden_size"]), int(cfg["num_hidden_layers"])
    heads = int(cfg["num_attention_heads"])
    kv_heads = int(cfg.get("num_key_value_heads") or heads)
    head_dim = int(cfg.get("head_dim") or hidden // heads)
    vocab, inter = int(cfg["vocab_size"]), int(cfg.get("intermediate_size", 0))
    kinds, window = _layer_kinds(cfg, n_layers)
    attn = n_layers * _attention_params(cfg, hidden, heads, kv_heads, head_dim)
    norms_per_layer = 4 if mt == "gemma3_text" else 2
    norms = n_layers * norms_per_layer * hidden + hidden

    n_exp = int(cfg.get("num_local_experts") or cfg.get("num_experts") or 0)
    top_k = int(cfg.get("num_experts_per_tok") or cfg.get("experts_per_token") or 0)
    mlp = experts = shared = per_expert = moe_layers = 0
    ffn_width = inter
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
        if cfg.get("mlp_bias"):
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
    return _finish(
        cfg,
        name,
        mt,
        hidden,
        n_layers,
        vocab,
        heads,
        kv_heads,
        head_dim,
        kinds,
        window,
        params,
        n_exp,
        top_k,
        moe_layers,
        per_expert,
        ffn_width,
    )


def _nemotron_h_facts(cfg: dict[str, Any], name: str) -> ModelFacts:
    """Hybrid: 'M' Mamba-2 mixer, 'E' (latent) MoE, '*' attention, '-' dense MLP; one block per layer."""
    hidden, n_layers = int(cfg["hidden_size"]), int(cfg["num_hidden_layers"])
    pattern = str(cfg["hybrid_override_pattern"])[:n_layers]
    heads, kv_heads = int(cfg["num_attention_heads"]), int(cfg["num_key_value_heads"])
    head_dim = int(cfg.get("head_dim") or hidden // heads)
    vocab = int(cfg["vocab_size"])
    m_heads, m_dim = int(cfg["mamba_num_heads"]), int(cfg["mamba_head_dim"])
    groups, state, kernel = int(cfg["n_groups"]), int(cfg["ssm_state_size"]), int(cfg.get("conv_kernel", 4))
    d_inner = m_heads * m_dim
    conv_dim = d_inner + 2 * groups * state
    in_proj = hidden * (2 * d_inner + 2 * groups * state + m_heads)
    mamba_layer = in_proj + conv_dim * (kernel + 1) + 3 * m_heads + d_inner + d_inner * hidden
    n_exp, top_k = int(cfg.get("n_routed_experts", 0)), int(cfg.get("num_experts_per_tok", 0))
    exp_inter = int(cfg.get("moe_intermediate_size", 0))
    latent = int(cfg.get("moe_latent_size") or 0)
    exp_in = latent or hidden
    per_expert = 2 * exp_in * exp_inter  # relu^2 experts: up + down, no gate
    shared_inter = int(cfg.get("moe_shared_expert_intermediate_size", 0)) * int(
        cfg.get("n_shared_experts", 1)
    )
    shared_per_layer = (
        hidden * n_exp + n_exp + 2 * hidden * shared_inter + (2 * hidden * latent if latent else 0)
    )
    n_m, n_e, n_a, n_d = (pattern.count(c) for c in "ME*-")
    kinds = ["mamba" if c == "M" else "full" if c == "*" else "none" for c in pattern]
    ssm_bytes = 4 if str(cfg.get("mamba_ssm_cache_dtype", "float32")) == "float32" else 2
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
    facts = _finish(
        cfg,
        name,
        "nemotron_h",
        hidden,
        n_layers,
        vocab,
        heads,
        kv_heads,
        head_dim,
        kinds,
        None,
        params,
        n_exp,
        top_k,
        n_e,
        per_expert,
        max(top_k * exp_inter + shared_inter, 2 * d_inner),
    )
    notes = facts.notes + (
        "hybrid Mamba-2/MoE: KV only in the attention layers; each sequence also holds a fixed Mamba state",
        "multi-token-prediction layer not counted (used only for speculative decoding)",
    )
    return _replace(
        facts,
        state_bytes_per_seq=n_m * (m_heads * m_dim * state * ssm_bytes + conv_dim * (kernel - 1) * 2),
        mixer_flops_per_token=n_m * 6.0 * d_inner * state,  # SSD scan: state update + readout
        notes=notes,
    )


def _finish(
    cfg: dict[str, Any],
    name: str,
    mt: str,
    hidden: int,
    n_layers: int,
    vocab: int,
    heads: int,
    kv_heads: int,
    head_dim: int,
    kinds: list[str],
    window: int | None,
    params: dict[str, int],
    n_exp: int,
    top_k: int,
    moe_layers: int,
    per_expert: int,
    ffn_width: int,
) -> ModelFacts:
    dtype = _DTYPES.get(str(cfg.get("torch_dtype") or cfg.get("dtype") or "bfloat16"), "bf16")
    tie = bool(cfg.get("tie_word_embeddings", mt == "gemma3_text"))
    return ModelFacts(
        name=name,
        model_type=mt,
        hidden_size=hidden,
        num_layers=n_layers,
        vocab_size=vocab,
        num_heads=heads,
        num_kv_heads=kv_heads,
        head_dim=head_dim,
        layer_mixers=tuple(kinds),
        sliding_window=window,
        params=params,
        num_experts=n_exp,
        experts_per_token=top_k if n_exp else 0,
        moe_layers=moe_layers if n_exp else 0,
        params_per_expert=per_expert if n_exp else 0,
        ffn_width=ffn_width,
        tie_word_embeddings=tie,
        dtype=dtype,
        native_quant=native_quant_from_config(cfg, dtype),
        max_context=int(cfg.get("max_position_embeddings") or 0),
    )


def _replace(facts: ModelFacts, **changes: Any) -> ModelFacts:
    from dataclasses import replace

    return replace(facts, **changes)


def facts_from_config(cfg: dict[str, Any], name: str = "model") -> ModelFacts:
    """Build ModelFacts from a config.json dict (multimodal configs: their ``text_config``)."""
    if "text_config" in cfg and "hidden_size" not in cfg:
        text = dict(cfg["text_config"])
        text.setdefault("quantization_config", cfg.get("quantization_config"))
        text.setdefault("torch_dtype", cfg.get("torch_dtype"))
        text.setdefault("model_type", f"{cfg.get('model_type', '')}_text")
        cfg = text
    mt = str(cfg.get("model_type", ""))
    if mt == "gemma3":
        mt = "gemma3_text"
    cfg = {**cfg, "model_type": mt}
    if mt not in SUPPORTED_TYPES:
        raise ValueError(
            f"MODEL: model_type {mt!r} is not supported; supported: {', '.join(SUPPORTED_TYPES)}"
        )
    if mt == "nemotron_h":
        return _nemotron_h_facts(cfg, name)
    return _transformer_facts(cfg, name)


def load_model_facts(model: str) -> ModelFacts:
    """MODEL is a preset name (see model_presets.PRESETS), a directory holding config.json, or a JSON path."""
    key = model.lower()
    if key in PRESETS:
        return facts_from_config(PRESETS[key], key)
    path = Path(model).expanduser()
    if path.is_dir():
        path = path / "config.json"
    if not path.is_file():
        raise ValueError(
            f"MODEL must be a preset ({', '.join(PRESETS)}) or a path to config.json, got {model!r}"
        )
    cfg = json.loads(path.read_text())
    quant_file = path.parent / "hf_quant_config.json"  # ModelOpt checkpoints keep it beside config.json
    if "quantization_config" not in cfg and quant_file.is_file():
        algo = json.loads(quant_file.read_text()).get("quantization", {}).get("quant_algo", "")
        cfg["quantization_config"] = {"quant_method": "modelopt", "quant_algo": algo}
    return facts_from_config(cfg, path.parent.name or model)
