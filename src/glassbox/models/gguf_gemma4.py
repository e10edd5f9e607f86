"""A Gemma 4 GGUF file's metadata as a transformers Gemma4TextConfig dict (hub spelling: ``global_head_dim``,
``num_global_key_value_heads``), as llama.cpp's converter writes it (conversion/gemma.py Gemma4Model) and
its loader reads it (src/models/gemma4.cpp):

- ``attention.key_length`` / ``value_length``: the full layers' head dim; ``*_swa``: the sliding layers';
- ``attention.head_count_kv``: one value, or one per layer (sliding: num_key_value_heads, full:
  num_global_key_value_heads);
- ``attention.sliding_window_pattern``: per layer, True where it slides;
- ``attention.shared_kv_layers``: num_kv_shared_layers; ``feed_forward_length``: one value, or one per
  layer where the KV-sharing layers' MLPs are twice as wide (use_double_wide_mlp);
- ``embedding_length_per_layer_input``: hidden_size_per_layer_input (0: none), the table's rows the
  per-layer vocabulary;
- ``rope.freq_base`` / ``rope.freq_base_swa``: each kind's theta; the full layers' proportional rope is
  written as ``rope_freqs`` (1 for each turning frequency pair, 1e30 for the others), which gives
  ``partial_rotary_factor``;
- V = K in full layers (attention_k_eq_v) is told by their missing ``attn_v`` (llama.cpp reads K then);
- the activation (gelu, tanh approximation) and the absent biases are fixed by llama.cpp for the
  architecture.
"""

from __future__ import annotations

from typing import Any

import numpy as np

_ARCH = "gemma4"
_MISSING = object()
_UNTURNED = 1e29  # rope_freqs above this: a pair that does not turn (the converter writes 1e30)


def _layers(value: Any, n: int, key: str) -> list[Any]:
    """A per-layer list from a value given once or per layer."""
    values = list(value) if isinstance(value, list) else [value] * n
    if len(values) != n:
        raise ValueError(f"GGUF metadata {key} has {len(values)} values for {n} layers")
    return values


def _kind_value(values: list[Any], sliding: list[bool], want_sliding: bool, key: str) -> Any:
    """The one value the layers of a kind share (ValueError where they differ)."""
    kinds = {v for v, s in zip(values, sliding, strict=True) if s == want_sliding}
    if len(kinds) > 1:
        raise ValueError(f"GGUF metadata {key} differs between layers of one kind: {values}")
    return kinds.pop() if kinds else None


