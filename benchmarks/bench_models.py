"""Random-weight models of real shapes for benchmarks, written once in Hugging Face format."""

from __future__ import annotations

import json
import os
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
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "tests"))
    from tokenizer_factory import build_tokenizer_dir

    torch.manual_seed(seed)
    cfg = tf.Qwen3Config(**QWEN3_0_6B, eos_token_id=1, bos_token_id=0)
    model = tf.AutoModelForCausalLM.from_config(cfg, dtype=dtype)
    model.save_pretrained(out, safe_serialization=True)
    build_tokenizer_dir(out)
    (out / "generation_config.json").write_text(json.dumps({"eos_token_id": 1}) + "\n")
    return out
