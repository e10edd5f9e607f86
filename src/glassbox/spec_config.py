"""``--speculative-config``: vLLM's JSON spelling, validated once (torch-free: the planner reads it too).

Two proposers: n-gram (prompt lookup), ``{"method": "ngram", "num_speculative_tokens": k,
"prompt_lookup_min": a, "prompt_lookup_max": b}``, and a draft model sharing the target's tokenizer,
``{"model": DIR, "num_speculative_tokens": k}`` ("method": "draft_model" optional; engine/draft_model.py).
A third, ``{"method": "mtp", "num_speculative_tokens": k}``, runs the target checkpoint's own
multi-token-prediction layers (Qwen3-Next / Qwen3.5; engine/mtp_proposer.py). EAGLE, Medusa and
DeepSeek's MTP are refused with that reason.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

METHODS = ("ngram", "draft_model", "mtp")
NOT_YET = ("eagle", "eagle3", "medusa", "mlp_speculator", "deepseek_mtp")
DEFAULT_LOOKUP = 5  # vLLM's default for both bounds when neither is given
MAX_SPECULATIVE_TOKENS = 32
_KEYS = {"method", "model", "num_speculative_tokens", "prompt_lookup_min", "prompt_lookup_max"}


@dataclass(frozen=True)
class SpeculativeConfig:
    """A validated speculative decoding setup: up to ``num_speculative_tokens`` drafts per step, from
    n-gram lookup (``prompt_lookup_*``), from a draft model (``model``: a directory or .gguf file) or from
    the target's own MTP layers ("mtp")."""

    method: str
    num_speculative_tokens: int
    prompt_lookup_min: int = 0
    prompt_lookup_max: int = 0
    model: str | None = None

    def to_dict(self) -> dict[str, Any]:
        if self.method == "mtp":
            return {"method": self.method, "num_speculative_tokens": self.num_speculative_tokens}
        if self.method == "draft_model":
            return {
                "method": self.method,
                "model": self.model,
                "num_speculative_tokens": self.num_speculative_tokens,
            }
        return {
            "method": self.method,
            "num_speculative_tokens": self.num_speculative_tokens,
            "prompt_lookup_min": self.prompt_lookup_min,
            "prompt_lookup_max": self.prompt_lookup_max,
        }


def _positive_int(raw: dict[str, Any], key: str) -> int | None:
    value = raw.get(key)
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise ValueError(f"--speculative-config: {key} must be an integer >= 1, got {value!r}")
    return value


def parse_speculative_config(
    value: SpeculativeConfig | dict[str, Any] | str | None,
) -> SpeculativeConfig | None:
    """``--speculative-config`` as JSON text or a dict (vLLM's keys); None or ``{}``: no speculation.
    Raises ValueError naming what is wrong."""
    if value is None or isinstance(value, SpeculativeConfig):
        return value
    raw: Any = value
    if isinstance(value, str):
        try:
            raw = json.loads(value) if value.strip() else {}
        except json.JSONDecodeError as e:
            raise ValueError(f"--speculative-config must be a JSON object: {e}") from None
    if not isinstance(raw, dict):
        raise ValueError(f"--speculative-config must be a JSON object, got {type(raw).__name__}")
    if not raw:
        return None
    unknown = sorted(set(raw) - _KEYS)
    if unknown:
        raise ValueError(
            f"--speculative-config: unknown key(s) {', '.join(unknown)} (known: {sorted(_KEYS)})"
        )
    method = raw.get("method")
    model = raw.get("model")
    if method is None and model in ("ngram", "[ngram]"):  # vLLM's older spelling
        method = "ngram"
    if method == "[ngram]":
        method = "ngram"
    if method is None and model is not None:
        method = "draft_model"
    if method in NOT_YET:
        raise ValueError(
            f"--speculative-config: method {method!r} is not supported yet (supported: ngram, draft_model, mtp)"
        )
    if method not in METHODS:
        raise ValueError(f"--speculative-config: method must be one of {METHODS}, got {method!r}")
    if method == "ngram" and model is not None and model not in ("ngram", "[ngram]"):
        raise ValueError("--speculative-config: the ngram method takes no model")
    k = _positive_int(raw, "num_speculative_tokens")
    if k is None:
        raise ValueError("--speculative-config: num_speculative_tokens is required")
    if k > MAX_SPECULATIVE_TOKENS:
        raise ValueError(
            f"--speculative-config: num_speculative_tokens must be <= {MAX_SPECULATIVE_TOKENS}, got {k}"
        )
    if method == "mtp":
        extra = sorted(set(raw) & {"model", "prompt_lookup_min", "prompt_lookup_max"})
        if extra:
            raise ValueError(
                f"--speculative-config: the mtp method runs the target's own MTP layers and takes no "
                f"{', '.join(extra)}"
            )
        return SpeculativeConfig("mtp", k)
    if method == "draft_model":
        if not isinstance(model, str) or not model:
            raise ValueError(
                "--speculative-config: the draft_model method needs a model (a directory or .gguf file)"
            )
        lookup = sorted(set(raw) & {"prompt_lookup_min", "prompt_lookup_max"})
        if lookup:
            raise ValueError(
                f"--speculative-config: {', '.join(lookup)} belong to the ngram method, not draft_model"
            )
        return SpeculativeConfig("draft_model", k, model=model)
    lo, hi = _positive_int(raw, "prompt_lookup_min"), _positive_int(raw, "prompt_lookup_max")
    if lo is None and hi is None:
        lo = hi = DEFAULT_LOOKUP
    lo = hi if lo is None else lo
    hi = lo if hi is None else hi
    assert lo is not None and hi is not None
    if lo > hi:
        raise ValueError(f"--speculative-config: prompt_lookup_min={lo} must be <= prompt_lookup_max={hi}")
    return SpeculativeConfig("ngram", k, lo, hi)
