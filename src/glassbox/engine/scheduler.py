"""Scheduling policy: continuous batching, chunked prefill, prefix-cache-aware admission, preemption."""

from __future__ import annotations

import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Protocol

from glassbox.engine.block_manager import BlockManager
from glassbox.engine.sequence import Sequence, SequenceStatus


@dataclass
class ScheduledSeq:
    """One sequence's share of a step, frozen when scheduled."""

    seq: Sequence
    start: int  # seq.num_computed_tokens when scheduled
    num_new_tokens: int  # tokens computed this step: positions [start, start + num_new_tokens)
    samples: bool  # this step reaches the end of the sequence and so produces its next token
    is_decode: bool  # one token after a sampled one (and its drafts), not part of a prompt or recomputation
    # speculative decoding: proposed tokens after the sequence's last one, verified in this step (their
    # positions [len(seq), len(seq) + k) are computed too: num_new_tokens == 1 + k)
    draft_tokens: list[int] = field(default_factory=list)
    # greedy decode bursts: tokens picked after this step's first, in the same step (each picked from the one
    # before it), so positions [start, start + 1 + lookahead) get their K/V; the same for every row of a step
    lookahead: int = 0

    @classmethod
    def of(cls, seq: Sequence, n: int, drafts: list[int] | None = None) -> ScheduledSeq:
        start = seq.num_computed_tokens
        end = start + n
        k = len(drafts) if drafts else 0
        total = len(seq) + k
        decode = n == 1 + k and end == total and seq.num_output_tokens > 0
        return cls(seq, start, n, end == total, decode, list(drafts) if drafts else [])

    def tokens(self) -> list[int]:
        """The token ids this step computes: the sequence's, then any drafts."""
        ids = self.seq.token_ids[self.start : self.start + self.num_new_tokens]
        return ids + self.draft_tokens if self.draft_tokens else ids


def burstable(seq: Sequence) -> bool:
    """Whether a sequence's next tokens may be picked several in one step (a greedy decode burst): greedy,
    and nothing between its logits and its pick that a burst does not run (logprobs, penalties, logit_bias,
    a grammar, stop tokens held back by min_tokens)."""
    sp = seq.sampling_params
    return (
        sp.greedy
        and sp.logprobs is None
        and seq.grammar is None
        and not sp.logit_bias
        and sp.repetition_penalty == 1.0
        and sp.presence_penalty == 0.0
        and sp.frequency_penalty == 0.0
        and seq.num_output_tokens >= sp.min_tokens
    )


class Proposer(Protocol):
    """Speculative decoding's draft source (engine/ngram.py, engine/draft_model.py; the simulator's)."""

    def propose_batch(self, asks: list[tuple[Sequence, int]]) -> list[list[int]]:
        """For each (sequence, max_drafts): at most max_drafts tokens guessed to follow the sequence's last
        one ([] for none), each list a prefix of what a larger max_drafts would give (the scheduler may
        cut it further). One call per step, so that a draft model runs all its sequences together."""
        ...

    def release(self, seq: Sequence) -> None:
        """Forget ``seq`` (finished, aborted or preempted): a draft model frees its blocks."""
        ...


