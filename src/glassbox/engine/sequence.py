"""One request's sequence: its tokens, state, block table and RequestMetrics (the anatomy: glassbox/anatomy.py)."""

from __future__ import annotations

import enum
import time
from typing import TYPE_CHECKING

from glassbox.anatomy import RequestMetrics

if TYPE_CHECKING:
    import torch

    from glassbox.engine.structured import GrammarState
    from glassbox.sampling_params import SamplingParams


class SequenceStatus(enum.Enum):
    WAITING = "waiting"
    RUNNING = "running"
    FINISHED = "finished"


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
