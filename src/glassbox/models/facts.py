"""The model description (torch-free), shared by the engine and the planner.

:class:`ModelFacts` holds what the engine needs to build the model (widths, norms, rope, biases, per-layer
attention kinds) and what the planner needs to cost it (parameter counts per group, active parameters, KV
bytes, MoE shape, recurrent state). models/config_reader.py builds it from a config.json, the only code
that reads one; the engine's torch-side ModelConfig (models/model_config.py) is built from it.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from glassbox.dtypes import canonical
from glassbox.models.hybrid_spec import HybridSpec
from glassbox.quant.config import NativeQuant

DEFAULT_MAX_POSITIONS = 2048  # what the engine assumes when a config names no limit


@dataclass(frozen=True)
class ModelFacts:
    """Shapes, settings and parameter counts of one model (counts in parameters, bytes in bytes)."""

    name: str
    model_type: str
    hidden_size: int
    num_layers: int
    vocab_size: int
    num_heads: int
    num_kv_heads: int
    head_dim: int
    # per layer: "full" | "sliding" (both hold KV) | "mamba" | "linear" (Gated DeltaNet; both hold a
    # recurrent state: ``hybrid``) | "none" (an FFN-only block)
    layer_mixers: tuple[str, ...]
    sliding_window: int | None
    params: dict[str, int]  # per quant.GROUPS; "experts" = all routed experts of all layers
    architecture: str = ""  # the Hugging Face class name ("LlamaForCausalLM")
    intermediate_size: int = 0  # the dense MLP's width
    rms_norm_eps: float = 1e-6
    hidden_act: str = "silu"
    qkv_bias: bool = False  # q/k/v projections carry biases
    o_bias: bool = False  # the attention output projection carries a bias
    mlp_bias: bool = False
    qk_norm: bool = False  # RMSNorm over each head of q and k (Qwen3, Gemma 3)
    attention_sinks: bool = False  # a learned per-head sink logit (gpt-oss)
    rope: dict[str, Any] = field(default_factory=dict)  # rope_theta, rope_type and its scaling fields
    # the sliding-window layers' own rope settings where they differ (Gemma 3's local base); {}: ``rope``
    rope_local: dict[str, Any] = field(default_factory=dict)
    query_pre_attn_scalar: float | None = None  # attention scale its ** -0.5 (Gemma); None: head_dim
    embed_scale: float = 1.0  # token embeddings are multiplied by it (Gemma: sqrt(hidden_size))
    final_logit_softcapping: float | None = None  # logits = cap * tanh(logits / cap) where set
    attn_logit_softcapping: float | None = None  # the same on attention scores, where the config sets it
    # Gemma 4: per-layer KV geometry where layers differ ((): num_kv_heads and head_dim everywhere); the
    # layer whose KV cache each layer attends over ((): its own; a layer reading another's holds no KV);
    # full layers' V taken from their K projection; the dense MLP's width per layer ((): intermediate_size);
    # per-layer input embeddings of this width per layer, from a table of this many rows (0: none)
    layer_kv_heads: tuple[int, ...] = ()
    layer_head_dims: tuple[int, ...] = ()
    kv_source: tuple[int, ...] = ()
    attention_k_eq_v: bool = False
    layer_intermediate: tuple[int, ...] = ()
    per_layer_input_size: int = 0
    per_layer_input_vocab: int = 0
    num_experts: int = 0
    experts_per_token: int = 0
    moe_layers: int = 0
    params_per_expert: int = 0  # one routed expert in one layer
    moe_intermediate_size: int = 0
    shared_expert_intermediate_size: int = 0
    shared_expert_gated: bool = False  # the shared expert's output times sigmoid(a linear of x) (Qwen2-MoE)
    norm_topk_prob: bool = False  # the top-k routing weights renormalized to sum to 1 (Mixtral: always)
    # "softmax_topk": softmax over all experts, then top-k; "topk_softmax" (gpt-oss): top-k of the logits,
    # then a softmax over those k
    moe_router: str = "softmax_topk"
    moe_bias: bool = False  # the router and the experts' two projections carry biases (gpt-oss)
    # gpt-oss's experts: gate/up interleaved, out = (clamp(up, +-limit) + 1) * g * sigmoid(alpha * g) with
    # g = clamp(gate, max=limit); None: act(gate) * up over the [gate | up] halves
    swiglu_limit: float | None = None
    swiglu_alpha: float = 1.702
    layer_moe: tuple[bool, ...] = ()  # per layer: its FFN is the routed MoE block; (): none is
    ffn_width: int = 0  # widest FFN activation per token (activation-memory estimate)
    tie_word_embeddings: bool = False
    state_bytes_per_seq: int = 0  # recurrent (Mamba) state per sequence: SSM + conv, read+written each step
    mixer_flops_per_token: float = 0.0  # recurrent-scan FLOPs per token beyond the linear projections
    dtype: str = "bf16"  # canonical (glassbox.dtypes); "bf16" when the config names none
    dtype_declared: bool = True  # whether the config named its dtype
    native_quant: NativeQuant | None = None
    # the config's quantization_config as read ({}: none): the loader reads GPTQ/AWQ settings from it
    quantization_config: dict[str, Any] = field(default_factory=dict)
    max_context: int = 0  # max_position_embeddings; 0 when the config names none
    bos_token_id: int | None = None
    eos_token_ids: tuple[int, ...] = ()
    notes: tuple[str, ...] = field(default_factory=tuple)
    hybrid: HybridSpec | None = None  # the recurrent mixers' shapes (models/hybrid_spec.py); None: none

    @property
    def kv_layers(self) -> tuple[int, int]:
        """(full-attention layers, sliding-window layers)."""
        return self.layer_mixers.count("full"), self.layer_mixers.count("sliding")

    @property
    def layer_windows(self) -> tuple[int | None, ...]:
        """Each layer's sliding window (None: full attention)."""
        return tuple(self.sliding_window if k == "sliding" else None for k in self.layer_mixers)

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

    @property
    def max_positions(self) -> int:
        """The engine's position limit: the config's, or DEFAULT_MAX_POSITIONS when it names none."""
        return self.max_context or DEFAULT_MAX_POSITIONS

    def kv_shape(self, layer: int) -> tuple[int, int]:
        """(KV heads, head dim) of ``layer``'s attention."""
        heads = self.layer_kv_heads[layer] if self.layer_kv_heads else self.num_kv_heads
        return heads, self.layer_head_dims[layer] if self.layer_head_dims else self.head_dim

    def kv_owner(self, layer: int) -> int:
        """The layer whose KV cache ``layer`` attends over: itself, or (Gemma 4's shared KV) an earlier one."""
        return self.kv_source[layer] if self.kv_source else layer

    def _kv_widths(self, kind: str) -> int:
        """Sum over the layers of ``kind`` that hold a KV cache of 2 x KV heads x head dim (K and V)."""
        return sum(
            2 * h * d
            for i, k in enumerate(self.layer_mixers)
            if k == kind and self.kv_owner(i) == i
            for h, d in [self.kv_shape(i)]
        )

    def kv_bytes_per_token(self, bytes_per_element: float = 2.0) -> float:
        """KV bytes one token adds while the context is shorter than any sliding window.

        The engine's paged cache holds this much per token slot: every layer's K and V, once for layers that
        share one (a layer reading another's cache holds none)."""
        return (self._kv_widths("full") + self._kv_widths("sliding")) * bytes_per_element

    def kv_bytes(self, seq_len: int, bytes_per_element: float = 2.0) -> float:
        """KV cache of one sequence of ``seq_len`` tokens; sliding layers keep at most the window."""
        window = min(seq_len, self.sliding_window or seq_len)
        full, sliding = self._kv_widths("full"), self._kv_widths("sliding")
        return bytes_per_element * (full * seq_len + sliding * window)

    def attention_flops(self, num_new: int, context_before: int) -> float:
        """QK^T and PV FLOPs for ``num_new`` causal queries after ``context_before`` cached tokens.

        Per layer and query attending to n keys: 4 * heads * head_dim * n (2 FLOPs per MAC, two matmuls);
        a layer reading another's KV cache still attends."""
        full, sliding = self.kv_layers
        dims = {kind: sum(self.kv_shape(i)[1] for i, k in enumerate(self.layer_mixers) if k == kind)
                for kind in ("full", "sliding")}  # fmt: skip
        keys_full = num_new * context_before + num_new * (num_new + 1) / 2
        keys_sliding = sliding_keys(num_new, context_before, self.sliding_window or 0) if sliding else 0.0
        return 4.0 * self.num_heads * (dims["full"] * keys_full + dims["sliding"] * keys_sliding)

    @property
    def embedding_row_params(self) -> int:
        """Parameters one token gathers from the embedding tables: its row, and its per-layer inputs' row."""
        return self.hidden_size + self.num_layers * self.per_layer_input_size

    def describe_attention(self) -> str:
        full, sliding = self.kv_layers
        mamba = self.layer_mixers.count("mamba")
        linear = self.layer_mixers.count("linear")
        gqa = f"GQA {self.num_heads}q/{self.num_kv_heads}kv x {self.head_dim}"
        if self.layer_kv_heads or self.layer_head_dims:  # Gemma 4: full layers' own geometry
            heads, dim = self.kv_shape(self.layer_mixers.index("full")) if full else self.kv_shape(0)
            gqa += f" (full layers {heads}kv x {dim}{', K = V' if self.attention_k_eq_v else ''})"
        shared = sum(self.kv_owner(i) != i for i in range(self.num_layers))
        parts = [f"{full} full"]
        if sliding:
            parts.append(f"{sliding} sliding (window {self.sliding_window})")
        if mamba:
            parts.append(f"{mamba} Mamba-2 (no KV)")
        if linear:
            parts.append(f"{linear} Gated DeltaNet (no KV)")
        if shared:
            parts.append(f"the last {shared} reusing earlier layers' KV")
        return f"{gqa}; layers: " + ", ".join(parts)


