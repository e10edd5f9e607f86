"""An HF config.json-equivalent dict from a GGUF file's metadata (llama, mistral, qwen2, qwen3, gemma3; the
mixture-of-experts qwen2moe, qwen3moe, gpt-oss and llama with experts (Mixtral): models/gguf_moe.py).

llama.cpp writes the model's hyperparameters under ``<architecture>.<key>`` (``llama.block_count``, ...).
This module turns them into the keys transformers' config classes use, so that the engine can build the
model from a GGUF file exactly as from a Hugging Face directory.

Gemma 3 files leave out facts that llama.cpp hard-codes for the architecture (src/llama-model.cpp); they
are filled in as llama.cpp assumes them (see :func:`_gemma3_fields`).
"""

from __future__ import annotations

import logging
import math
from typing import Any

import numpy as np

from glassbox.models.families import family_of_gguf, family_of_type, gguf_architectures
from glassbox.models.gguf_hybrid import (
    GATED_QUERY_ARCHITECTURES,
    HYBRID_GGUF_ARCHITECTURES,
    NO_DENSE_FFN,
    hybrid_fields,
)
from glassbox.models.gguf_moe import moe_fields

logger = logging.getLogger(__name__)

# llama.cpp interleaves the rotary pairs of Q/K rows (its "normal" rope) for these; qwen2/qwen3 use the
# NEOX rope, whose half-split layout is transformers' own, so their rows are stored unchanged.
# Nemotron-H's converter permutes them as for llama too (GraniteHybridModel's undo_permute), unrotated
# as they are
PERMUTED_QK_ARCHITECTURES = frozenset({"llama", "mistral", "nemotron_h", "nemotron_h_moe"})
# llama.cpp's converter stores Gemma's (1 + w) RMSNorm weights with the 1 added (every tensor whose HF name
# ends in "norm.weight"); the reader subtracts it again so that the tensors equal the HF parameters.
NORM_OFFSETS = {"gemma3": 1.0}

# Gemma 3 facts that GGUF files do not record and llama.cpp hard-codes (llama-model.cpp, LLM_ARCH_GEMMA3):
GEMMA3_GLOBAL_EVERY = 6  # set_swa_pattern(6): layers 5, 11, 17, ... (0-based) attend globally, the rest slide
GEMMA3_LOCAL_ROPE_BASE = 10000.0  # rope_freq_base_train_swa; the sliding layers' rope is never scaled
GEMMA3_27B_LAYERS = 62  # the 27B model scales attention by (hidden / heads) ** -0.5, the others by head_dim

# What GGUF files were dequantized from is not recorded; bfloat16 is what nearly all of them were published
# in, and it halves the memory of float32 (the engine's --dtype overrides it).
QUANTIZED_FILE_DTYPE = "bfloat16"
_FLOAT_TYPE_DTYPES = {"F32": "float32", "F16": "float16", "BF16": "bfloat16"}

_LLAMA3_ORIGINAL_CONTEXT = 8192  # llama3 rope scaling depends only on ratios to this (see _llama3_scaling)
_MISSING = object()


def hf_architecture(arch: str, metadata: dict[str, Any]) -> tuple[str, str]:
    """(transformers class, model_type) for a GGUF architecture; ValueError naming an unsupported one.

    llama.cpp converts Mistral models as ``llama``; they are told apart by their name, as transformers does.
    """
    family = family_of_gguf(arch)
    if family is None:
        raise ValueError(
            f"GGUF architecture {arch!r} is not supported; supported: {', '.join(gguf_architectures())}"
        )
    if arch == "llama" and int(_uniform(metadata.get("llama.expert_count", 0), "llama.expert_count") or 0):
        family = family_of_type("mixtral") or family  # Mixtral: llama.cpp's "llama" with experts
    elif arch == "llama":
        names = (metadata.get("general.name"), metadata.get("general.basename"))
        if any(isinstance(n, str) and "mistral" in n.lower() for n in names):
            family = family_of_gguf("mistral") or family
    return family.architecture, family.model_type


def _uniform(value: Any, key: str) -> Any:
    """A per-layer list of equal values as one value (the architectures here have no per-layer shapes)."""
    if isinstance(value, list):
        if not value or any(v != value[0] for v in value):
            raise ValueError(f"GGUF metadata {key} varies per layer ({value}); not supported")
        return value[0]
    return value


def file_dtype(tensor_types: list[str]) -> str:
    """The torch_dtype name for a file with these GGML tensor types.

    A file of plain floats keeps the type of its big tensors (bfloat16 or float16 over its float32 norms),
    or float32. A quantized file gets QUANTIZED_FILE_DTYPE.
    """
    kinds = set(tensor_types)
    if not kinds <= set(_FLOAT_TYPE_DTYPES):
        return QUANTIZED_FILE_DTYPE
    for half in ("BF16", "F16"):
        if half in kinds:
            return _FLOAT_TYPE_DTYPES[half]
    return "float32"


