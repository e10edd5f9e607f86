"""EngineCore: the one step loop that both the real engine and the simulator run.

schedule -> executor.launch -> (overlapped host work) -> result -> append each sampled token (a speculative
row: its accepted drafts and the token after them) -> scheduler.update -> end the sequences a token alone
ends (stop token, EOS, length), as vLLM's ``check_stop`` does inside its core. Text-level work
(detokenize, stop strings, outputs) happens outside, after a step: the LLMEngine does it, the simulator
has none. Because both drive this class with the same Scheduler and BlockManager, a simulated run takes
the same batches and ends each sequence at the same token as the real engine does for the same tokens.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass, field

from glassbox.engine.bursts import BurstSizer
from glassbox.engine.executor import Executor
from glassbox.engine.scheduler import ScheduledSeq, Scheduler, SchedulerOutput
from glassbox.engine.sequence import Sequence
from glassbox.outputs import SampleResult

# How a token alone ends a sequence: ("stop", the stop token id, or None for EOS) | ("length", None)
TokenEnd = tuple[str, int | None]


@dataclass
class Appended:
    """A token the step appended to its sequence."""

    seq: Sequence
    token: int
    num_output_tokens: int  # the sequence's count with this token
    ended: TokenEnd | None


@dataclass
class CoreStep:
    """What one step did."""

    index: int  # steps run before this one
    batch: SchedulerOutput
    appended: list[Appended]
    launched: float  # clock when the batch was launched
    done: float  # clock when its sampled tokens were read
    verified: list[tuple[int, int]] = field(default_factory=list)  # speculative rows: (drafts, accepted)


@dataclass(frozen=True)
class StepTrace:
    """One step as a comparable record: who ran how many tokens, and who ended on which token."""

    batch: tuple[tuple[str, int, int, int], ...]  # (request id, seq index, start, new tokens)
    ended: tuple[tuple[str, int, str, int | None, int], ...]  # (request id, index, reason, stop, out tokens)


def check_stop(seq: Sequence, token: int, eos_token_ids: set[int], max_model_len: int) -> TokenEnd | None:
    """Whether ``token`` (already appended) ends ``seq``: a stop token or EOS once ``min_tokens`` are out,
    else ``max_tokens`` or the model length reached."""
    sp = seq.sampling_params
    n_out = seq.num_output_tokens
    if n_out >= sp.min_tokens:
        if token in sp.stop_token_ids:
            return ("stop", token)
        if not sp.ignore_eos and token in eos_token_ids:
            return ("stop", None)
    assert sp.max_tokens is not None, "requests get their max_tokens when they are checked"
    if n_out >= sp.max_tokens or len(seq) >= max_model_len:
        return ("length", None)
    return None


class EngineCore:
    """Drives a Scheduler and an Executor one step at a time. Not thread-safe."""

    def __init__(
        self,
        scheduler: Scheduler,
        executor: Executor,
        max_model_len: int,
        eos_token_ids: set[int],
        clock: Callable[[], float] = time.perf_counter,
    ) -> None:
        self.scheduler = scheduler
        self.executor = executor
        self.max_model_len = max_model_len
        self.eos_token_ids = eos_token_ids
        self.clock = clock
        self.num_steps = 0
        self.trace: list[StepTrace] | None = None  # set to [] to record every step
        self.listeners: list[Callable[[CoreStep], None]] = []  # called with every step (the dashboard)
        self.bursts: BurstSizer | None = None  # greedy decode bursts, where the executor runs them

    def add(self, seq: Sequence) -> None:
        self.scheduler.add(seq)

    def finish(self, seq: Sequence) -> None:
        """Take a sequence off the scheduler and free its blocks (a stop string, an abort)."""
        if not seq.is_finished:
            self.scheduler.finish(seq)

    @property
    def has_unfinished(self) -> bool:
        return self.scheduler.num_unfinished > 0

    def step(self, overlap: Callable[[], None] | None = None) -> CoreStep | None:
        """Run one step; None when nothing could be scheduled. ``overlap`` runs between launch and result
        (while a GPU computes); a sequence it finishes gets no token from this step."""
        if self.bursts is not None:
            self.scheduler.burst = self.bursts.lookahead()
        batch = self.scheduler.schedule()
        if batch.empty:
            return None
        launched = self.clock()
        pending = self.executor.launch(batch)
        if overlap is not None:
            overlap()
        results = pending.result()
        done = self.clock()
        if self.bursts is not None and batch.num_prefill_tokens == 0:
            self.bursts.observe(done - launched, 1 + batch.scheduled[0].lookahead)
        appended: list[Appended] = []
        verified: list[tuple[int, int]] = []
        for s in batch.scheduled:
            res = results.get(s.seq.seq_id)
            if res is not None and not s.seq.is_finished:
                if s.draft_tokens:
                    verified.append((len(s.draft_tokens), len(res.accepted)))
                self._append(s, res, done, appended)
        # after the appends: a speculative row's computed count depends on how many drafts were accepted
        self.scheduler.update(batch)
        for a in appended:
            if a.ended is not None:
                self.scheduler.finish(a.seq)  # its blocks are free for the next step
        step = CoreStep(self.num_steps, batch, appended, launched, done, verified)
        self.num_steps += 1
        if self.trace is not None:
            self.trace.append(_trace(step))
        for listener in self.listeners:
            listener(step)
        return step

    def _append(self, s: ScheduledSeq, res: SampleResult, now: float, out: list[Appended]) -> None:
        """Append the step's tokens for one row (a speculative row: its accepted drafts, then the token
        drawn after them) until one ends the sequence; count the drafts in its metrics."""
        seq = s.seq
        m = seq.metrics
        if s.draft_tokens:
            m.spec_drafts += 1
            m.spec_draft_tokens += len(s.draft_tokens)
            m.spec_accepted_tokens += len(res.accepted)
        if m.first_token_time is None:
            m.first_token_time = now
        for r in (*res.accepted, res) if res.accepted else (res,):
            seq.append_token(r.token_id)
            m.last_token_time = now
            m.token_times.append(now)
            if seq.logprobs is not None and r.logprobs is not None:
                seq.logprobs.append(r.logprobs)
            ended = check_stop(seq, r.token_id, self.eos_token_ids, self.max_model_len)
            out.append(Appended(seq, r.token_id, seq.num_output_tokens, ended))
            if ended is not None:
                return


def _trace(step: CoreStep) -> StepTrace:
    batch = tuple((s.seq.request_id, s.seq.index, s.start, s.num_new_tokens) for s in step.batch.scheduled)
    ended = tuple(
        (a.seq.request_id, a.seq.index, a.ended[0], a.ended[1], a.num_output_tokens)
        for a in step.appended
        if a.ended is not None
    )
    return StepTrace(batch, ended)
