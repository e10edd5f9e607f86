"""Tiny random Hugging Face models of each supported architecture, built with transformers for tests."""

from __future__ import annotations

import json
import shutil
from pathlib import Path
from typing import Any

import torch
from tokenizer_factory import build_tokenizer_dir

ARCHS = ("llama", "qwen2", "qwen3", "mistral", "gemma3")
MOE_ARCHS = ("mixtral", "qwen2_moe", "qwen3_moe")

_BASE: dict[str, Any] = dict(
    hidden_size=64,
    intermediate_size=128,
    num_hidden_layers=2,
    num_attention_heads=4,
    num_key_value_heads=2,
    max_position_embeddings=1024,
    rms_norm_eps=1e-6,
)


def _config(arch: str, vocab: int, eos: int, **overrides: Any) -> Any:
    import transformers as tf

    kw = dict(_BASE, vocab_size=vocab, eos_token_id=eos, bos_token_id=0, **overrides)
    if arch == "llama":
        kw.setdefault(
            "rope_scaling",
            {
                "rope_type": "llama3",
                "factor": 8.0,
                "low_freq_factor": 1.0,
                "high_freq_factor": 4.0,
                "original_max_position_embeddings": 128,
            },
        )
        kw.setdefault("rope_theta", 500000.0)
        return tf.LlamaConfig(**kw)
    if arch == "qwen2":
        kw.setdefault("tie_word_embeddings", True)
        return tf.Qwen2Config(**kw)
    if arch == "qwen3":
        kw.setdefault("head_dim", 32)
        kw.setdefault("tie_word_embeddings", True)
        return tf.Qwen3Config(**kw)
    if arch == "mistral":
        kw.setdefault("sliding_window", 48)
        return tf.MistralConfig(**kw)
    if arch == "mixtral":  # 8 experts, top-2, every layer sparse
        kw.update(num_local_experts=8, num_experts_per_tok=2, intermediate_size=32)
        return tf.MixtralConfig(**kw)
    if arch == "qwen2_moe":  # a shared expert with its gate; layer 1 of 3 dense (mlp_only_layers)
        kw["num_hidden_layers"] = overrides.get("num_hidden_layers", 3)
        kw.update(num_experts=8, num_experts_per_tok=2)
        kw.setdefault("moe_intermediate_size", 32)
        kw.setdefault("shared_expert_intermediate_size", 48)
        kw.setdefault("mlp_only_layers", [1])
        kw.setdefault("norm_topk_prob", False)
        return tf.Qwen2MoeConfig(**kw)
    if arch == "qwen3_moe":  # top-2 renormalized; every second layer sparse (decoder_sparse_step 2)
        kw["num_hidden_layers"] = overrides.get("num_hidden_layers", 4)
        kw.update(num_experts=8, num_experts_per_tok=2)
        kw.setdefault("moe_intermediate_size", 32)
        kw.setdefault("head_dim", 32)
        kw.setdefault("decoder_sparse_step", 2)
        kw.setdefault("norm_topk_prob", True)
        kw.setdefault("tie_word_embeddings", True)
        return tf.Qwen3MoeConfig(**kw)
    if arch == "gpt_oss":
        # sliding (window 16, shorter than most prompts) / full layers; head_dim * heads != hidden; 8 experts,
        # top-2, with a SwiGLU limit low enough that both clamps bite; YaRN with its ramp inside the head
        kw.update(num_local_experts=8, num_experts_per_tok=2)
        kw.update(
            intermediate_size=overrides.get("intermediate_size", 32), head_dim=overrides.get("head_dim", 24)
        )
        kw.setdefault("sliding_window", 16)
        kw.setdefault("swiglu_limit", 1.0)
        kw.setdefault(
            "rope_parameters",
            {"rope_type": "yarn", "rope_theta": 10000.0, "factor": 4.0, "beta_fast": 32.0, "beta_slow": 1.0,
             "original_max_position_embeddings": 256, "truncate": False},
        )  # fmt: skip
        return tf.GptOssConfig(**kw)
    if arch == "phi3":
        # LongRoPE on 3/4 of each head (Phi-4-mini's shape of settings), its short factors below the
        # pre-training length of 64 (where the tests stay unless they pass it on purpose), a sliding window
        kw.setdefault("partial_rotary_factor", 0.75)
        kw.setdefault("original_max_position_embeddings", 64)
        kw.setdefault("sliding_window", 40)
        half = int(64 // 4 * kw["partial_rotary_factor"]) // 2
        kw.setdefault(
            "rope_scaling",
            {"rope_type": "longrope", "short_factor": [1.0 + 0.1 * i for i in range(half)],
             "long_factor": [1.5 + 0.7 * i for i in range(half)]},
        )  # fmt: skip
        kw.setdefault("tie_word_embeddings", True)
        kw.setdefault("pad_token_id", None)  # Phi3Config's 32000 is past the tiny vocabulary
        return tf.Phi3Config(**kw)
    if arch == "gemma3":
        # windows (40) shorter than most prompts; local and global layers with their own rope (global scaled);
        # head_dim * heads != hidden and an attention scale other than head_dim ** -0.5
        kw["num_hidden_layers"] = overrides.get("num_hidden_layers", 3)
        kw.setdefault("head_dim", 32)
        kw.setdefault("query_pre_attn_scalar", 24)
        kw.setdefault("sliding_window", 40)
        kinds = ("sliding_attention", "full_attention", "sliding_attention")  # local, global, local, ...
        kw.setdefault("layer_types", [kinds[i % 3] for i in range(kw["num_hidden_layers"])])
        kw.setdefault(
            "rope_parameters",
            {
                "full_attention": {"rope_type": "linear", "factor": 4.0, "rope_theta": 100000.0},
                "sliding_attention": {"rope_type": "default", "rope_theta": 10000.0},
            },
        )
        kw.setdefault("final_logit_softcapping", 5.0)  # logits reach ~5: the cap bites
        kw.setdefault("architectures", ["Gemma3ForCausalLM"])
        return tf.Gemma3TextConfig(**kw)
    raise ValueError(arch)


def build_tiny_model(
    arch: str, root: Path, dtype: torch.dtype = torch.float32, seed: int = 0, **overrides: Any
) -> Path:
    """Write a random ``arch`` model with the shared test tokenizer to ``root/<arch>``; returns the dir."""
    import transformers as tf

    out = root / f"{arch}-{str(dtype).split('.')[-1]}-{seed}"
    if (out / "config.json").is_file():
        return out
    tok_dir = build_tokenizer_dir(root / "tokenizer")
    vocab = json.loads((tok_dir / "tokenizer.json").read_text())
    vocab_size = len(vocab["model"]["vocab"]) + sum(
        1 for t in vocab["added_tokens"] if t["content"] not in vocab["model"]["vocab"]
    )
    gen_cfg = json.loads((tok_dir / "generation_config.json").read_text())
    eos = gen_cfg["eos_token_id"]
    torch.manual_seed(seed)
    cfg = _config(arch, vocab_size, eos, **overrides)
    model = tf.AutoModelForCausalLM.from_config(cfg, dtype=dtype)
    with torch.no_grad():  # larger weights than the default init so that outputs vary by token
        for name, p in model.named_parameters():
            if "norm" not in name:
                p.normal_(0.0, 0.08)
            else:
                p.uniform_(0.8, 1.2)  # Gemma's (1 + w) norms then scale by ~2: its outputs vary more so
    model.save_pretrained(out, safe_serialization=True)
    for f in tok_dir.iterdir():
        if f.name != "generation_config.json" or not (out / f.name).exists():
            shutil.copy(f, out / f.name)
    return out


def hf_greedy(
    model_dir: Path, prompts: list[list[int]], max_new_tokens: int
) -> list[tuple[list[int], list[float]]]:
    """transformers' greedy continuation of each prompt and the chosen tokens' logprobs (no EOS stop)."""
    import transformers as tf

    model = tf.AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32)
    model.eval()
    return [greedy_continuation(model, ids, max_new_tokens) for ids in prompts]


def greedy_continuation(model: Any, ids: list[int], n: int) -> tuple[list[int], list[float]]:
    """A loaded transformers model's greedy continuation of ``ids`` (past any EOS), with the chosen
    tokens' logprobs; on the model's device."""
    dev = next(model.parameters()).device
    toks: list[int] = []
    lps: list[float] = []
    past = None
    inp = torch.tensor([ids], device=dev)
    with torch.no_grad():
        for _ in range(n):
            out = model(input_ids=inp, past_key_values=past, use_cache=True)
            past = out.past_key_values
            logp = torch.log_softmax(out.logits[0, -1].float(), -1)
            t = int(logp.argmax())
            toks.append(t)
            lps.append(float(logp[t]))
            inp = torch.tensor([[t]], device=dev)
    return toks, lps