def build_config(
    metadata: dict[str, Any],
    shapes: dict[str, tuple[int, ...]],
    tensor_types: list[str],
    rope_freqs: np.ndarray | None = None,
    rope_factors: dict[str, np.ndarray] | None = None,
) -> dict[str, Any]:
    """The HF config dict of a GGUF checkpoint.

    ``shapes`` maps every GGUF tensor name to its PyTorch-order shape (used for the vocabulary size, tied
    embeddings, biases and a head_dim check); ``rope_freqs`` is the llama 3.x ``rope_freqs.weight`` tensor,
    ``rope_factors`` Phi-3's ``rope_factors_long``/``_short`` tensors by "long"/"short".
    """
    arch = str(metadata["general.architecture"])
    hf_class, model_type = hf_architecture(arch, metadata)

    def get(name: str, default: Any = _MISSING) -> Any:
        key = f"{arch}.{name}"
        if key in metadata:
            return _uniform(metadata[key], key)
        if default is _MISSING:
            raise ValueError(f"GGUF metadata lacks {key}, which a {arch} model needs")
        return default

    hidden = int(get("embedding_length"))
    heads = int(get("attention.head_count"))
    kv_heads = int(get("attention.head_count_kv", heads))
    head_dim = _head_dim(arch, get, shapes, hidden, heads)
    rope_theta = float(get("rope.freq_base", 10000.0))  # llama.cpp's default for every architecture
    config: dict[str, Any] = {
        "architectures": [hf_class],
        "model_type": model_type,
        "hidden_size": hidden,
        "num_hidden_layers": int(get("block_count")),
        "num_attention_heads": heads,
        "num_key_value_heads": kv_heads,
        "head_dim": head_dim,
        "intermediate_size": int(get("feed_forward_length", 0 if arch in NO_DENSE_FFN else _MISSING)),
        "vocab_size": _vocab_size(get, shapes, metadata),
        "rms_norm_eps": float(get("attention.layer_norm_rms_epsilon")),
        "rope_theta": rope_theta,
        "hidden_act": "silu",
        "tie_word_embeddings": "output.weight" not in shapes,
        "attention_bias": "blk.0.attn_q.bias" in shapes,
        "torch_dtype": file_dtype(tensor_types),
    }
    if isinstance(metadata.get("general.name"), str):
        config["name"] = metadata["general.name"]
    context = get("context_length", None)
    if context is not None:
        config["max_position_embeddings"] = int(context)
    rope_dim = int(get("rope.dimension_count", head_dim))
    partial = arch == "phi3" or arch in HYBRID_GGUF_ARCHITECTURES
    if rope_dim != head_dim and not partial:  # llama.cpp itself requires it for these architectures
        raise ValueError(f"GGUF {arch} file rotates {rope_dim} of {head_dim} head dimensions; not supported")
    if rope_dim != head_dim:
        config["partial_rotary_factor"] = rope_dim / head_dim
    scaling = _rope_scaling(get, arch, rope_freqs, rope_theta, rope_dim)
    if rope_factors:
        scaling = _longrope(get, rope_factors, rope_dim)
        config["original_max_position_embeddings"] = scaling["original_max_position_embeddings"]
    if scaling is not None:
        config["rope_scaling"] = scaling
    window = get("attention.sliding_window", None)
    if arch in HYBRID_GGUF_ARCHITECTURES:
        config.update(hybrid_fields(arch, get, shapes, config))
    elif int(get("expert_count", 0) or 0):
        config.update(moe_fields(arch, get, metadata, shapes, config))
    if arch == "phi3":  # Phi-4 writes a window of 0 for none
        config["sliding_window"] = int(window) if window else None
    elif arch == "gemma3":
        config.update(_gemma3_fields(get, config))
    elif window is not None:
        config["sliding_window"] = int(window)
    elif model_type == "mistral":
        config["sliding_window"] = None  # llama.cpp runs these without one, and GGUF does not record it
    for name in ("bos", "eos", "padding"):
        token_id = metadata.get(f"tokenizer.ggml.{name}_token_id")
        if token_id is not None:
            config[f"{'pad' if name == 'padding' else name}_token_id"] = int(token_id)
    return config


