"""What the dashboard shows, recorded on the engine thread into bounded ring buffers.

:class:`DashboardRecorder` is an EngineObserver (``on_iteration`` after every loop turn, ``on_finished`` for
each request that ends) and an EngineCore listener (``on_step`` with every step's batch); all three run on
the engine thread (AsyncEngine's). The event loop reads it only through :meth:`delta`, which copies what
changed since a client's :class:`Cursor` out under the one lock the engine-thread writers hold too. No
engine object (Sequence, BlockManager) is touched off the engine thread.

Times are seconds since the recorder was made (``time.perf_counter`` - ``t0``), the clock every request's
``RequestMetrics`` uses, so a bar's edges are the same numbers as the request's ``metrics``.
"""

from __future__ import annotations

import threading
import time
from array import array
from collections import deque
from dataclasses import dataclass, field
from typing import Any

from glassbox.engine.core import CoreStep
from glassbox.engine.llm_engine import LLMEngine, StepRecord
from glassbox.engine.sequence import Sequence
from glassbox.outputs import RequestOutput

_SAMPLE_S = 0.2  # live requests' token counts and the prefix cache's free blocks: at most this often


@dataclass
class Cursor:
    """How far one client has read: the last step index, request version and ITL sample it has."""

    step: int = -1
    version: int = 0
    itl: int = 0
    fresh: bool = True  # nothing sent yet: the first delta replays ``history`` finished requests


@dataclass
class _Track:
    """One request on the timeline (its first sequence's schedule; n > 1 shares the prompt's)."""

    rid: str
    arrival: float  # when its tokenization started (the metrics' arrival_time - tokenize_s)
    tokenize_s: float
    prompt: int
    max_tokens: int
    n: int
    seq: Sequence | None = None  # engine thread only; dropped when it finishes
    state: str = "waiting"  # waiting | prefill | decode | finished
    scheduled: float | None = None
    first_token: float | None = None
    end: float | None = None
    cached: int = 0
    output: int = 0
    chunks: list[tuple[float, float, int, int, bool]] = field(
        default_factory=list
    )  # t0, t1, tokens, start, recompute
    preemptions: list[float] = field(default_factory=list)
    finish_reason: str | None = None
    metrics: dict[str, float | int] | None = None
    version: int = 0

    def to_json(self) -> dict[str, Any]:
        return {
            "id": self.rid,
            "state": self.state,
            "arrival": self.arrival,
            "tokenize_s": self.tokenize_s,
            "scheduled": self.scheduled,
            "first_token": self.first_token,
            "end": self.end,
            "prompt": self.prompt,
            "cached": self.cached,
            "output": self.output,
            "max_tokens": self.max_tokens,
            "n": self.n,
            "chunks": [list(c) for c in self.chunks],
            "preemptions": list(self.preemptions),
            "finish_reason": self.finish_reason,
            "metrics": self.metrics,
        }


