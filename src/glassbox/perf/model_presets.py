"""Embedded config.json values of well-known models, so ``glassbox plan NAME`` needs no download.

Only architecture fields are kept (values as published on the Hugging Face Hub). Gemma 3 27B is its
``text_config`` (the 0.4B SigLIP vision tower is not part of text generation).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from glassbox.models.config_reader import facts_from_config, facts_from_dir, facts_from_gguf
from glassbox.models.facts import ModelFacts
from glassbox.models.gguf_reader import is_gguf, open_gguf
from glassbox.models.sources import resolve_model
from glassbox.perf.presets_hybrid import HYBRID_PRESETS
from glassbox.quant.config import method_config

_LLAMA_COMMON: dict[str, Any] = {
    "architectures": ["LlamaForCausalLM"],
    "model_type": "llama",
    "hidden_act": "silu",
    "attention_bias": False,
    "mlp_bias": False,
    "head_dim": 128,
    "vocab_size": 128256,
    "max_position_embeddings": 131072,
    "rope_theta": 500000.0,
    "rms_norm_eps": 1e-05,
    "tie_word_embeddings": False,
    "torch_dtype": "bfloat16",
}

_GEMMA4_COMMON: dict[str, Any] = {
    "architectures": ["Gemma4ForConditionalGeneration"],  # the text model of: models/gemma4.py runs it
    "model_type": "gemma4_text",
    "head_dim": 256,
    "global_head_dim": 512,
    "attention_k_eq_v": True,
    "sliding_window": 1024,
    "vocab_size": 262144,
    "vocab_size_per_layer_input": 262144,
    "hidden_size_per_layer_input": 0,
    "num_kv_shared_layers": 0,
    "max_position_embeddings": 262144,
    "final_logit_softcapping": 30.0,
    "hidden_activation": "gelu_pytorch_tanh",
    "rms_norm_eps": 1e-06,
    "rope_parameters": {
        "full_attention": {
            "partial_rotary_factor": 0.25,
            "rope_theta": 1000000.0,
            "rope_type": "proportional",
        },
        "sliding_attention": {"rope_theta": 10000.0, "rope_type": "default"},
    },
    "tie_word_embeddings": True,
    "torch_dtype": "bfloat16",
}

_GPT_OSS_COMMON: dict[str, Any] = {
    "architectures": ["GptOssForCausalLM"],
    "model_type": "gpt_oss",
    "hidden_size": 2880,
    "intermediate_size": 2880,
    "head_dim": 64,
    "num_attention_heads": 64,
    "num_key_value_heads": 8,
    "experts_per_token": 4,
    "num_experts_per_tok": 4,
    "sliding_window": 128,
    "attention_bias": True,
    "vocab_size": 201088,
    "max_position_embeddings": 131072,
    "initial_context_length": 4096,
    "rope_theta": 150000,
    "rope_scaling": {
        "rope_type": "yarn",
        "factor": 32.0,
        "beta_fast": 32.0,
        "beta_slow": 1.0,
        "original_max_position_embeddings": 4096,
        "truncate": False,
    },
    "swiglu_limit": 7.0,
    "tie_word_embeddings": False,
    "torch_dtype": "bfloat16",
    "quantization_config": method_config(
        "mxfp4",
        modules_to_not_convert=[
            "model.layers.*.self_attn",
            "model.layers.*.mlp.router",
            "model.embed_tokens",
            "lm_head",
        ],
    ),
}


def _alternating(n: int) -> list[str]:
    return ["sliding_attention" if i % 2 == 0 else "full_attention" for i in range(n)]


PRESETS: dict[str, dict[str, Any]] = {
    "llama-3.1-8b": {
        **_LLAMA_COMMON,
        "hidden_size": 4096,
        "intermediate_size": 14336,
        "num_hidden_layers": 32,
        "num_attention_heads": 32,
        "num_key_value_heads": 8,
    },
    "llama-3.3-70b": {
        **_LLAMA_COMMON,
        "hidden_size": 8192,
        "intermediate_size": 28672,
        "num_hidden_layers": 80,
        "num_attention_heads": 64,
        "num_key_value_heads": 8,
    },
    "qwen3-0.6b": {
        "architectures": ["Qwen3ForCausalLM"],
        "model_type": "qwen3",
        "hidden_size": 1024,
        "intermediate_size": 3072,
        "num_hidden_layers": 28,
        "num_attention_heads": 16,
        "num_key_value_heads": 8,
        "head_dim": 128,
        "vocab_size": 151936,
        "max_position_embeddings": 40960,
        "rope_theta": 1000000,
        "sliding_window": None,
        "use_sliding_window": False,
        "max_window_layers": 28,
        "attention_bias": False,
        "tie_word_embeddings": True,
        "torch_dtype": "bfloat16",
    },
    "qwen2.5-coder-7b": {
        "architectures": ["Qwen2ForCausalLM"],
        "model_type": "qwen2",
        "hidden_size": 3584,
        "intermediate_size": 18944,
        "num_hidden_layers": 28,
        "num_attention_heads": 28,
        "num_key_value_heads": 4,
        "vocab_size": 152064,
        "max_position_embeddings": 32768,
        "rope_theta": 1000000.0,
        "sliding_window": 131072,
        "use_sliding_window": False,
        "max_window_layers": 28,
        "tie_word_embeddings": False,
        "torch_dtype": "bfloat16",
    },
    "gpt-oss-20b": {
        **_GPT_OSS_COMMON,
        "num_hidden_layers": 24,
        "num_local_experts": 32,
        "layer_types": _alternating(24),
    },
    "gpt-oss-120b": {
        **_GPT_OSS_COMMON,
        "num_hidden_layers": 36,
        "num_local_experts": 128,
        "layer_types": _alternating(36),
    },
    "qwen3-30b-a3b": {
        "architectures": ["Qwen3MoeForCausalLM"],
        "model_type": "qwen3_moe",
        "hidden_size": 2048,
        "intermediate_size": 6144,
        "moe_intermediate_size": 768,
        "num_hidden_layers": 48,
        "num_attention_heads": 32,
        "num_key_value_heads": 4,
        "head_dim": 128,
        "num_experts": 128,
        "num_experts_per_tok": 8,
        "decoder_sparse_step": 1,
        "mlp_only_layers": [],
        "norm_topk_prob": True,
        "vocab_size": 151936,
        "max_position_embeddings": 40960,
        "rope_theta": 1000000.0,
        "sliding_window": None,
        "use_sliding_window": False,
        "tie_word_embeddings": False,
        "torch_dtype": "bfloat16",
    },
    "mixtral-8x7b": {
        "architectures": ["MixtralForCausalLM"],
        "model_type": "mixtral",
        "hidden_size": 4096,
        "intermediate_size": 14336,
        "num_hidden_layers": 32,
        "num_attention_heads": 32,
        "num_key_value_heads": 8,
        "num_local_experts": 8,
        "num_experts_per_tok": 2,
        "vocab_size": 32000,
        "max_position_embeddings": 32768,
        "rope_theta": 1000000.0,
        "sliding_window": None,
        "tie_word_embeddings": False,
        "torch_dtype": "bfloat16",
    },
    "gemma-3-27b": {
        "architectures": ["Gemma3ForCausalLM"],
        "model_type": "gemma3_text",
        "hidden_size": 5376,
        "intermediate_size": 21504,
        "num_hidden_layers": 62,
        "num_attention_heads": 32,
        "num_key_value_heads": 16,
        "head_dim": 128,
        "query_pre_attn_scalar": 168,
        "sliding_window": 1024,
        "sliding_window_pattern": 6,
        "vocab_size": 262208,
        "max_position_embeddings": 131072,
        "rope_theta": 1000000.0,
        "rope_local_base_freq": 10000.0,
        "rope_scaling": {"factor": 8.0, "rope_type": "linear"},
        "tie_word_embeddings": True,
        "torch_dtype": "bfloat16",
    },
    "qwen3-235b-a22b": {
        "architectures": ["Qwen3MoeForCausalLM"],
        "model_type": "qwen3_moe",
        "hidden_size": 4096,
        "intermediate_size": 12288,
        "moe_intermediate_size": 1536,
        "num_hidden_layers": 94,
        "num_attention_heads": 64,
        "num_key_value_heads": 4,
        "head_dim": 128,
        "num_experts": 128,
        "num_experts_per_tok": 8,
        "decoder_sparse_step": 1,
        "mlp_only_layers": [],
        "norm_topk_prob": True,
        "vocab_size": 151936,
        "max_position_embeddings": 40960,
        "rope_theta": 1000000.0,
        "sliding_window": None,
        "use_sliding_window": False,
        "tie_word_embeddings": False,
        "torch_dtype": "bfloat16",
    },
    "gemma-3-4b": {
        "architectures": ["Gemma3ForCausalLM"],
        "model_type": "gemma3_text",
        "hidden_size": 2560,
        "intermediate_size": 10240,
        "num_hidden_layers": 34,
        "num_attention_heads": 8,
        "num_key_value_heads": 4,
        "head_dim": 256,
        "query_pre_attn_scalar": 256,
        "sliding_window": 1024,
        "sliding_window_pattern": 6,
        "vocab_size": 262208,
        "max_position_embeddings": 131072,
        "rope_theta": 1000000.0,
        "rope_local_base_freq": 10000.0,
        "rope_scaling": {"factor": 8.0, "rope_type": "linear"},
        "tie_word_embeddings": True,
        "torch_dtype": "bfloat16",
    },
    # Gemma 4: each model's text_config (the vision tower is not part of text generation), as published in
    # google/gemma-4-31B-it's and google/gemma-4-26B-A4B-it's config.json (read through public code that quotes
    # them: search of GitHub code for "num_global_key_value_heads"); their parameter counts here, 30.70B and
    # 25.23B (3.82B active), are the model cards' 30.7B and 25.2B (3.8B active)
    "gemma-4-31b": {
        **_GEMMA4_COMMON,
        "hidden_size": 5376,
        "intermediate_size": 21504,
        "num_hidden_layers": 60,
        "num_attention_heads": 32,
        "num_key_value_heads": 16,
        "num_global_key_value_heads": 4,
        "layer_types": (["sliding_attention"] * 5 + ["full_attention"]) * 10,
    },
    "gemma-4-26b-a4b": {
        **_GEMMA4_COMMON,
        "hidden_size": 2816,
        "intermediate_size": 2112,
        "num_hidden_layers": 30,
        "num_attention_heads": 16,
        "num_key_value_heads": 8,
        "num_global_key_value_heads": 2,
        "layer_types": (["sliding_attention"] * 5 + ["full_attention"]) * 5,
        "enable_moe_block": True,
        "num_experts": 128,
        "top_k_experts": 8,
        "moe_intermediate_size": 704,
    },
    # LongRoPE's 48 factor pairs are left out (no plan depends on them), so its rope reads as unscaled here
    "phi-4-mini": {
        "architectures": ["Phi3ForCausalLM"],
        "model_type": "phi3",
        "hidden_size": 3072,
        "intermediate_size": 8192,
        "num_hidden_layers": 32,
        "num_attention_heads": 24,
        "num_key_value_heads": 8,
        "partial_rotary_factor": 0.75,
        "vocab_size": 200064,
        "max_position_embeddings": 131072,
        "original_max_position_embeddings": 4096,
        "rope_theta": 10000.0,
        "rms_norm_eps": 1e-05,
        "tie_word_embeddings": True,
        "torch_dtype": "bfloat16",
    },
    **HYBRID_PRESETS,
}

# Hub repository each preset's values come from (for the report and for people who want the weights).
SOURCES: dict[str, str] = {
    "llama-3.1-8b": "meta-llama/Llama-3.1-8B-Instruct",
    "llama-3.3-70b": "meta-llama/Llama-3.3-70B-Instruct",
    "qwen3-0.6b": "Qwen/Qwen3-0.6B",
    "qwen2.5-coder-7b": "Qwen/Qwen2.5-Coder-7B-Instruct",
    "gpt-oss-20b": "openai/gpt-oss-20b",
    "gpt-oss-120b": "openai/gpt-oss-120b",
    "nemotron-3-super-120b-a12b": "nvidia/NVIDIA-Nemotron-3-Super-120B-A12B-BF16",
    "qwen3-next-80b-a3b": "Qwen/Qwen3-Next-80B-A3B-Instruct",
    "qwen3.5-122b-a10b": "Qwen/Qwen3.5-122B-A10B (text_config)",
    "qwen3-30b-a3b": "Qwen/Qwen3-30B-A3B",
    "mixtral-8x7b": "mistralai/Mixtral-8x7B-Instruct-v0.1",
    "gemma-3-27b": "google/gemma-3-27b-it (text_config)",
    "phi-4-mini": "microsoft/Phi-4-mini-instruct",
    "qwen3-235b-a22b": "Qwen/Qwen3-235B-A22B",
    "gemma-3-4b": "google/gemma-3-4b-it (text_config)",
    "gemma-4-31b": "google/gemma-4-31B-it (text_config)",
    "gemma-4-26b-a4b": "google/gemma-4-26B-A4B-it (text_config)",
}


def load_model_facts(model: str) -> ModelFacts:
    """MODEL is a preset name (see PRESETS), a model directory, a config.json path, or a .gguf file."""
    key = model.lower()
    if key in PRESETS:
        return facts_from_config(PRESETS[key], key)
    path = Path(model).expanduser()
    try:
        if path.is_file() and not is_gguf(path):
            return facts_from_dir(path)  # a config.json
        source = resolve_model(model)
        if source.format == "gguf":
            return facts_from_gguf(open_gguf(source.path), source.name)
        return facts_from_dir(source.path)
    except FileNotFoundError as e:
        raise ValueError(
            f"MODEL must be a preset ({', '.join(PRESETS)}), a model directory, a config.json, a .gguf "
            f"file or a stored model's name, got {model!r}: {e}"
        ) from None