def _gemma3_fields(get: Any, config: dict[str, Any]) -> dict[str, Any]:
    """Gemma 3's settings in transformers' Gemma3TextConfig spelling, as llama.cpp reads the file.

    - ``layer_types``: every GEMMA3_GLOBAL_EVERY-th layer global, the others sliding over
      ``attention.sliding_window`` tokens (transformers' default pattern too); no window (or 0): all global,
      as llama.cpp then runs the model without sliding-window attention.
    - ``rope_local_base_freq``: GEMMA3_LOCAL_ROPE_BASE. ``rope.freq_base`` and any ``rope.scaling.*`` are the
      global layers' rope (rope_theta, rope_scaling), which transformers applies to full-attention layers only.
    - ``query_pre_attn_scalar``: head_dim, or hidden / heads for the 62-layer (27B) model, as llama.cpp
      scales attention. (transformers' GGUF loader keeps its default of 256 for every size.)
    - ``final_logit_softcapping`` when the file carries it; attention soft-capping never (Gemma 3 has none).
    """
    layers, head_dim = int(config["num_hidden_layers"]), int(config["head_dim"])
    value_length = int(get("attention.value_length", head_dim))
    if value_length != head_dim:
        raise ValueError(f"GGUF gemma3 file has value length {value_length} != key length {head_dim}")
    window = int(get("attention.sliding_window", 0) or 0)
    global_layer = [window == 0 or (i + 1) % GEMMA3_GLOBAL_EVERY == 0 for i in range(layers)]
    hidden, heads = int(config["hidden_size"]), int(config["num_attention_heads"])
    softcap = get("final_logit_softcapping", None)
    return {
        "hidden_act": "gelu_pytorch_tanh",
        "hidden_activation": "gelu_pytorch_tanh",
        "sliding_window": window or None,
        "layer_types": ["full_attention" if g else "sliding_attention" for g in global_layer],
        "rope_local_base_freq": GEMMA3_LOCAL_ROPE_BASE,
        "query_pre_attn_scalar": hidden // heads if layers == GEMMA3_27B_LAYERS else head_dim,
        "final_logit_softcapping": float(softcap) if softcap else None,
        "attn_logit_softcapping": None,
    }


def _head_dim(arch: str, get: Any, shapes: dict[str, tuple[int, ...]], hidden: int, heads: int) -> int:
    """attention.key_length, else (llama family) rope.dimension_count, else from the Q rows, else hidden/heads."""
    head_dim = get("attention.key_length", None)
    if head_dim is None and arch in PERMUTED_QK_ARCHITECTURES:
        head_dim = get("rope.dimension_count", None)
    q_name = next((n for n in shapes if n.endswith(".attn_q.weight")), "blk.0.attn_q.weight")  # a hybrid's
    q_shape = shapes.get(q_name)  # first attention layer need not be layer 0
    per_head = 2 if arch in GATED_QUERY_ARCHITECTURES else 1  # query + output gate
    if head_dim is None:
        head_dim = q_shape[0] // heads // per_head if q_shape else hidden // heads
    head_dim = int(head_dim)
    if q_shape is not None and q_shape[0] != heads * head_dim * per_head:
        raise ValueError(
            f"{q_name} has {q_shape[0]} rows, not {heads} heads x head_dim {head_dim}; "
            "the GGUF metadata disagrees with its tensors"
        )
    return head_dim


def _vocab_size(get: Any, shapes: dict[str, tuple[int, ...]], metadata: dict[str, Any]) -> int:
    """<arch>.vocab_size, else the embedding's rows, else the tokenizer's token count."""
    size = get("vocab_size", None)
    if size is None and "token_embd.weight" in shapes:
        size = shapes["token_embd.weight"][0]
    if size is None:
        tokens = metadata.get("tokenizer.ggml.tokens")
        if not isinstance(tokens, list):
            raise ValueError("cannot tell the vocabulary size: no vocab_size, token_embd or token list")
        size = len(tokens)
    return int(size)


def _rope_scaling(
    get: Any, arch: str, rope_freqs: np.ndarray | None, theta: float, rope_dim: int
) -> dict[str, Any] | None:
    """HF rope_scaling from rope.scaling.* metadata (linear, yarn) or a rope_freqs tensor (llama3)."""
    kind = get("rope.scaling.type", None)
    factor = get("rope.scaling.factor", None)
    if kind is None and get("rope.scale_linear", None) is not None:  # older files
        kind, factor = "linear", get("rope.scale_linear")
    scaling: dict[str, Any] | None = None
    if kind == "linear":
        scaling = {"rope_type": "linear", "factor": float(factor)}
    elif kind == "yarn":
        scaling = {"rope_type": "yarn", "factor": float(factor)}
        original = get("rope.scaling.original_context_length", None)
        if original is not None:
            scaling["original_max_position_embeddings"] = int(original)
        for gguf_key, hf_key in (("yarn_beta_fast", "beta_fast"), ("yarn_beta_slow", "beta_slow")):
            value = get(f"rope.scaling.{gguf_key}", None)
            if value is not None:
                scaling[hf_key] = float(value)
        for ignored in ("attn_factor", "yarn_attn_factor", "yarn_log_multiplier", "yarn_ext_factor"):
            if get(f"rope.scaling.{ignored}", None) is not None:
                logger.warning("GGUF %s.rope.scaling.%s is not carried into rope_scaling", arch, ignored)
    elif kind not in (None, "none"):
        raise ValueError(f"GGUF rope scaling type {kind!r} is not supported (supported: none, linear, yarn)")
    if rope_freqs is not None:
        llama3 = _llama3_scaling(np.asarray(rope_freqs, dtype=np.float64).reshape(-1), theta, rope_dim)
        if llama3 is not None:
            if scaling is not None:
                raise ValueError(
                    f"GGUF file has both rope_freqs and {kind} rope scaling; cannot combine them"
                )
            scaling = llama3
    return scaling