@dataclass
class SchedulerOutput:
    scheduled: list[ScheduledSeq] = field(default_factory=list)
    preempted: list[Sequence] = field(default_factory=list)
    # hybrid models' state checkpoints (engine/state_checkpoints.py): (src, dst) rows of every state cache
    # that the step copies before it computes, the saves then the restores
    state_saves: list[tuple[int, int]] = field(default_factory=list)
    state_restores: list[tuple[int, int]] = field(default_factory=list)
    # speculative decoding of hybrid models: (scratch row, slot) copies of accepted drafts' states, run
    # before the saves (engine/spec_states.py)
    state_commits: list[tuple[int, int]] = field(default_factory=list)

    @property
    def num_prefill_tokens(self) -> int:
        return sum(s.num_new_tokens for s in self.scheduled if not s.is_decode)

    @property
    def num_decode_tokens(self) -> int:
        """Decode rows: one per decoding sequence, plus the drafts a speculative step verifies."""
        return sum(s.num_new_tokens for s in self.scheduled if s.is_decode)

    @property
    def passes(self) -> int:
        """Forward passes the step runs: 1, or a greedy decode burst's 1 + lookahead."""
        return 1 + self.scheduled[0].lookahead if self.scheduled else 1

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

    With a ``proposer`` (speculative decoding), a decoding sequence also computes the drafts it proposes,
    as far as the token budget and its ``max_tokens`` allow, in slots it holds or in free blocks that no
    later running sequence may need in this step: drafts never preempt anyone.
    """

    block_manager: BlockManager
    max_num_seqs: int
    max_num_batched_tokens: int
    waiting: deque[Sequence] = field(default_factory=deque)
    running: list[Sequence] = field(default_factory=list)
    num_preemptions: int = 0
    clock: Callable[[], float] = time.perf_counter  # the simulator swaps in a virtual clock
    proposer: Proposer | None = None
    # greedy decode bursts (engine/bursts.py sets them): the lookahead a step may give, and the most rows
    # the executor runs a burst for (0: never)
    burst: int = 0
    burst_rows: int = 0

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
        reserve = self._later_needs() if self.proposer is not None else []
        proposed = self._propose()
        i = 0
        while i < len(self.running) and budget > 0:
            seq = self.running[i]
            n = bm.chunk_end(seq, seq.num_computed_tokens, min(len(seq) - seq.num_computed_tokens, budget))
            drafts = proposed.get(seq.seq_id, [])[: max(0, budget - 1)]
            if drafts:  # only into slots it holds or blocks no later running sequence may need this step
                spare = max(0, bm.num_free_blocks - reserve[i + 1])
                room = (len(seq.block_table) + spare) * bm.block_size - seq.num_computed_tokens - 1
                drafts = drafts[: max(0, room)]
                n = 1 + len(drafts) if drafts else n
            while not bm.can_grow(seq, seq.num_computed_tokens + n):
                victim = self.running[-1]
                self._preempt(victim, out)
                if victim is seq:
                    break
            else:
                bm.grow(seq, seq.num_computed_tokens + n)
                out.scheduled.append(ScheduledSeq.of(seq, n, drafts))
                budget -= n
                i += 1
                continue
            break  # seq itself was preempted: it was the newest, nothing after it remains
        if out.preempted:
            return self._with_copies(out)
        while self.waiting and budget > 0 and len(self.running) < self.max_num_seqs:
            seq = self.waiting[0]
            assert not seq.block_table, "a waiting sequence holds no blocks"
            hit = bm.prefix_hit_tokens(seq)
            n = bm.chunk_end(seq, hit, min(len(seq) - hit, budget))
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
        if self.burst and not self.waiting:
            self._lookahead(out.scheduled)
        return self._with_copies(out)

    def _with_copies(self, out: SchedulerOutput) -> SchedulerOutput:
        """A step that runs takes the state copies due before it (none for an empty step: they wait)."""
        if out.scheduled:
            out.state_saves, out.state_restores = self.block_manager.take_state_copies()
            out.state_commits = self.block_manager.take_state_commits()
        return out

    def _lookahead(self, rows: list[ScheduledSeq]) -> None:
        """Give a decode-only step of burstable rows ``self.burst`` more tokens each (fewer where a row's
        max_tokens or the free blocks leave less; none if a row cannot take one), their slots allocated
        now. A burst never preempts, and runs only when no request waits (it would wait for the burst)."""
        if not rows or len(rows) > self.burst_rows:
            return
        if not all(s.is_decode and not s.draft_tokens and burstable(s.seq) for s in rows):
            return
        k = self.burst
        for s in rows:
            max_tokens = s.seq.sampling_params.max_tokens
            if max_tokens is not None:
                k = min(k, max_tokens - s.seq.num_output_tokens - 1)
        bm = self.block_manager
        while k > 0:
            need = sum(max(0, bm.blocks_needed(s.start + 1 + k) - len(s.seq.block_table)) for s in rows)
            if need <= bm.num_free_blocks:
                break
            k -= 1
        if k <= 0:
            return
        for s in rows:
            bm.grow(s.seq, s.start + 1 + k)
            s.lookahead = k

    def _later_needs(self) -> list[int]:
        """For each position i of ``running``: the blocks the sequences after it may grow by this step, at
        most (their whole remaining tokens within a full budget); 0 past the end."""
        bm = self.block_manager
        suffix = [0] * (len(self.running) + 1)
        for j in range(len(self.running) - 1, -1, -1):
            s = self.running[j]
            end = min(len(s), s.num_computed_tokens + self.max_num_batched_tokens)
            suffix[j] = suffix[j + 1] + max(0, bm.blocks_needed(end) - len(s.block_table))
        return suffix

    def _propose(self) -> dict[int, list[int]]:
        """The proposer's drafts for every decoding sequence (one token after its computed ones), asked in
        one call, each within the tokens its max_tokens leaves and a full budget (the loop in ``schedule``
        cuts them to the budget left and the blocks); none for a sequence under a grammar (structured
        outputs: its matcher would have to accept each draft in turn; not built)."""
        if self.proposer is None:
            return {}
        asks: list[tuple[Sequence, int]] = []
        for seq in self.running:
            if seq.grammar is not None or seq.num_output_tokens == 0:
                continue
            if seq.num_computed_tokens != len(seq) - 1:
                continue
            max_tokens = seq.sampling_params.max_tokens
            left = (max_tokens if max_tokens is not None else 1 << 30) - seq.num_output_tokens - 1
            limit = min(self.max_num_batched_tokens - 1, left)
            if limit > 0:
                asks.append((seq, limit))
        if not asks:
            return {}
        drafts = self.proposer.propose_batch(asks)
        return {seq.seq_id: d for (seq, _), d in zip(asks, drafts, strict=True)}

    def _preempt(self, seq: Sequence, out: SchedulerOutput) -> None:
        """Recompute-style preemption: drop the KV, requeue at the front of the waiting queue."""
        self.running.remove(seq)
        self.block_manager.free_seq(seq)
        if self.proposer is not None:
            self.proposer.release(seq)
        seq.num_computed_tokens = 0
        seq.status = SequenceStatus.WAITING
        seq.metrics.preemptions += 1
        self.num_preemptions += 1
        self.waiting.appendleft(seq)
        out.preempted.append(seq)

    def update(self, out: SchedulerOutput) -> None:
        """After the executor ran ``out`` and its tokens were appended: advance computed counts, publish
        full blocks. A speculative row's KV holds its last token and the accepted drafts (now appended);
        the rejected drafts' slots are given back (blocks past the sequence's length, BlockManager.trim)."""
        for s in out.scheduled:
            if s.seq.is_finished:  # ended (a stop string, an abort) while the step ran
                continue
            if s.draft_tokens or s.lookahead:
                # its KV is valid up to the last accepted draft (a burst: the last token it used as input):
                # everything but the newest token
                s.seq.num_computed_tokens = min(s.start + s.num_new_tokens + s.lookahead, len(s.seq) - 1)
                self.block_manager.trim(s.seq, len(s.seq))
            else:
                s.seq.num_computed_tokens += s.num_new_tokens
            self.block_manager.commit(s.seq)
            if s.draft_tokens:  # a hybrid model's state: the one after the last accepted draft
                self.block_manager.keep_state(s.seq, s.start, s.num_new_tokens)

    def finish(self, seq: Sequence) -> None:
        """Remove a finished or aborted sequence from the queues and free its blocks."""
        if seq in self.running:
            self.running.remove(seq)
        elif seq in self.waiting:
            self.waiting.remove(seq)
        self.block_manager.free_seq(seq)
        if self.proposer is not None:
            self.proposer.release(seq)
        seq.status = SequenceStatus.FINISHED
