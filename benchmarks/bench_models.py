"""Random-weight models of real shapes for benchmarks, written once in Hugging Face format."""

from __future__ import annotations

import json
import os
import shutil
import sys
from pathlib import Path
from typing import Any

import torch

QWEN3_0_6B: dict[str, Any] = dict(
    hidden_size=1024,
    num_hidden_layers=28,
    num_attention_heads=16,
    num_key_value_heads=8,
    head_dim=128,
    intermediate_size=3072,
    vocab_size=151936,
    max_position_embeddings=40960,
    rope_theta=1000000.0,
    tie_word_embeddings=True,
    rms_norm_eps=1e-6,
)


def cache_dir() -> Path:
    root = Path(os.environ.get("GLASSBOX_CACHE_DIR", Path.home() / ".cache" / "glassbox")) / "bench-models"
    root.mkdir(parents=True, exist_ok=True)
    return root


def qwen3_0_6b_random(dtype: torch.dtype = torch.bfloat16, seed: int = 0) -> Path:
    """A Qwen3-0.6B-shaped model with random weights (std 0.02) and the test tokenizer."""
    import transformers as tf

    out = cache_dir() / f"qwen3-0.6b-random-{str(dtype).split('.')[-1]}"
    if (out / "model.safetensors").is_file():
        return out
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "tests" / "helpers"))
    from tokenizer_factory import build_tokenizer_dir

    torch.manual_seed(seed)
    cfg = tf.Qwen3Config(**QWEN3_0_6B, eos_token_id=1, bos_token_id=0)
    model = tf.AutoModelForCausalLM.from_config(cfg, dtype=dtype)
    model.save_pretrained(out, safe_serialization=True)
    build_tokenizer_dir(out)
    (out / "generation_config.json").write_text(json.dumps({"eos_token_id": 1}) + "\n")
    return out


# The real models' dimensions (Qwen/Qwen3-30B-A3B, openai/gpt-oss-20b config.json); the layer count is
# the caller's (random weights of the full depth do not fit a small machine).
QWEN3_30B_A3B: dict[str, Any] = dict(
    hidden_size=2048,
    intermediate_size=6144,
    moe_intermediate_size=768,
    num_attention_heads=32,
    num_key_value_heads=4,
    head_dim=128,
    num_experts=128,
    num_experts_per_tok=8,
    norm_topk_prob=True,
    decoder_sparse_step=1,
    mlp_only_layers=[],
    vocab_size=151936,
    max_position_embeddings=40960,
    rope_parameters={"rope_type": "default", "rope_theta": 1000000.0},
    rms_norm_eps=1e-6,
    tie_word_embeddings=False,
)
GPT_OSS_20B: dict[str, Any] = dict(
    hidden_size=2880,
    intermediate_size=2880,
    num_attention_heads=64,
    num_key_value_heads=8,
    head_dim=64,
    num_local_experts=32,
    num_experts_per_tok=4,
    vocab_size=201088,
    sliding_window=128,
    max_position_embeddings=131072,
    rms_norm_eps=1e-5,
    tie_word_embeddings=False,  # rope: GptOssConfig's default, gpt-oss-20b's YaRN (theta 150000, x32)
)
MOE_SHAPES: dict[str, tuple[str, dict[str, Any]]] = {
    "qwen3-30b-a3b": ("Qwen3MoeConfig", QWEN3_30B_A3B),
    "gpt-oss-20b": ("GptOssConfig", GPT_OSS_20B),
}


def moe_random(shape: str, layers: int, seed: int = 0, **override: Any) -> Path:
    """A ``shape``-shaped (MOE_SHAPES) model of ``layers`` layers, random bf16 weights (transformers'
    init: std 0.02), the test tokenizer; written once and reused. ``override``: config fields (tests)."""
    import transformers as tf

    cls_name, dims = MOE_SHAPES[shape]
    tag = "-".join(f"{k}{v}" for k, v in sorted(override.items()))
    out = cache_dir() / f"{shape}-{layers}l-random-bf16{'-' + tag if tag else ''}"
    if (out / "config.json").is_file() and (out / "tokenizer.json").is_file():
        return out
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "tests" / "helpers"))
    from tokenizer_factory import build_tokenizer_dir

    torch.manual_seed(seed)
    cfg = getattr(tf, cls_name)(
        **{**dims, "num_hidden_layers": layers, **override}, eos_token_id=1, bos_token_id=0
    )
    model = tf.AutoModelForCausalLM.from_config(cfg, dtype=torch.bfloat16)
    tmp = out.with_name(out.name + ".partial")
    shutil.rmtree(tmp, ignore_errors=True)
    model.save_pretrained(tmp, safe_serialization=True)
    del model
    build_tokenizer_dir(tmp)
    (tmp / "generation_config.json").write_text(json.dumps({"eos_token_id": 1}) + "\n")
    tmp.rename(out)
    return out
