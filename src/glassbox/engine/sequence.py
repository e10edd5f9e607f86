"""One request's sequence: its tokens, state, block table and RequestMetrics (the anatomy)."""

from __future__ import annotations

import enum
import time
from dataclasses import dataclass, field, fields
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    import torch

    from glassbox.engine.structured import GrammarState
    from glassbox.sampling_params import SamplingParams


class SequenceStatus(enum.Enum):
    WAITING = "waiting"
    RUNNING = "running"
    FINISHED = "finished"


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


class Sequence:
    """One generated continuation of a prompt (a request with n > 1 owns n of these)."""

    def __init__(
        self,
        seq_id: int,
        request_id: str,
        prompt_token_ids: list[int],
        sampling_params: SamplingParams,
        index: int = 0,
        arrival_time: float | None = None,
        tokenize_s: float = 0.0,
    ) -> None:
        self.seq_id = seq_id
        self.request_id = request_id
        self.index = index  # position among the request's n outputs
        self.prompt_token_ids = list(prompt_token_ids)
        self.token_ids = list(prompt_token_ids)  # prompt + output
        self.sampling_params = sampling_params
        self.status = SequenceStatus.WAITING
        self.block_table: list[int] = []
        self.num_computed_tokens = 0  # tokens whose KV is in the cache
        self.num_cached_tokens = 0  # prompt tokens served by the prefix cache (first schedule)
        self.num_hashed_blocks = 0  # leading blocks of block_table registered in the prefix cache
        self.block_hashes: list[int] = []  # hash of each full block, in order
        self.state_slot: int | None = None  # hybrid models: its recurrent-state slot while it holds blocks
        self.finish_reason: str | None = None
        self.stop_reason: int | str | None = None
        self.logprobs: list[dict[int, float]] | None = [] if sampling_params.logprobs is not None else None
        # prompt logprobs (vLLM's): an entry per prompt token, None for the first; filled as the prefill
        # computes them (engine/prompt_logprobs.py), with each prompt token's rank in the vocabulary
        want = sampling_params.prompt_logprobs is not None
        self.prompt_logprobs: list[dict[int, float] | None] | None = [None] if want else None
        self.prompt_ranks: list[int | None] | None = [None] if want else None
        self.generator: torch.Generator | None = None
        self.grammar: GrammarState | None = None  # structured outputs: this sequence's matcher
        now = time.perf_counter() if arrival_time is None else arrival_time
        self.metrics = RequestMetrics(
            arrival_time=now, prompt_tokens=len(prompt_token_ids), tokenize_s=tokenize_s
        )

    # -- sizes -------------------------------------------------------------
    def __len__(self) -> int:
        return len(self.token_ids)

    @property
    def num_output_tokens(self) -> int:
        return len(self.token_ids) - len(self.prompt_token_ids)

    @property
    def output_token_ids(self) -> list[int]:
        return self.token_ids[len(self.prompt_token_ids) :]

    @property
    def needs_prompt_logprobs(self) -> bool:
        """Whether prompt positions still owe their logprobs: they must be computed (no prefix cache)."""
        return self.prompt_logprobs is not None and len(self.prompt_logprobs) < len(self.prompt_token_ids)

    @property
    def is_finished(self) -> bool:
        return self.status == SequenceStatus.FINISHED

    def append_token(self, token_id: int) -> None:
        self.token_ids.append(token_id)

    def drop_after(self, num_output_tokens: int) -> None:
        """Cut the tokens (and their logprobs and times) after the first ``num_output_tokens`` outputs."""
        end = len(self.prompt_token_ids) + num_output_tokens
        if len(self.token_ids) > end:
            del self.token_ids[end:]
            if self.logprobs is not None:
                del self.logprobs[num_output_tokens:]
            del self.metrics.token_times[num_output_tokens:]

    def finish(
        self, reason: str, stop_reason: int | str | None, now: float, detokenize_s: float = 0.0
    ) -> None:
        """Mark the sequence ended and finalize its metrics (once: later calls change nothing)."""
        if self.finish_reason is not None:
            return
        self.finish_reason = reason
        self.stop_reason = stop_reason
        m = self.metrics
        m.finished_time = now
        m.output_tokens = self.num_output_tokens
        m.detokenize_s = detokenize_s
        m.finalize()
