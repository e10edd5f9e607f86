"""The simulator: the engine's own step loop (engine/core.py), Scheduler and BlockManager on a virtual clock.

The SimulatedExecutor advances the clock by the cost model's time for each exact batch and samples each
sequence's next token from a script (the planner's requests use placeholders), so batching, chunked
prefill, prefix caching, preemption and token-level stops in a prediction are the engine's real policy.
"""

from __future__ import annotations

import math
import random
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

from glassbox.config import DEFAULT_BLOCK_SIZE
from glassbox.engine.block_manager import BlockManager
from glassbox.engine.core import EngineCore, StepTrace
from glassbox.engine.executor import ReadyStep
from glassbox.engine.scheduler import Scheduler, SchedulerOutput
from glassbox.engine.sequence import Sequence as EngineSequence
from glassbox.outputs import SampleResult
from glassbox.sampling_params import SamplingParams

StepTimeFn = Callable[[Sequence[tuple[int, int]]], float]  # [(num_new_tokens, context_before)] -> seconds
PLACEHOLDER_TOKEN = 1  # generated ids only matter to the prefix cache; these never repeat a prompt block


@dataclass
class VirtualClock:
    now: float = 0.0

    def __call__(self) -> float:
        return self.now


class SimulatedExecutor:
    """The Executor boundary on a virtual clock. A speculative row (drafts from a ``DraftProposer``)
    accepts each draft in turn with probability ``acceptance_rate`` until one is rejected."""

    def __init__(
        self, step_time: StepTimeFn, clock: VirtualClock, acceptance_rate: float = 0.0, seed: int = 0
    ) -> None:
        self.step_time = step_time
        self.clock = clock
        self.scripts: dict[int, list[int]] = {}  # seq_id -> the tokens it samples, in order
        self.steps = 0
        self.trace: list[tuple[int, int]] = []  # (prefill tokens, decode tokens) of each step
        self.acceptance_rate = acceptance_rate
        self.rng = random.Random(seed)

    def launch(self, batch: SchedulerOutput) -> ReadyStep:
        self.clock.now += self.step_time([(s.num_new_tokens, s.start) for s in batch.scheduled])
        self.steps += 1
        self.trace.append((batch.num_prefill_tokens, batch.num_decode_tokens))
        results = {}
        for s in batch.scheduled:
            if s.samples:
                accepted = 0
                while accepted < len(s.draft_tokens) and self.rng.random() < self.acceptance_rate:
                    accepted += 1
                tokens = [self._next(s.seq, i) for i in range(accepted + 1)]
                results[s.seq.seq_id] = SampleResult(
                    tokens[-1], None, [SampleResult(t, None) for t in tokens[:-1]]
                )
        return ReadyStep(results)

    def _next(self, seq: EngineSequence, ahead: int = 0) -> int:
        script = self.scripts.get(seq.seq_id)
        return script[seq.num_output_tokens + ahead] if script is not None else PLACEHOLDER_TOKEN


@dataclass
class DraftProposer:
    """The simulator's proposer: ``k`` placeholder drafts for every decoding sequence (as many as fit). With
    ``draft_time`` (a draft model's passes over [(1, context)] rows) proposing takes that long on ``clock``."""

    k: int
    max_model_len: int
    draft_time: StepTimeFn | None = None
    clock: VirtualClock | None = None

    def propose_batch(self, asks: list[tuple[EngineSequence, int]]) -> list[list[int]]:
        if self.draft_time is not None and self.clock is not None:
            self.clock.now += self.draft_time([(1, len(s) - 1) for s, _ in asks])
        return [[PLACEHOLDER_TOKEN] * max(0, min(self.k, n, self.max_model_len - len(s))) for s, n in asks]

    def release(self, seq: EngineSequence) -> None:
        pass


