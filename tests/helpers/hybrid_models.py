"""Tiny random hybrid models (Qwen3-Next, Qwen3.5, Qwen3.5-MoE, Nemotron-H) built with transformers for
tests, and transformers' greedy continuations of them (the reference)."""

from __future__ import annotations

import json
import shutil
from pathlib import Path
from typing import Any

import torch
from tiny_models import hf_greedy
from tokenizer_factory import build_tokenizer_dir

HYBRID_ARCHS = ("qwen3_next", "qwen3_5", "qwen3_5_moe", "nemotron_h")

# 64 wide; GDN: 2 k heads of 16, 4 v heads of 8 (each k head serves two v heads); 3 linear : 1 full
_QWEN: dict[str, Any] = dict(
    hidden_size=64,
    num_hidden_layers=4,
    num_attention_heads=4,
    num_key_value_heads=2,
    head_dim=16,
    linear_num_key_heads=2,
    linear_num_value_heads=4,
    linear_key_head_dim=16,
    linear_value_head_dim=8,
    max_position_embeddings=1024,
)


def hybrid_config(arch: str, vocab: int, eos: int, **overrides: Any) -> Any:
    import transformers as tf

    kw: dict[str, Any] = dict(vocab_size=vocab, eos_token_id=eos, bos_token_id=0, pad_token_id=None)
    if arch == "qwen3_next":  # layer 1 a dense MLP (mlp_only_layers), the others MoE with a shared expert
        kw |= _QWEN | dict(
            intermediate_size=96, num_experts=8, num_experts_per_tok=2, moe_intermediate_size=32
        )
        kw |= dict(shared_expert_intermediate_size=48, mlp_only_layers=[1], norm_topk_prob=True)
        return tf.Qwen3NextConfig(**(kw | overrides))
    if arch == "qwen3_5":
        return tf.Qwen3_5TextConfig(**(kw | _QWEN | dict(intermediate_size=96) | overrides))
    if arch == "qwen3_5_moe":
        kw |= _QWEN | dict(num_experts=8, num_experts_per_tok=2, moe_intermediate_size=32)
        return tf.Qwen3_5MoeTextConfig(**(kw | dict(shared_expert_intermediate_size=48) | overrides))
    if arch == "nemotron_h":
        # every block kind; Mamba: 4 heads of 16 in 2 groups, state 16, chunks of 16 (prompts cross many);
        # the router: 8 experts in 2 groups, the best group of 2 chosen, top-2, scaled weights
        kw |= dict(
            hidden_size=64,
            hybrid_override_pattern="M-M*ME",
            num_attention_heads=4,
            num_key_value_heads=2,
            head_dim=16,
            intermediate_size=96,
            mamba_num_heads=4,
            mamba_head_dim=16,
            n_groups=2,
            ssm_state_size=16,
            chunk_size=16,
            n_routed_experts=8,
            num_experts_per_tok=2,
            moe_intermediate_size=32,
            moe_shared_expert_intermediate_size=48,
            n_group=2,
            topk_group=1,
            routed_scaling_factor=1.5,
            max_position_embeddings=1024,
        )
        return tf.NemotronHConfig(**(kw | overrides))
    raise ValueError(arch)


def build_hybrid_model(arch: str, root: Path, seed: int = 0, **overrides: Any) -> Path:
    """Write a random float32 ``arch`` model with the shared test tokenizer to ``root``; returns the dir."""
    import transformers as tf

    tag = "-".join(f"{k}={v}" for k, v in sorted(overrides.items()))
    out = root / f"{arch}-{seed}{'-' + tag if tag else ''}"
    if (out / "config.json").is_file():
        return out
    tok_dir = build_tokenizer_dir(root / "tokenizer")
    vocab = json.loads((tok_dir / "tokenizer.json").read_text())
    vocab_size = len(vocab["model"]["vocab"]) + sum(
        1 for t in vocab["added_tokens"] if t["content"] not in vocab["model"]["vocab"]
    )
    eos = json.loads((tok_dir / "generation_config.json").read_text())["eos_token_id"]
    torch.manual_seed(seed)
    model = tf.AutoModelForCausalLM.from_config(hybrid_config(arch, vocab_size, eos, **overrides))
    with torch.no_grad():  # larger weights than the default init, so that outputs vary by token
        for name, p in model.named_parameters():
            p.uniform_(0.8, 1.2) if "norm" in name else p.normal_(0.0, 0.08)
        for name, b in model.named_buffers():
            if name.endswith("e_score_correction_bias"):  # Nemotron-H: the router's choice bias bites
                b.normal_(0.0, 0.1)
    model.save_pretrained(out, safe_serialization=True)
    for f in tok_dir.iterdir():
        if f.name != "generation_config.json" or not (out / f.name).exists():
            shutil.copy(f, out / f.name)
    return out


def build_multimodal_qwen35(root: Path) -> Path:
    """A random Qwen3.5-MoE image-text checkpoint (Qwen3_5MoeForConditionalGeneration: the text model of
    ``hybrid_config("qwen3_5_moe")`` and a one-block vision tower) with the test tokenizer."""
    import transformers as tf

    out = root / "qwen3_5_moe-multimodal"
    if (out / "config.json").is_file():
        return out
    tok_dir = build_tokenizer_dir(root / "tokenizer")
    eos = json.loads((tok_dir / "generation_config.json").read_text())["eos_token_id"]
    text = hybrid_config("qwen3_5_moe", 512, eos).to_dict()
    vision = dict(depth=1, hidden_size=32, intermediate_size=64, num_heads=2, out_hidden_size=64)
    torch.manual_seed(0)
    model = tf.Qwen3_5MoeForConditionalGeneration(tf.Qwen3_5MoeConfig(text_config=text, vision_config=vision))
    with torch.no_grad():
        for name, p in model.named_parameters():
            p.uniform_(0.8, 1.2) if "norm" in name else p.normal_(0.0, 0.08)
    model.save_pretrained(out, safe_serialization=True)
    for f in tok_dir.iterdir():
        if f.name != "generation_config.json" or not (out / f.name).exists():
            shutil.copy(f, out / f.name)
    return out


def reference(model_dir: Path, prompts: list[list[int]], max_new: int) -> list[tuple[list[int], list[float]]]:
    """transformers' greedy continuations (float32, its torch paths) and their logprobs."""
    return hf_greedy(model_dir, prompts, max_new)