def _longrope(get: Any, factors: dict[str, np.ndarray], rope_dim: int) -> dict[str, Any]:
    """Phi-3's LongRoPE from its factor tensors and rope.scaling.* keys, in transformers' spelling."""
    if set(factors) != {"long", "short"}:
        raise ValueError(f"GGUF file has rope_factors_{''.join(factors)} without its pair")
    lists = {k: np.asarray(v, dtype=np.float32).reshape(-1).tolist() for k, v in factors.items()}
    if any(len(v) != rope_dim // 2 for v in lists.values()):
        raise ValueError(f"rope_factors hold {len(lists['long'])} values; expected {rope_dim // 2}")
    original = get("rope.scaling.original_context_length", None)
    if original is None:
        raise ValueError("GGUF file has rope_factors but no rope.scaling.original_context_length")
    scaling = {
        "rope_type": "longrope",
        "long_factor": lists["long"],
        "short_factor": lists["short"],
        "original_max_position_embeddings": int(original),
    }
    attn = get("rope.scaling.attn_factor", None)  # the converter writes the factor transformers derives
    if attn is not None:
        scaling["attention_factor"] = float(attn)
    return scaling


def llama3_divisors(params: dict[str, Any], theta: float, rope_dim: int) -> np.ndarray:
    """Per-frequency divisors of llama3 rope scaling (what llama.cpp stores as rope_freqs.weight)."""
    inv = theta ** (-np.arange(0, rope_dim, 2, dtype=np.float64) / rope_dim)
    wavelen = 2 * math.pi / inv
    factor, low, high = (float(params[k]) for k in ("factor", "low_freq_factor", "high_freq_factor"))
    original = float(params["original_max_position_embeddings"])
    smooth = (original / wavelen - low) / (high - low)
    medium = 1.0 / ((1 - smooth) / factor + smooth)
    return np.where(wavelen < original / high, 1.0, np.where(wavelen > original / low, factor, medium))


def _llama3_scaling(divisors: np.ndarray, theta: float, rope_dim: int) -> dict[str, Any] | None:
    """Recover HF llama3 rope_scaling from rope_freqs; ValueError when no llama3 setting reproduces it.

    The divisors depend on original_max_position_embeddings only through its ratio to the low/high
    frequency factors, so it is fixed at Llama 3's 8192 and the two factors are fitted to the smoothly
    scaled band (when it holds fewer than two frequencies, Llama 3's 1 and 4 are tried).
    """
    if len(divisors) != rope_dim // 2:
        raise ValueError(
            f"rope_freqs has {len(divisors)} values; expected {rope_dim // 2} (rope dim {rope_dim})"
        )
    if np.allclose(divisors, 1.0, rtol=0, atol=1e-6):
        return None
    factor = float(divisors.max())
    original = _LLAMA3_ORIGINAL_CONTEXT
    low, high = 1.0, 4.0
    inv = theta ** (-np.arange(0, rope_dim, 2, dtype=np.float64) / rope_dim)
    band = (divisors > 1 + 1e-4) & (divisors < factor * (1 - 1e-4))
    if band.sum() >= 2:
        # divisor = 1 / ((1 - s) / factor + s) with s = (original * inv / (2 pi) - low) / (high - low)
        s = (1 / divisors[band] - 1 / factor) / (1 - 1 / factor)
        slope, intercept = np.polyfit(inv[band] / (2 * math.pi), s, 1)
        span = original / slope
        low = float(f"{-intercept * span:.6g}")
        high = float(f"{low + span:.6g}")
    params: dict[str, Any] = {
        "rope_type": "llama3",
        "factor": float(f"{factor:.6g}"),
        "low_freq_factor": low,
        "high_freq_factor": high,
        "original_max_position_embeddings": original,
    }
    if not np.allclose(llama3_divisors(params, theta, rope_dim), divisors, rtol=1e-3, atol=0):
        raise ValueError(
            "rope_freqs.weight does not follow llama3 rope scaling; cannot express it as rope_scaling"
        )
    return params