def sliding_keys(n: int, c: int, w: int) -> float:
    """sum_{i=1..n} min(c + i, w): keys seen by n new queries in a window of w after c cached tokens."""
    if w <= 0:
        return 0.0
    if c >= w:
        return float(n * w)
    m = min(n, w - c)  # queries still inside the window's growth phase
    return m * c + m * (m + 1) / 2 + (n - m) * w


def rope_parameters(
    config: dict[str, Any], layer_type: str = "full_attention", default_theta: float = 10000.0
) -> dict[str, Any]:
    """The rope settings of an HF config, whether written as rope_theta/rope_scaling or rope_parameters.

    transformers 5 writes rope_parameters either flat or per layer type ({"full_attention": {...},
    "sliding_attention": {...}}, Gemma 3); then ``layer_type``'s entry is read. rope_scaling and
    rope_theta (the older spelling) fold in for the full-attention layers only."""
    given: dict[str, Any] = dict(config.get("rope_parameters") or {})
    per_type = any(isinstance(v, dict) for v in given.values())
    params: dict[str, Any] = dict(given.get(layer_type) or {}) if per_type else given
    if layer_type == "full_attention":
        scaling = config.get("rope_scaling") or {}
        for k, v in scaling.items():
            params.setdefault(k, v)
        params.setdefault("rope_theta", config.get("rope_theta", default_theta))
    params.setdefault("rope_theta", default_theta)
    if config.get("partial_rotary_factor") is not None:  # Phi-4-mini writes it beside rope_theta
        params.setdefault("partial_rotary_factor", config["partial_rotary_factor"])
    kind = params.get("rope_type", params.get("type", "default")) or "default"
    if config.get("model_type") == "phi3" and kind in ("su", "yarn"):
        kind = "longrope"  # Phi-3's first configs named LongRoPE so (transformers' Phi3Config renames them)
    params["rope_type"] = kind
    if kind in ("llama3", "yarn", "longrope"):  # the pre-training length, as transformers fills it in
        if "original_max_position_embeddings" in config:
            params["original_max_position_embeddings"] = config["original_max_position_embeddings"]
        elif config.get("model_type") == "phi3":
            params["original_max_position_embeddings"] = 4096  # Phi3Config's default
        elif config.get("max_position_embeddings"):
            params.setdefault("original_max_position_embeddings", config["max_position_embeddings"])
    if kind == "longrope" and params.get("factor") is None and config.get("max_position_embeddings"):
        # transformers' default: the context the model was extended to over its pre-training length
        params["factor"] = config["max_position_embeddings"] / params["original_max_position_embeddings"]
    return params


def id_list(value: Any) -> list[int]:
    """An id field given as an int, a list of ints, or missing."""
    if isinstance(value, bool):
        return []
    if isinstance(value, int):
        return [value]
    if isinstance(value, list):
        return [v for v in value if isinstance(v, int) and not isinstance(v, bool)]
    return []


def config_dtype(cfg: dict[str, Any]) -> tuple[str, bool]:
    """(canonical dtype, whether the config declared one); "bf16" when it did not."""
    declared = cfg.get("torch_dtype") or cfg.get("dtype")
    name = canonical(str(declared)) if declared else "bf16"
    return (name if name in ("fp32", "bf16", "fp16") else "bf16"), bool(declared)
