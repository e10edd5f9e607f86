"""One request's sequence: its tokens, state, block table and RequestMetrics (the anatomy)."""

from __future__ import annotations

import enum
import time
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    import torch

    from glassbox.sampling_params import SamplingParams


class SequenceStatus(enum.Enum):
    WAITING = "waiting"
    RUNNING = "running"
    FINISHED = "finished"


@dataclass
class RequestMetrics:
    """The anatomy of one request, from real timestamps (seconds)."""

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
    # raw timestamps (time.perf_counter), kept for derived figures
    arrival_time: float = 0.0
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
        decoded = max(0, self.output_tokens - 1)
        self.decode_tok_s = decoded / self.decode_s if self.decode_s > 0 and decoded > 0 else 0.0

    def as_dict(self) -> dict[str, float | int]:
        keys = (
            "tokenize_s queue_s prefill_s ttft_s decode_s detokenize_s e2e_s prompt_tokens "
            "cached_prompt_tokens output_tokens prefill_tok_s decode_tok_s preemptions"
        ).split()
        return {k: getattr(self, k) for k in keys}


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
        self.finish_reason: str | None = None
        self.stop_reason: int | str | None = None
        self.logprobs: list[dict[int, float]] | None = [] if sampling_params.logprobs is not None else None
        self.generator: torch.Generator | None = None
        now = time.perf_counter() if arrival_time is None else arrival_time
        self.metrics = RequestMetrics(arrival_time=now, prompt_tokens=len(prompt_token_ids))

    # -- sizes -------------------------------------------------------------
    def __len__(self) -> int:
        return len(self.token_ids)

    @property
    def num_prompt_tokens(self) -> int:
        return len(self.prompt_token_ids)

    @property
    def num_output_tokens(self) -> int:
        return len(self.token_ids) - len(self.prompt_token_ids)

    @property
    def output_token_ids(self) -> list[int]:
        return self.token_ids[len(self.prompt_token_ids) :]

    @property
    def is_finished(self) -> bool:
        return self.status == SequenceStatus.FINISHED

    @property
    def in_prefill(self) -> bool:
        """True while tokens other than the last sampled one still need their KV computed."""
        return self.num_computed_tokens < len(self.token_ids) - 1

    def append_token(self, token_id: int) -> None:
        self.token_ids.append(token_id)
