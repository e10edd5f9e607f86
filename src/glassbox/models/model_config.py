"""ModelConfig: the fields of a Hugging Face config.json that the model code needs."""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch

SUPPORTED_ARCHITECTURES = ("LlamaForCausalLM", "Qwen2ForCausalLM", "Qwen3ForCausalLM", "MistralForCausalLM")

TORCH_DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}


def dtype_name(dtype: torch.dtype) -> str:
    """The config-style name of a torch dtype ("bfloat16", ...)."""
    return next(name for name, d in TORCH_DTYPES.items() if d == dtype)


@dataclass
class ModelConfig:
    architecture: str
    model_type: str
    hidden_size: int
    num_layers: int
    num_heads: int
    num_kv_heads: int
    head_dim: int
    intermediate_size: int
    vocab_size: int
    rms_norm_eps: float
    max_position_embeddings: int
    tie_word_embeddings: bool
    attention_bias: bool
    qk_norm: bool
    hidden_act: str
    sliding_window: int | None
    torch_dtype: torch.dtype
    rope: dict[str, Any] = field(default_factory=dict)
    raw: dict[str, Any] = field(default_factory=dict)

    @classmethod
    def from_dict(cls, cfg: dict[str, Any]) -> ModelConfig:
        archs = cfg.get("architectures") or []
        arch = archs[0] if archs else ""
        if arch not in SUPPORTED_ARCHITECTURES:
            raise ValueError(
                f"architecture {arch or '(none)'!r} is not supported; supported: {', '.join(SUPPORTED_ARCHITECTURES)}"
            )
        from glassbox.layers.rotary import rope_parameters

        model_type = cfg.get("model_type", "")
        heads = int(cfg["num_attention_heads"])
        hidden = int(cfg["hidden_size"])
        window = cfg.get("sliding_window")
        if model_type in ("qwen2", "qwen3") and not cfg.get("use_sliding_window", False):
            window = None
        dtype_str = cfg.get("torch_dtype") or cfg.get("dtype") or "float32"
        return cls(
            architecture=arch,
            model_type=model_type,
            hidden_size=hidden,
            num_layers=int(cfg["num_hidden_layers"]),
            num_heads=heads,
            num_kv_heads=int(cfg.get("num_key_value_heads") or heads),
            head_dim=int(cfg.get("head_dim") or hidden // heads),
            intermediate_size=int(cfg["intermediate_size"]),
            vocab_size=int(cfg["vocab_size"]),
            rms_norm_eps=float(cfg.get("rms_norm_eps", 1e-6)),
            max_position_embeddings=int(cfg.get("max_position_embeddings", 2048)),
            tie_word_embeddings=bool(cfg.get("tie_word_embeddings", False)),
            attention_bias=bool(cfg.get("attention_bias", model_type == "qwen2")),
            qk_norm=arch == "Qwen3ForCausalLM",
            hidden_act=str(cfg.get("hidden_act", "silu")),
            sliding_window=int(window) if window else None,
            torch_dtype=TORCH_DTYPES.get(str(dtype_str), torch.float32),
            rope=rope_parameters(cfg),
            raw=cfg,
        )

    @classmethod
    def from_dir(cls, model_dir: str | Path) -> ModelConfig:
        path = Path(model_dir) / "config.json"
        if not path.is_file():
            raise FileNotFoundError(f"config.json not found in model directory {model_dir}")
        return cls.from_dict(json.loads(path.read_text()))

    @property
    def num_params(self) -> int:
        h, i, L = self.hidden_size, self.intermediate_size, self.num_layers
        attn = h * self.head_dim * (self.num_heads * 2 + self.num_kv_heads * 2)
        emb = self.vocab_size * h * (1 if self.tie_word_embeddings else 2)
        return L * (attn + 3 * h * i + 2 * h) + emb + h

    def kv_bytes_per_token(self, dtype: torch.dtype) -> int:
        return 2 * self.num_layers * self.num_kv_heads * self.head_dim * torch.finfo(dtype).bits // 8
