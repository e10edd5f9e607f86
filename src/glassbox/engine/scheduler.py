"""Scheduling policy: continuous batching, chunked prefill, prefix-cache-aware admission, preemption."""

from __future__ import annotations

import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field

from glassbox.engine.block_manager import BlockManager
from glassbox.engine.sequence import Sequence, SequenceStatus


@dataclass
class ScheduledSeq:
    """One sequence's share of a step, frozen when scheduled."""

    seq: Sequence
    start: int  # seq.num_computed_tokens when scheduled
    num_new_tokens: int  # tokens computed this step: positions [start, start + num_new_tokens)
    samples: bool  # this step reaches the end of the sequence and so produces its next token
    is_decode: bool  # one token after a sampled one (not part of a prompt or recomputation)

    @classmethod
    def of(cls, seq: Sequence, n: int) -> ScheduledSeq:
        start = seq.num_computed_tokens
        end = start + n
        return cls(seq, start, n, end == len(seq), n == 1 and end == len(seq) and seq.num_output_tokens > 0)


@dataclass
class SchedulerOutput:
    scheduled: list[ScheduledSeq] = field(default_factory=list)
    preempted: list[Sequence] = field(default_factory=list)

    @property
    def num_prefill_tokens(self) -> int:
        return sum(s.num_new_tokens for s in self.scheduled if not s.is_decode)

    @property
    def num_decode_tokens(self) -> int:
        return sum(1 for s in self.scheduled if s.is_decode)

    @property
    def phase(self) -> str:
        p, d = self.num_prefill_tokens, self.num_decode_tokens
        return "mixed" if p and d else ("prefill" if p else "decode")

    @property
    def empty(self) -> bool:
        return not self.scheduled


@dataclass
class Scheduler:
    """Decides which sequences run each step and how many tokens each computes.

    Running sequences go first in arrival order (decodes and unfinished prefill chunks alike), then
    waiting ones are admitted while the token budget, ``max_num_seqs`` and free blocks allow. When a
    running sequence cannot grow, the newest running sequence is preempted (blocks freed, recomputed
    later), and no new sequence is admitted in that step.
    """

    block_manager: BlockManager
    max_num_seqs: int
    max_num_batched_tokens: int
    waiting: deque[Sequence] = field(default_factory=deque)
    running: list[Sequence] = field(default_factory=list)
    num_preemptions: int = 0
    clock: Callable[[], float] = time.perf_counter  # the simulator swaps in a virtual clock

    def add(self, seq: Sequence) -> None:
        seq.status = SequenceStatus.WAITING
        self.waiting.append(seq)

    @property
    def num_unfinished(self) -> int:
        return len(self.waiting) + len(self.running)

    def schedule(self) -> SchedulerOutput:
        out = SchedulerOutput()
        bm = self.block_manager
        budget = self.max_num_batched_tokens
        i = 0
        while i < len(self.running) and budget > 0:
            seq = self.running[i]
            n = min(len(seq) - seq.num_computed_tokens, budget)
            while not bm.can_grow(seq, seq.num_computed_tokens + n):
                victim = self.running[-1]
                self._preempt(victim, out)
                if victim is seq:
                    break
            else:
                bm.grow(seq, seq.num_computed_tokens + n)
                out.scheduled.append(ScheduledSeq.of(seq, n))
                budget -= n
                i += 1
                continue
            break  # seq itself was preempted: it was the newest, nothing after it remains
        if out.preempted:
            return out
        while self.waiting and budget > 0 and len(self.running) < self.max_num_seqs:
            seq = self.waiting[0]
            assert not seq.block_table, "a waiting sequence holds no blocks"
            n = min(len(seq) - bm.prefix_hit_tokens(seq), budget)
            if not bm.can_allocate(seq, n):
                break
            bm.allocate(seq)  # takes the prefix-cache hits; num_computed_tokens = cached tokens
            bm.grow(seq, seq.num_computed_tokens + n)
            self.waiting.popleft()
            if seq.metrics.first_scheduled_time is None:
                seq.metrics.first_scheduled_time = self.clock()
                seq.num_cached_tokens = seq.num_computed_tokens
                seq.metrics.cached_prompt_tokens = seq.num_computed_tokens
            seq.status = SequenceStatus.RUNNING
            self.running.append(seq)
            out.scheduled.append(ScheduledSeq.of(seq, n))
            budget -= n
        return out

    def _preempt(self, seq: Sequence, out: SchedulerOutput) -> None:
        """Recompute-style preemption: drop the KV, requeue at the front of the waiting queue."""
        self.running.remove(seq)
        self.block_manager.free_seq(seq)
        seq.num_computed_tokens = 0
        seq.status = SequenceStatus.WAITING
        seq.metrics.preemptions += 1
        self.num_preemptions += 1
        self.waiting.appendleft(seq)
        out.preempted.append(seq)

    def update(self, out: SchedulerOutput) -> None:
        """After the executor ran ``out``: advance computed counts and publish full blocks."""
        for s in out.scheduled:
            if s.seq.is_finished:  # ended (a stop string, an abort) while the step ran
                continue
            s.seq.num_computed_tokens += s.num_new_tokens
            self.block_manager.commit(s.seq)

    def finish(self, seq: Sequence) -> None:
        """Remove a finished or aborted sequence from the queues and free its blocks."""
        if seq in self.running:
            self.running.remove(seq)
        elif seq in self.waiting:
            self.waiting.remove(seq)
        self.block_manager.free_seq(seq)
        seq.status = SequenceStatus.FINISHED
