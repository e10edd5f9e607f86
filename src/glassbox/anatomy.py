"""The request anatomy: ``RequestMetrics``, each request's tokenize / queue / prefill / TTFT / decode /
detokenize times and token counts, finalized once; the keys every response's ``metrics`` carries
(``METRIC_KEYS``); and one anatomy merged from several continuations. Torch-free, engine-free: the engine
fills it, outputs, the server, trace and bench read it."""

from __future__ import annotations

import time
from dataclasses import dataclass, field, fields


@dataclass
class RequestMetrics:
    """The anatomy of one request, from real timestamps (seconds); the simulator's are virtual.

    The fields before ``arrival_time`` are the reported ones (METRIC_KEYS: the server's ``metrics``
    object, Prometheus, the bench client); :meth:`finalize` derives them once, when the request ends.
    """

    tokenize_s: float = 0.0
    queue_s: float = 0.0
    prefill_s: float = 0.0
    ttft_s: float = 0.0
    decode_s: float = 0.0
    detokenize_s: float = 0.0
    e2e_s: float = 0.0
    prompt_tokens: int = 0
    cached_prompt_tokens: int = 0
    output_tokens: int = 0
    prefill_tok_s: float = 0.0
    decode_tok_s: float = 0.0
    preemptions: int = 0
    # speculative decoding: steps that verified drafts, drafts proposed, drafts accepted; the share
    # accepted, and the tokens a verifying step yields on average (1 + accepted / drafts, vLLM's "mean
    # acceptance length": the token drawn after the accepted drafts included); zeros without speculation
    spec_drafts: int = 0
    spec_draft_tokens: int = 0
    spec_accepted_tokens: int = 0
    spec_acceptance_rate: float = 0.0
    spec_mean_acceptance_length: float = 0.0
    # raw timestamps (time.perf_counter), kept for derived figures
    arrival_time: float = 0.0
    sequences: int = 1  # continuations these figures cover (a request with n > 1, a batch of prompts)
    first_scheduled_time: float | None = None
    first_token_time: float | None = None
    last_token_time: float | None = None
    finished_time: float | None = None
    token_times: list[float] = field(default_factory=list)

    def finalize(self) -> None:
        """Derive the summary figures from the timestamps."""
        end = self.finished_time if self.finished_time is not None else time.perf_counter()
        self.e2e_s = end - self.arrival_time + self.tokenize_s
        if self.first_scheduled_time is not None:
            self.queue_s = self.first_scheduled_time - self.arrival_time
        if self.first_token_time is not None:
            self.ttft_s = self.first_token_time - self.arrival_time + self.tokenize_s
            start = self.first_scheduled_time if self.first_scheduled_time is not None else self.arrival_time
            self.prefill_s = self.first_token_time - start
            self.decode_s = max(0.0, end - self.first_token_time)
        computed = self.prompt_tokens - self.cached_prompt_tokens
        self.prefill_tok_s = computed / self.prefill_s if self.prefill_s > 0 else 0.0
        decoded = max(0, self.output_tokens - self.sequences)  # each continuation's first token is prefill's
        self.decode_tok_s = decoded / self.decode_s if self.decode_s > 0 and decoded > 0 else 0.0
        if self.spec_draft_tokens:
            self.spec_acceptance_rate = self.spec_accepted_tokens / self.spec_draft_tokens
        if self.spec_drafts:
            self.spec_mean_acceptance_length = 1.0 + self.spec_accepted_tokens / self.spec_drafts

    def as_dict(self) -> dict[str, float | int]:
        return {k: getattr(self, k) for k in METRIC_KEYS}


_ALL_KEYS = [f.name for f in fields(RequestMetrics)]
METRIC_KEYS: tuple[str, ...] = tuple(_ALL_KEYS[: _ALL_KEYS.index("arrival_time")])


def merge_metrics(parts: list[RequestMetrics], shared_prompt: bool) -> RequestMetrics:
    """One anatomy for several continuations, finalized: a request with n > 1 (``shared_prompt``: they
    share one prompt and its prefill) or a batch of prompts (prompt tokens summed). Times run from the
    earliest arrival to the last finish; the first token counts when every part has its first."""
    first = parts[0]
    prompt = first.prompt_tokens if shared_prompt else sum(m.prompt_tokens for m in parts)
    cached = first.cached_prompt_tokens if shared_prompt else sum(m.cached_prompt_tokens for m in parts)
    scheduled = [m.first_scheduled_time for m in parts if m.first_scheduled_time is not None]
    first_tokens = [m.first_token_time for m in parts if m.first_token_time is not None]
    finished = [m.finished_time for m in parts if m.finished_time is not None]
    m = RequestMetrics(
        tokenize_s=max(m.tokenize_s for m in parts),
        detokenize_s=sum(m.detokenize_s for m in parts),
        prompt_tokens=prompt,
        cached_prompt_tokens=cached,
        output_tokens=sum(m.output_tokens for m in parts),
        preemptions=sum(m.preemptions for m in parts),
        spec_drafts=sum(m.spec_drafts for m in parts),
        spec_draft_tokens=sum(m.spec_draft_tokens for m in parts),
        spec_accepted_tokens=sum(m.spec_accepted_tokens for m in parts),
        arrival_time=min(m.arrival_time for m in parts),
        sequences=sum(m.sequences for m in parts),
        first_scheduled_time=min(scheduled) if scheduled else None,
        first_token_time=max(first_tokens) if len(first_tokens) == len(parts) else None,
        last_token_time=max((m.last_token_time or 0.0) for m in parts) or None,
        finished_time=max(finished) if len(finished) == len(parts) else None,
        token_times=list(first.token_times),
    )
    m.finalize()
    return m
