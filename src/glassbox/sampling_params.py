"""SamplingParams: how one request picks its tokens (OpenAI / vLLM names; temperature=0 is greedy)."""

from __future__ import annotations

import math
from dataclasses import dataclass, field

from glassbox.structured_outputs import StructuredOutputs

MAX_LOGPROBS = 20
MAX_LOGIT_BIAS = 100.0  # OpenAI's range: a bias in [-100, 100] per token
INT64_MIN, INT64_MAX = -(2**63), 2**63 - 1


@dataclass
class SamplingParams:
    """Per-request sampling and stopping settings, validated on construction.

    Invalid values raise ``ValueError`` naming the parameter and its allowed range.
    """

    n: int = 1
    temperature: float = 1.0
    top_p: float = 1.0
    top_k: int = -1  # -1 or 0: off
    min_p: float = 0.0
    repetition_penalty: float = 1.0
    presence_penalty: float = 0.0
    frequency_penalty: float = 0.0
    seed: int | None = None
    max_tokens: int | None = 16  # None: up to max_model_len
    min_tokens: int = 0
    stop: list[str] = field(default_factory=list)
    stop_token_ids: list[int] = field(default_factory=list)
    include_stop_str_in_output: bool = False
    ignore_eos: bool = False
    logprobs: int | None = None  # number of top logprobs besides the chosen token
    # vLLM's: each prompt token's logprob given the tokens before it, with this many top logprobs besides
    # (RequestOutput.prompt_logprobs; the first token has None); such a request skips the prefix cache
    prompt_logprobs: int | None = None
    skip_special_tokens: bool = True
    structured_outputs: StructuredOutputs | None = None  # a JSON schema, regex, choice or grammar to follow
    # added to the token's logit before temperature, top-k/top-p/min-p and greedy's argmax (after penalties)
    logit_bias: dict[int, float] | None = None

    def __post_init__(self) -> None:
        if isinstance(self.stop, str):
            self.stop = [self.stop]
        self.stop = list(self.stop or [])
        self.stop_token_ids = list(self.stop_token_ids or [])
        if not isinstance(self.n, int) or self.n < 1:
            raise ValueError(f"n must be an integer >= 1, got {self.n!r}")
        if not 0 <= self.temperature <= 100:  # also rejects NaN
            raise ValueError(f"temperature must be in [0, 100], got {self.temperature}")
        if not 0.0 < self.top_p <= 1.0:  # also rejects NaN
            raise ValueError(f"top_p must be in (0, 1], got {self.top_p}")
        if self.top_k is None:
            self.top_k = -1
        if self.top_k < -1:
            raise ValueError(f"top_k must be -1 (off), 0 (off) or >= 1, got {self.top_k}")
        if not 0.0 <= self.min_p <= 1.0:
            raise ValueError(f"min_p must be in [0, 1], got {self.min_p}")
        if not 0.01 <= self.repetition_penalty <= 100:
            raise ValueError(f"repetition_penalty must be in [0.01, 100], got {self.repetition_penalty}")
        if not -2.0 <= self.presence_penalty <= 2.0:
            raise ValueError(f"presence_penalty must be in [-2, 2], got {self.presence_penalty}")
        if not -2.0 <= self.frequency_penalty <= 2.0:
            raise ValueError(f"frequency_penalty must be in [-2, 2], got {self.frequency_penalty}")
        if self.max_tokens is not None and (not isinstance(self.max_tokens, int) or self.max_tokens < 1):
            raise ValueError(f"max_tokens must be an integer >= 1, got {self.max_tokens!r}")
        if self.min_tokens < 0:
            raise ValueError(f"min_tokens must be >= 0, got {self.min_tokens}")
        if self.max_tokens is not None and self.min_tokens > self.max_tokens:
            raise ValueError(f"min_tokens ({self.min_tokens}) must be <= max_tokens ({self.max_tokens})")
        if self.logprobs is not None and not 0 <= self.logprobs <= MAX_LOGPROBS:
            raise ValueError(f"logprobs must be in [0, {MAX_LOGPROBS}], got {self.logprobs}")
        if self.prompt_logprobs is not None and not 0 <= self.prompt_logprobs <= MAX_LOGPROBS:
            raise ValueError(f"prompt_logprobs must be in [0, {MAX_LOGPROBS}], got {self.prompt_logprobs}")
        if any(not isinstance(s, str) or s == "" for s in self.stop):
            raise ValueError("stop must be a list of non-empty strings")
        if any(not isinstance(t, int) or t < 0 for t in self.stop_token_ids):
            raise ValueError("stop_token_ids must be non-negative integers")
        if self.structured_outputs is not None:
            if not isinstance(self.structured_outputs, StructuredOutputs):
                raise ValueError("structured_outputs must be a StructuredOutputs")
            if self.min_tokens > 0:  # the grammar decides where the text ends
                raise ValueError("min_tokens cannot be combined with structured outputs (a grammar)")
        if self.seed is not None and (
            not isinstance(self.seed, int) or not INT64_MIN <= self.seed <= INT64_MAX
        ):
            raise ValueError(f"seed must be an integer in [-2^63, 2^63 - 1], got {self.seed!r}")
        self.logit_bias = dict(self.logit_bias) if self.logit_bias else None
        for token, bias in (self.logit_bias or {}).items():
            if not isinstance(token, int) or isinstance(token, bool) or token < 0:
                raise ValueError(f"logit_bias keys must be token ids (integers >= 0), got {token!r}")
            if not (isinstance(bias, (int, float)) and math.isfinite(bias) and abs(bias) <= MAX_LOGIT_BIAS):
                raise ValueError(
                    f"logit_bias values must be in [-{MAX_LOGIT_BIAS:g}, {MAX_LOGIT_BIAS:g}], got {bias!r} "
                    f"for token {token}"
                )

    @property
    def greedy(self) -> bool:
        return self.temperature < 1e-5 or self.top_k == 1