def gemma4_config(
    metadata: dict[str, Any], shapes: dict[str, tuple[int, ...]], rope_freqs: np.ndarray | None, dtype: str
) -> dict[str, Any]:
    """The HF config dict of a Gemma 4 GGUF checkpoint (``shapes``: PyTorch-order shapes by GGUF name;
    ``rope_freqs``: the file's rope_freqs tensor; ``dtype``: the torch_dtype its tensor types make,
    models/gguf_config.file_dtype)."""

    def get(name: str, default: Any = _MISSING) -> Any:
        key = f"{_ARCH}.{name}"
        if key not in metadata and default is _MISSING:
            raise ValueError(f"GGUF metadata lacks {key}, which a {_ARCH} model needs")
        return metadata.get(key, default)

    n = int(get("block_count"))
    sliding = [bool(v) for v in _layers(get("attention.sliding_window_pattern"), n, "sliding_window_pattern")]
    heads = _kind_value(_layers(get("attention.head_count"), n, "head_count"), [True] * n, True, "head_count")
    kv = _layers(get("attention.head_count_kv", heads), n, "head_count_kv")
    kv_sliding, kv_full = (
        _kind_value(kv, sliding, True, "head_count_kv"),
        _kind_value(kv, sliding, False, "head_count_kv"),
    )
    dim_full, dim_sliding = int(get("attention.key_length")), int(get("attention.key_length_swa"))
    for key, want in (("attention.value_length", dim_full), ("attention.value_length_swa", dim_sliding)):
        if int(get(key, want)) != want:
            raise ValueError(f"GGUF gemma4 file: {key} {get(key)} != its key length {want}")
    shared = int(get("attention.shared_kv_layers", 0) or 0)
    ffn = _layers(get("feed_forward_length"), n, "feed_forward_length")
    double = ffn[0] != ffn[-1]
    if any(int(w) != int(ffn[0]) * (2 if double and i >= n - shared else 1) for i, w in enumerate(ffn)):
        raise ValueError(
            f"GGUF gemma4 feed_forward_length {ffn}: not one width (doubled in KV-sharing layers)"
        )
    first_full = next((i for i in range(n - shared) if not sliding[i]), None)
    k_eq_v = first_full is not None and f"blk.{first_full}.attn_v.weight" not in shapes
    experts = int(get("expert_count", 0) or 0)
    ple = int(get("embedding_length_per_layer_input", 0) or 0)
    vocab = int(get("vocab_size", 0) or shapes["token_embd.weight"][0])
    config: dict[str, Any] = {
        "architectures": ["Gemma4ForCausalLM"],
        "model_type": "gemma4_text",
        "hidden_size": int(get("embedding_length")),
        "num_hidden_layers": n,
        "num_attention_heads": int(heads),
        "num_key_value_heads": int(kv_sliding if kv_sliding is not None else kv_full),
        "head_dim": dim_sliding,
        "global_head_dim": dim_full,
        "attention_k_eq_v": k_eq_v,
        "intermediate_size": int(ffn[0]),
        "use_double_wide_mlp": double,
        "vocab_size": vocab,
        "rms_norm_eps": float(get("attention.layer_norm_rms_epsilon")),
        "hidden_activation": "gelu_pytorch_tanh",
        "tie_word_embeddings": "output.weight" not in shapes,
        "attention_bias": False,
        "torch_dtype": dtype,
        "max_position_embeddings": int(get("context_length", 131_072)),
        "sliding_window": int(get("attention.sliding_window", 0) or 0) or None,
        "layer_types": ["sliding_attention" if s else "full_attention" for s in sliding],
        "rope_parameters": _rope(get, rope_freqs, dim_full),
        "final_logit_softcapping": float(get("final_logit_softcapping", 0.0) or 0.0) or None,
        "num_kv_shared_layers": shared,
        "hidden_size_per_layer_input": ple,
        "vocab_size_per_layer_input": shapes["per_layer_token_embd.weight"][0] if ple else vocab,
        "enable_moe_block": experts > 0,
    }
    if k_eq_v or kv_full != kv_sliding:
        config["num_global_key_value_heads"] = int(kv_full)
        if not k_eq_v:  # transformers reads the full layers' own KV heads only together with V = K
            raise ValueError(
                f"GGUF gemma4 file: full layers of {kv_full} KV heads with their own V projection"
            )
    if experts:
        config.update(
            num_experts=experts,
            top_k_experts=int(get("expert_used_count")),
            moe_intermediate_size=int(get("expert_feed_forward_length")),
        )
    if isinstance(metadata.get("general.name"), str):
        config["name"] = metadata["general.name"]
    for name in ("bos", "eos", "padding"):
        token_id = metadata.get(f"tokenizer.ggml.{name}_token_id")
        if token_id is not None:
            config[f"{'pad' if name == 'padding' else name}_token_id"] = int(token_id)
    return config


def _rope(get: Any, rope_freqs: np.ndarray | None, dim_full: int) -> dict[str, dict[str, Any]]:
    """Each kind's rope: sliding "default" at rope.freq_base_swa; full "proportional" at rope.freq_base,
    the turning share of its frequency pairs from rope_freqs (without one: rope.dimension_count's share)."""
    if rope_freqs is None:
        partial = int(get("rope.dimension_count", dim_full)) / dim_full
    else:
        factors = np.asarray(rope_freqs, dtype=np.float64).reshape(-1)
        turning = int(np.sum(factors == 1.0))
        if len(factors) != dim_full // 2 or turning + int(np.sum(factors > _UNTURNED)) != len(factors):
            raise ValueError(
                f"GGUF gemma4 rope_freqs: {len(factors)} values, not {dim_full // 2} of 1 (turning) or 1e30 (not)"
            )
        if np.any(factors[:turning] != 1.0):
            raise ValueError("GGUF gemma4 rope_freqs: the turning pairs must come first")
        partial = 2 * turning / dim_full
    return {
        "sliding_attention": {
            "rope_type": "default",
            "rope_theta": float(get("rope.freq_base_swa", 10_000.0)),
        },
        "full_attention": {
            "rope_type": "proportional",
            "partial_rotary_factor": partial,
            "rope_theta": float(get("rope.freq_base", 1_000_000.0)),
        },
    }