@dataclass
class SimSettings:
    num_kv_blocks: int
    block_size: int = DEFAULT_BLOCK_SIZE
    max_num_seqs: int = 256
    max_num_batched_tokens: int = 8192
    enable_prefix_caching: bool = True
    request_overhead_s: float = 0.0  # added to each request's TTFT and E2E (HTTP, tokenize, admission)
    max_model_len: int = 1 << 40
    spec_tokens: int = 0  # speculative decoding: drafts per decode step (0: off)
    acceptance_rate: float = 0.0  # the chance that each draft is accepted (after the ones before it)
    num_state_slots: int = 0  # a hybrid model's recurrent-state slots (the engine's BlockManager holds them)


@dataclass
class SimRequestSpec:
    """One request to simulate: its prompt, sampling params and (optionally) the tokens it will sample."""

    prompt_token_ids: list[int]
    params: SamplingParams
    arrival: float = 0.0  # open loop only (closed loop: when a user slot frees)
    script: list[int] | None = None
    request_id: str = ""


@dataclass
class SimRequest:
    arrival: float
    prompt_tokens: int
    output_tokens: int
    first_token: float | None = None
    finished: float | None = None
    queue_s: float = 0.0
    finish_reason: str | None = None


@dataclass
class SimResult:
    requests: list[SimRequest] = field(default_factory=list)
    steps: int = 0
    preemptions: int = 0
    duration_s: float = 0.0
    trace: list[tuple[int, int]] = field(default_factory=list)
    step_traces: list[StepTrace] = field(default_factory=list)  # with record=True

    def ttfts(self, overhead: float = 0.0) -> list[float]:
        return [r.first_token - r.arrival + overhead for r in self.requests if r.first_token is not None]

    def tpots(self) -> list[float]:
        out = []
        for r in self.requests:
            if r.finished is not None and r.first_token is not None and r.output_tokens > 1:
                out.append((r.finished - r.first_token) / (r.output_tokens - 1))
        return out

    @property
    def output_tokens(self) -> int:
        return sum(r.output_tokens for r in self.requests if r.finished is not None)

    @property
    def aggregate_tok_s(self) -> float:
        return self.output_tokens / self.duration_s if self.duration_s > 0 else 0.0


def run_requests(
    specs: list[SimRequestSpec],
    step_time: StepTimeFn,
    settings: SimSettings,
    concurrency: int | None = None,
    eos_token_ids: frozenset[int] = frozenset(),
    record: bool = False,
    max_steps: int = 2_000_000,
    draft_time: StepTimeFn | None = None,
) -> SimResult:
    """Simulate ``specs`` through the engine's core: closed loop (``concurrency`` users, each sending the
    next spec when its request ends) or open loop (each spec arrives at its ``arrival``)."""
    clock = VirtualClock()
    bm = BlockManager(
        settings.num_kv_blocks,
        settings.block_size,
        settings.enable_prefix_caching,
        num_state_slots=settings.num_state_slots,
    )
    sched = Scheduler(bm, settings.max_num_seqs, settings.max_num_batched_tokens, clock=clock)
    if settings.spec_tokens > 0:
        sched.proposer = DraftProposer(settings.spec_tokens, settings.max_model_len, draft_time, clock)
    ex = SimulatedExecutor(step_time, clock, settings.acceptance_rate)
    core = EngineCore(sched, ex, settings.max_model_len, set(eos_token_ids), clock=clock)
    if record:
        core.trace = []
    result = SimResult()
    live: dict[int, SimRequest] = {}
    issued = 0

    def admit(at: float) -> None:
        nonlocal issued
        spec = specs[issued]
        rid = spec.request_id or str(issued)
        seq = EngineSequence(issued, rid, spec.prompt_token_ids, spec.params, arrival_time=at)
        if spec.script is not None:
            ex.scripts[seq.seq_id] = spec.script
        req = SimRequest(at, len(spec.prompt_token_ids), 0)
        live[seq.seq_id] = req
        result.requests.append(req)
        core.add(seq)
        issued += 1

    if concurrency is not None:
        for _ in range(min(concurrency, len(specs))):
            admit(0.0)
    while issued < len(specs) or live:
        if concurrency is None:
            while issued < len(specs) and specs[issued].arrival <= clock.now:
                admit(specs[issued].arrival)
            if not live and issued < len(specs):
                clock.now = specs[issued].arrival
                continue
        step = core.step()
        if step is None:
            raise RuntimeError("simulation stalled: nothing schedulable (KV cache too small?)")
        for a in step.appended:
            req = live[a.seq.seq_id]
            m = a.seq.metrics
            if req.first_token is None:
                req.first_token = m.first_token_time
                req.queue_s = (m.first_scheduled_time or req.arrival) - req.arrival
            if a.ended is not None:
                a.seq.finish(a.ended[0], a.ended[1], step.done)
                req.finished, req.output_tokens, req.finish_reason = (
                    step.done,
                    a.num_output_tokens,
                    a.ended[0],
                )
                del live[a.seq.seq_id]
                if concurrency is not None and issued < len(specs):
                    admit(clock.now)
        if ex.steps > max_steps:
            raise RuntimeError(f"simulation exceeded {max_steps} steps")
    result.steps = ex.steps
    result.trace = ex.trace
    result.step_traces = core.trace or []
    result.preemptions = sched.num_preemptions
    first = min((r.arrival for r in result.requests), default=0.0)
    result.duration_s = max((r.finished or 0.0) for r in result.requests) - first
    return result