class DashboardRecorder:
    """Ring buffers of the engine's steps, its live and finished requests and inter-token gaps."""

    def __init__(
        self,
        engine: LLMEngine,
        max_steps: int = 2048,
        max_finished: int = 1000,
        max_live: int = 2048,
        max_itl: int = 8192,
        max_step_batches: int = 512,
    ) -> None:
        self.t0 = time.perf_counter()
        self.num_blocks = engine.block_manager.num_blocks
        self._lock = threading.Lock()
        self._steps: deque[dict[str, Any]] = deque(maxlen=max_steps)
        # (step index, flat [new tokens, context before] per row): the roofline's input, fewer steps kept
        self._batches: deque[tuple[int, array[int]]] = deque(maxlen=max_step_batches)
        self._live: dict[str, _Track] = {}
        self._max_live = max_live
        self._finished: deque[_Track] = deque(maxlen=max_finished)
        self._itl: deque[float] = deque(maxlen=max_itl)
        self._num_itl = 0
        self._version = 0
        self.untracked = 0  # requests in the engine past max_live, not shown (sampled)
        # engine thread only
        self._pending: CoreStep | None = None
        self._sampled_at = 0.0
        self._kv_cached = 0
        engine.core.listeners.append(self.on_step)

    def now(self) -> float:
        return time.perf_counter() - self.t0

    def rel(self, t: float | None) -> float | None:
        return None if t is None else t - self.t0

    def _touch(self, t: _Track) -> None:
        self._version += 1
        t.version = self._version

    # -- engine thread --------------------------------------------------------------------------------
    def on_step(self, step: CoreStep) -> None:
        """EngineCore listener: prompt chunks, first tokens and preemptions of the batch that just ran."""
        self._pending = step
        t0, t1 = step.launched - self.t0, step.done - self.t0
        with self._lock:
            for seq in step.batch.preempted:
                t = self._live.get(seq.request_id)
                if t is not None and seq.index == 0:
                    t.preemptions.append(t0)
                    t.state = "waiting"
                    self._touch(t)
            for s in step.batch.scheduled:
                if s.is_decode or s.seq.index != 0:
                    continue  # decode rows change only the token count, sampled in on_iteration
                seq = s.seq
                t = self._live.get(seq.request_id)
                if t is None:
                    if seq.is_finished:
                        continue
                    t = self._track(seq)
                    if t is None:
                        continue
                recompute = t.first_token is not None or bool(t.preemptions)
                t.chunks.append((t0, t1, s.num_new_tokens, s.start, recompute))
                m = seq.metrics
                t.scheduled = self.rel(m.first_scheduled_time)
                t.cached = seq.num_cached_tokens
                if m.first_token_time is not None:
                    t.first_token = self.rel(m.first_token_time)
                    t.state = "decode"
                else:
                    t.state = "prefill"
                t.output = seq.num_output_tokens
                self._touch(t)

    def on_iteration(self, engine: LLMEngine, record: StepRecord | None) -> None:
        """EngineObserver: the step's record, new requests in the queue, token counts (sampled)."""
        now = time.perf_counter()
        sample = now - self._sampled_at >= _SAMPLE_S
        if sample:
            bm = engine.block_manager
            self._kv_cached = sum(1 for bid in bm.cached.values() if bm.blocks[bid].ref_count == 0)
            self._sampled_at = now
        with self._lock:
            self._add_new(engine)
            if sample:
                self.untracked = max(0, len(engine.requests) - len(self._live))
                for t in self._live.values():
                    if t.seq is not None and len(t.seq.token_ids) - t.prompt != t.output:
                        t.output = len(t.seq.token_ids) - t.prompt
                        self._touch(t)
            step, self._pending = self._pending, None
            if record is None or step is None:
                return
            bm = engine.block_manager
            free = bm.num_free_blocks
            self._steps.append(
                {
                    "i": step.index,
                    "t": record.start - self.t0,
                    "dur": record.duration_s,
                    "exec": record.execute_s,
                    "passes": record.passes,
                    "bs": record.batch_size,
                    "pf": record.num_prefill_tokens,
                    "dc": record.num_decode_tokens,
                    "phase": record.phase,
                    "used": bm.num_blocks - free,
                    "free": free,
                    "cached": min(self._kv_cached, free),
                    "preempted": len(step.batch.preempted),
                    "running": engine.num_running,
                    "waiting": engine.num_waiting,
                }
            )
            rows = step.batch.scheduled
            self._batches.append(
                (step.index, array("i", [x for s in rows for x in (s.num_new_tokens, s.start)]))
            )

    def _add_new(self, engine: LLMEngine) -> None:
        """Track the requests queued since the last call: the newest end of ``engine.requests`` (insertion
        ordered) back to the first one already tracked; none while ``max_live`` are (they wait their turn)."""
        if len(self._live) >= self._max_live:
            return
        for rid in reversed(engine.requests):
            if rid in self._live:
                break
            seqs = engine.get_sequences(rid)
            if seqs and not seqs[0].is_finished:
                self._track(seqs[0])

    def _track(self, seq: Sequence) -> _Track | None:
        if len(self._live) >= self._max_live:
            return None
        m, sp = seq.metrics, seq.sampling_params
        t = _Track(
            seq.request_id,
            m.arrival_time - self.t0 - m.tokenize_s,
            m.tokenize_s,
            len(seq.prompt_token_ids),
            sp.max_tokens or 0,
            sp.n,
            seq=seq,
        )
        self._live[seq.request_id] = t
        self._touch(t)
        return t

    def on_finished(self, output: RequestOutput) -> None:
        """EngineObserver: a request ended; its figures become its ``metrics``, exactly."""
        m = output.metrics
        reason = (output.outputs[0].finish_reason if output.outputs else None) or "abort"
        with self._lock:
            t = self._live.pop(output.request_id, None)
            if t is None:
                arrival = (m.arrival_time - m.tokenize_s - self.t0) if m is not None else 0.0
                n = len(output.outputs)
                t = _Track(output.request_id, arrival, 0.0, len(output.prompt_token_ids), 0, n)
            t.seq = None
            t.state = "finished"
            t.finish_reason = reason
            if m is not None:
                t.metrics = m.as_dict()
                t.tokenize_s = m.tokenize_s
                t.arrival = m.arrival_time - m.tokenize_s - self.t0
                t.scheduled = self.rel(m.first_scheduled_time)
                t.first_token = self.rel(m.first_token_time)
                t.end = self.rel(m.finished_time)
                t.output = m.output_tokens
                t.cached = m.cached_prompt_tokens
                if reason != "abort":  # as the Prometheus histograms count them
                    times = m.token_times
                    for a, b in zip(times, times[1:], strict=False):
                        self._itl.append(b - a)
                        self._num_itl += 1
            self._touch(t)
            self._finished.append(t)

    # -- event loop ------------------------------------------------------------------------------------
    def delta(self, cur: Cursor, history: int) -> tuple[dict[str, Any], list[tuple[int, array[int]]]]:
        """What changed since ``cur`` (advanced in place): new steps, changed requests (a fresh cursor: the
        last ``history`` finished ones and all live ones), new ITL samples; and the new steps' batches."""
        with self._lock:
            steps = []
            for e in reversed(self._steps):
                if e["i"] <= cur.step:
                    break
                steps.append(dict(e))
            steps.reverse()
            batches = [b for b in self._batches if b[0] > cur.step]
            if cur.fresh:
                finished = list(self._finished)[-history:] if history else []
            else:
                finished = []
                for t in reversed(self._finished):
                    if t.version <= cur.version:
                        break
                    finished.append(t)
                finished.reverse()
            live = [t for t in self._live.values() if t.version > cur.version or cur.fresh]
            requests = [t.to_json() for t in finished + live]
            new_itl = min(self._num_itl - cur.itl, len(self._itl))
            itl = list(self._itl)[len(self._itl) - new_itl :] if new_itl > 0 else []
            if cur.fresh:
                itl = itl[-2048:]
            cur.itl = self._num_itl
            cur.version = self._version
            if steps:
                cur.step = steps[-1]["i"]
            cur.fresh = False
            body = {
                "now": time.perf_counter() - self.t0,
                "steps": steps,
                "requests": requests,
                "itl": itl,
                "live": len(self._live),
                "untracked": self.untracked,
            }
        return body, batches

    def finished_metrics(self, limit: int = 500) -> list[dict[str, float | int]]:
        """The ``metrics`` of the newest finished requests that were not aborted."""
        with self._lock:
            done = [t.metrics for t in self._finished if t.metrics is not None and t.finish_reason != "abort"]
        return done[-limit:]

    def mean_running(self, last: int = 200) -> float:
        """Mean running sequences over the newest ``last`` steps (0 before any step)."""
        with self._lock:
            recent = list(self._steps)[-last:]
        return sum(e["running"] for e in recent) / len(recent) if recent else 0.0
