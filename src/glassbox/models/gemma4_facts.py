"""Gemma 4's text model read from its config.json (torch-free): the facts models/config_reader.py gives the
engine and the planner, as transformers' Gemma4TextConfig and modeling_gemma4 build the model.

What sets it apart, layer by layer:
- sliding and full layers (``layer_types``; by default five sliding to one full, the last always full), each
  kind with its own rope (``rope_parameters`` per layer type: sliding "default", full "proportional": the
  first ``partial_rotary_factor`` of each head's frequency pairs rotate, the rest stay as they are);
- full layers with their own geometry: ``global_head_dim`` (default 512) and, where ``attention_k_eq_v``,
  ``num_global_key_value_heads`` KV heads whose V is their K projection; transformers 5 writes both as
  ``per_layer_config`` (layer -> {head_dim, num_key_value_heads});
- ``num_kv_shared_layers``: the last layers compute no K/V and attend over the cache of the last earlier
  layer of their kind (they hold none of their own; with ``use_double_wide_mlp`` their MLP is twice as wide);
- per-layer input embeddings (``hidden_size_per_layer_input`` P > 0): a second table of
  ``vocab_size_per_layer_input`` rows of num_layers x P, a projection of the embedded token to the same
  width, and per layer a gate, a projection back and a norm;
- ``enable_moe_block``: every layer runs routed experts (``num_experts``, top ``top_k_experts``, width
  ``moe_intermediate_size``) beside its dense MLP;
- attention scale 1 (q and k are RMS-normed per head, v too without a weight), logits soft-capped at
  ``final_logit_softcapping``, a learned scalar per layer (``layer_scalar``, a buffer in transformers: not
  counted among the parameters, as transformers does not count it).
"""

from __future__ import annotations

from typing import Any

from glassbox.models.facts import ModelFacts, rope_parameters

MODEL_TYPE = "gemma4_text"
# Gemma4TextConfig's defaults for the keys the reader needs (a hub config may leave any of them out)
DEFAULTS: dict[str, Any] = {
    "vocab_size": 262_144,
    "head_dim": 256,
    "hidden_activation": "gelu_pytorch_tanh",
    "max_position_embeddings": 131_072,
    "rms_norm_eps": 1e-6,
    "tie_word_embeddings": True,
    "attention_bias": False,
    "sliding_window": 512,
    "vocab_size_per_layer_input": 262_144,
    "hidden_size_per_layer_input": 256,
    "attention_k_eq_v": False,
    "num_kv_shared_layers": 0,
    "enable_moe_block": False,
    "use_double_wide_mlp": False,
    "bos_token_id": 2,
    "eos_token_id": 1,
}
GLOBAL_HEAD_DIM = 512  # transformers' default global_head_dim
SLIDING_EVERY = 6  # transformers' default pattern: layer i slides unless (i + 1) % 6 == 0
ROPE_DEFAULTS = {
    "sliding_attention": {"rope_type": "default", "rope_theta": 10_000.0},
    "full_attention": {"rope_type": "proportional", "partial_rotary_factor": 0.25, "rope_theta": 1_000_000.0},
}
_LAYER_KEYS = frozenset({"head_dim", "num_key_value_heads"})


def with_defaults(cfg: dict[str, Any]) -> dict[str, Any]:
    """``cfg`` with Gemma4TextConfig's defaults for the keys it leaves out, its layer types and rope as
    transformers fills them in; ValueError for settings glassbox does not run."""
    out = {**DEFAULTS, **{k: v for k, v in cfg.items() if v is not None or k not in DEFAULTS}}
    n = int(out["num_hidden_layers"])
    types = out.get("layer_types")
    if not types:
        types = ["sliding_attention" if (i + 1) % SLIDING_EVERY else "full_attention" for i in range(n)]
    types = [str(t) for t in types]
    if len(types) != n or set(types) - {"sliding_attention", "full_attention"}:
        raise ValueError(f"gemma4 layer_types must be {n} of sliding_attention / full_attention: {types}")
    types[-1] = "full_attention"  # transformers forces the last layer global
    out["layer_types"] = types
    rope = out.get("rope_parameters") or ROPE_DEFAULTS
    out["rope_parameters"] = {kind: dict(rope.get(kind) or ROPE_DEFAULTS[kind]) for kind in ROPE_DEFAULTS}
    if out.get("use_bidirectional_attention") == "all":
        raise ValueError(
            "gemma4 use_bidirectional_attention='all' (an encoder) is not run; text decoding is causal"
        )
    return out


def _layer_geometry(cfg: dict[str, Any], kinds: list[str]) -> tuple[tuple[int, ...], tuple[int, ...]]:
    """(KV heads, head dim) per layer: ``per_layer_config`` where written, else full layers take
    ``global_head_dim`` and, with ``attention_k_eq_v``, ``num_global_key_value_heads``."""
    heads, dim = int(cfg.get("num_key_value_heads") or cfg["num_attention_heads"]), int(cfg["head_dim"])
    given = cfg.get("per_layer_config")
    if isinstance(given, dict):
        overrides = {int(i): dict(v) for i, v in given.items()}
        unknown = {k for v in overrides.values() for k in v} - _LAYER_KEYS
        if unknown:
            raise ValueError(
                f"gemma4 per_layer_config sets {sorted(unknown)}; glassbox reads {sorted(_LAYER_KEYS)}"
            )
    else:
        full: dict[str, Any] = {"head_dim": cfg.get("global_head_dim") or GLOBAL_HEAD_DIM}
        if cfg["attention_k_eq_v"] and cfg.get("num_global_key_value_heads") is not None:
            full["num_key_value_heads"] = cfg["num_global_key_value_heads"]
        overrides = {i: full for i, k in enumerate(kinds) if k == "full"}
    layer_heads = tuple(
        int(overrides.get(i, {}).get("num_key_value_heads", heads)) for i in range(len(kinds))
    )
    dims = tuple(int(overrides.get(i, {}).get("head_dim", dim)) for i in range(len(kinds)))
    for kind in set(kinds):  # one rotary table and cache shape per kind
        shapes = {(layer_heads[i], dims[i]) for i, k in enumerate(kinds) if k == kind}
        if len(shapes) > 1:
            raise ValueError(f"gemma4 {kind} layers of different shapes {sorted(shapes)} are not run")
    return layer_heads, dims