def _prompt(rng: random.Random, n: int, shared_prefix: list[int]) -> list[int]:
    # distinct random ids (>= 2) so that only the deliberate shared prefix can hit the prefix cache
    return shared_prefix + [rng.randrange(2, 1 << 30) for _ in range(n - len(shared_prefix))]


def simulate(
    step_time: StepTimeFn,
    settings: SimSettings,
    prompt_tokens: int,
    output_tokens: int,
    num_requests: int,
    concurrency: int | None = None,
    rate: float | None = None,
    shared_prefix_tokens: int = 0,
    seed: int = 0,
    max_steps: int = 2_000_000,
    draft_time: StepTimeFn | None = None,
) -> SimResult:
    """Run ``num_requests`` identical-shape requests closed-loop at ``concurrency`` or Poisson at ``rate``/s
    (``draft_time``: a draft model's cost per step of proposals, perf/plan_request.Setup.draft_time_fn)."""
    if (concurrency is None) == (rate is None):
        raise ValueError("simulate() needs exactly one of concurrency or rate")
    if concurrency is not None and concurrency < 1:
        raise ValueError(f"--concurrency values must be >= 1, got {concurrency}")
    if rate is not None and rate <= 0:
        raise ValueError(f"--rate values must be > 0, got {rate}")
    rng = random.Random(seed)
    prefix = [rng.randrange(2, 1 << 30) for _ in range(min(shared_prefix_tokens, prompt_tokens - 1))]
    needed = -(-(prompt_tokens + output_tokens) // settings.block_size)
    if needed > settings.num_kv_blocks:
        raise ValueError(
            f"one request needs {needed} KV blocks but the cache holds {settings.num_kv_blocks}: it does not fit"
        )
    arrivals = [0.0] * num_requests
    if rate is not None:
        t = 0.0
        for i in range(num_requests):
            t += rng.expovariate(rate)
            arrivals[i] = t
    params = SamplingParams(max_tokens=output_tokens, ignore_eos=True)
    specs = [SimRequestSpec(_prompt(rng, prompt_tokens, prefix), params, at) for at in arrivals]
    return run_requests(specs, step_time, settings, concurrency, max_steps=max_steps, draft_time=draft_time)


def percentile(values: list[float], q: float) -> float:
    """Linear-interpolated percentile, q in [0, 1]."""
    if not values:
        return math.nan
    s = sorted(values)
    k = (len(s) - 1) * q
    lo = int(k)
    hi = min(lo + 1, len(s) - 1)
    return s[lo] + (s[hi] - s[lo]) * (k - lo)
