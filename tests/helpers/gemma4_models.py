"""Tiny random Gemma 4 models built with transformers (Gemma4TextConfig / Gemma4ForCausalLM) for the tests.

``dense``: six layers (sliding, sliding, full) x 2 with a window of 24 tokens (shorter than most test
prompts), full layers of their own geometry (head dim 32 against 16, one KV head against two, V = K),
per-layer inputs (8 per layer), the last two layers reading earlier layers' KV (layer 4 layer 3's, layer
5 layer 2's) with MLPs twice as wide. ``moe``: three layers, four experts (top 2) beside each dense MLP,
full layers with their own V projection and two KV heads of 32 dims.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path
from typing import Any

import torch
from tokenizer_factory import build_tokenizer_dir

KINDS = ("dense", "moe")
_COMMON: dict[str, Any] = dict(
    hidden_size=64,
    intermediate_size=96,
    num_attention_heads=4,
    num_key_value_heads=2,
    head_dim=16,
    global_head_dim=32,
    sliding_window=24,
    max_position_embeddings=1024,
    rms_norm_eps=1e-6,
    final_logit_softcapping=2.0,  # the tiny models' logits reach ~2.8: the cap bites
    bos_token_id=0,
    architectures=["Gemma4ForCausalLM"],
)
_KIND: dict[str, dict[str, Any]] = {
    "dense": dict(
        num_hidden_layers=6,
        layer_types=["sliding_attention", "sliding_attention", "full_attention"] * 2,
        attention_k_eq_v=True,
        num_global_key_value_heads=1,
        num_kv_shared_layers=2,
        use_double_wide_mlp=True,
        hidden_size_per_layer_input=8,
    ),
    "moe": dict(
        num_hidden_layers=3,
        layer_types=["sliding_attention", "sliding_attention", "full_attention"],
        hidden_size_per_layer_input=0,
        enable_moe_block=True,
        num_experts=4,
        top_k_experts=2,
        moe_intermediate_size=32,
    ),
}


def gemma4_config(kind: str, vocab: int, eos: int, **overrides: Any) -> Any:
    """transformers' Gemma4TextConfig of a tiny ``kind`` model."""
    import transformers as tf

    kw = {
        **_COMMON,
        **_KIND[kind],
        "vocab_size": vocab,
        "vocab_size_per_layer_input": vocab,
        "eos_token_id": eos,
    }
    return tf.Gemma4TextConfig(**{**kw, **overrides})


def _randomize(model: Any) -> None:
    """Weights larger than the default init so that outputs vary by token; norms and scales near 1; the
    router decisive (logits of std ~0.5), the layer scalars away from 1 (so that applying them matters)."""
    with torch.no_grad():
        for name, p in model.named_parameters():
            if "norm" in name or name.endswith(("router.scale", "per_expert_scale")):
                p.uniform_(0.8, 1.2)
            elif "router.proj" in name:
                p.normal_(0.0, 0.5)
            else:
                p.normal_(0.0, 0.08)
        for name, b in model.named_buffers():
            if name.endswith("layer_scalar"):
                b.uniform_(0.7, 1.3)


def _multimodal(text: Any, vocab: int) -> Any:
    """Gemma4ForConditionalGeneration around the text model ``text``: one-layer vision and audio towers, the
    media tokens at the top of the tiny vocabulary."""
    import transformers as tf

    vision = tf.Gemma4VisionConfig(
        hidden_size=32, intermediate_size=64, num_hidden_layers=1, num_attention_heads=2, num_key_value_heads=2,
        head_dim=16,
    )  # fmt: skip
    audio = tf.Gemma4AudioConfig(
        hidden_size=32, num_hidden_layers=1, num_attention_heads=2, output_proj_dims=32,
        subsampling_conv_channels=[8, 4],
    )  # fmt: skip
    tokens = ("image_token_id", "boi_token_id", "eoi_token_id", "boa_token_id", "audio_token_id",
              "eoa_token_index", "video_token_id")  # fmt: skip
    config = tf.Gemma4Config(
        text_config=text.to_dict(), vision_config=vision.to_dict(), audio_config=audio.to_dict(),
        **{name: vocab - 1 - i for i, name in enumerate(tokens)},
    )  # fmt: skip
    return tf.Gemma4ForConditionalGeneration(config)


def build_gemma4(kind: str, root: Path, seed: int = 0, multimodal: bool = False, **overrides: Any) -> Path:
    """Write a random tiny ``kind`` Gemma 4 model (float32) with the shared test tokenizer under ``root``;
    ``multimodal``: as the text model of a Gemma4ForConditionalGeneration with vision and audio towers."""
    import transformers as tf

    tag = "-".join(f"{k}={v}" for k, v in sorted(overrides.items()))
    out = root / f"gemma4-{kind}-{seed}{'-mm' if multimodal else ''}{'-' + tag if tag else ''}"
    if (out / "config.json").is_file():
        return out
    tok_dir = build_tokenizer_dir(root / "tokenizer")
    vocab = json.loads((tok_dir / "tokenizer.json").read_text())
    vocab_size = len(vocab["model"]["vocab"]) + sum(
        1 for t in vocab["added_tokens"] if t["content"] not in vocab["model"]["vocab"]
    )
    eos = json.loads((tok_dir / "generation_config.json").read_text())["eos_token_id"]
    torch.manual_seed(seed)
    text = gemma4_config(kind, vocab_size, eos, **overrides)
    model = (_multimodal(text, vocab_size) if multimodal else tf.Gemma4ForCausalLM(text)).float()
    _randomize(model)
    model.save_pretrained(out, safe_serialization=True)
    for f in tok_dir.iterdir():
        if f.name != "generation_config.json" or not (out / f.name).exists():
            shutil.copy(f, out / f.name)
    return out