def kv_sources(kinds: list[str], shared: int) -> tuple[int, ...]:
    """Per layer, the layer whose KV cache it attends over: itself for the first L - ``shared`` layers, and
    for each later one the last of those of its own kind (transformers' kv_sharing_modes)."""
    n = len(kinds)
    first = n - shared
    if not 0 <= shared < n:
        raise ValueError(f"gemma4 num_kv_shared_layers={shared} must be below the {n} layers")
    sources = list(range(n))
    for i in range(first, n):
        producers = [j for j in range(first) if kinds[j] == kinds[i]]
        if not producers:
            raise ValueError(
                f"gemma4 layer {i} ({kinds[i]}) shares KV but no earlier {kinds[i]} layer holds one"
            )
        sources[i] = producers[-1]
    return tuple(sources)


def gemma4_facts(cfg: dict[str, Any], base: dict[str, Any]) -> ModelFacts:
    """ModelFacts of a Gemma 4 text config (``cfg`` through :func:`with_defaults`; ``base``: the fields every
    family shares, config_reader's reading of it)."""
    hidden, n, heads = base["hidden_size"], base["num_layers"], base["num_heads"]
    vocab, inter = base["vocab_size"], base["intermediate_size"]
    kinds = ["sliding" if t == "sliding_attention" else "full" for t in cfg["layer_types"]]
    layer_heads, dims = _layer_geometry(cfg, kinds)
    sources = kv_sources(kinds, int(cfg["num_kv_shared_layers"]))
    k_eq_v, bias = bool(cfg["attention_k_eq_v"]), bool(cfg["attention_bias"])
    double = bool(cfg["use_double_wide_mlp"])
    widths = tuple(2 * inter if double and sources[i] != i else inter for i in range(n))
    ple, ple_vocab = int(cfg["hidden_size_per_layer_input"] or 0), int(cfg["vocab_size_per_layer_input"])

    attention = 0
    for i in range(n):
        q, kv = heads * dims[i], layer_heads[i] * dims[i]
        attention += 2 * hidden * q + dims[i] + (q + hidden if bias else 0)  # q, o, q_norm (+ q, o biases)
        if sources[i] == i:  # k (+ v), k_norm; v_norm has no weight
            projections = 1 if k_eq_v and kinds[i] == "full" else 2
            attention += projections * (hidden * kv + (kv if bias else 0)) + dims[i]
    mlp = sum(3 * hidden * w for w in widths)
    norms = n * 4 * hidden + hidden
    embed = vocab * hidden
    if ple:  # the second table; the projection to it; per layer gate + projection (mlp) and a norm
        embed += ple_vocab * n * ple
        mlp += hidden * n * ple + n * 2 * hidden * ple
        norms += ple + n * hidden
    n_exp = int(cfg.get("num_experts") or 0) if cfg["enable_moe_block"] else 0
    top_k = int(cfg.get("top_k_experts") or 0) if n_exp else 0
    exp_inter = int(cfg.get("moe_intermediate_size") or 0) if n_exp else 0
    if n_exp and not (top_k and exp_inter):
        raise ValueError("gemma4 enable_moe_block needs num_experts, top_k_experts and moe_intermediate_size")
    per_expert = 3 * hidden * exp_inter
    router = n * (n_exp * hidden + hidden + n_exp) if n_exp else 0  # proj, scale, per-expert scale
    moe_norms = n * 3 * hidden if n_exp else 0  # two norms around the experts, one after the MLP
    params = {
        "embed": embed,
        "lm_head": vocab * hidden,
        "attention": attention,
        "mlp": mlp,
        "experts": n * n_exp * per_expert,
        "moe_shared": router,
        "mamba": 0,
        "norms": norms + moe_norms,
    }
    rope = {"rope_parameters": cfg["rope_parameters"]}
    own = {
        "qk_norm": True,
        "hidden_act": str(cfg["hidden_activation"]),
        "rope": rope_parameters(rope, "full_attention", default_theta=1_000_000.0),
        "rope_local": rope_parameters(rope, "sliding_attention", default_theta=10_000.0),
        "query_pre_attn_scalar": 1.0,  # attention scale 1: q and k are normed instead
        "embed_scale": hidden**0.5,
    }
    return ModelFacts(
        **{**base, **own},
        layer_mixers=tuple(kinds),
        sliding_window=int(cfg["sliding_window"]) if "sliding" in kinds else None,
        params=params,
        num_experts=n_exp,
        experts_per_token=top_k,
        moe_layers=n if n_exp else 0,
        params_per_expert=per_expert if n_exp else 0,
        moe_intermediate_size=exp_inter,
        norm_topk_prob=bool(n_exp),
        layer_moe=(True,) * n if n_exp else (),
        ffn_width=max(widths) + top_k * exp_inter,
        layer_kv_heads=layer_heads if len(set(layer_heads)) > 1 else (),
        layer_head_dims=dims if len(set(dims)) > 1 else (),
        kv_source=sources if sources != tuple(range(n)) else (),
        attention_k_eq_v=k_eq_v,
        layer_intermediate=widths if len(set(widths)) > 1 else (),
        per_layer_input_size=ple,
        per_layer_input_vocab=ple_vocab if ple else 0,
    )
