"""SimulatedExecutor: the engine's own Scheduler and BlockManager on a virtual clock.

Each scheduled step advances the clock by the cost model's time for that exact batch, so batching,
chunked prefill, prefix caching and preemption in a prediction are the engine's real policy.
"""

from __future__ import annotations

import math
import random
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

from glassbox.engine.block_manager import BlockManager
from glassbox.engine.scheduler import Scheduler, SchedulerOutput
from glassbox.engine.sequence import Sequence as EngineSequence
from glassbox.outputs import SampleResult
from glassbox.sampling_params import SamplingParams

StepTimeFn = Callable[[Sequence[tuple[int, int]]], float]  # [(num_new_tokens, context_before)] -> seconds


@dataclass
class VirtualClock:
    now: float = 0.0

    def __call__(self) -> float:
        return self.now


class SimulatedExecutor:
    """Executor boundary on a virtual clock: returns a placeholder token for each sampling row."""

    def __init__(
        self, step_time: StepTimeFn, num_kv_blocks: int, block_size: int, clock: VirtualClock
    ) -> None:
        self.step_time = step_time
        self.num_kv_blocks = num_kv_blocks
        self.block_size = block_size
        self.clock = clock
        self.steps = 0
        self.trace: list[tuple[int, int]] = []  # (prefill tokens, decode tokens) of each step

    def execute(self, batch: SchedulerOutput) -> dict[int, SampleResult]:
        self.clock.now += self.step_time([(s.num_new_tokens, s.start) for s in batch.scheduled])
        self.steps += 1
        self.trace.append((batch.num_prefill_tokens, batch.num_decode_tokens))
        # Token ids only matter to the prefix cache, and generated tokens never repeat a prompt block.
        return {s.seq.seq_id: SampleResult(1, None) for s in batch.scheduled if s.samples}


@dataclass
class SimSettings:
    num_kv_blocks: int
    block_size: int = 16
    max_num_seqs: int = 256
    max_num_batched_tokens: int = 8192
    enable_prefix_caching: bool = True
    request_overhead_s: float = 0.0  # added to each request's TTFT and E2E (HTTP, tokenize, admission)


@dataclass
class SimRequest:
    arrival: float
    prompt_tokens: int
    output_tokens: int
    first_token: float | None = None
    finished: float | None = None
    queue_s: float = 0.0


@dataclass
class SimResult:
    requests: list[SimRequest] = field(default_factory=list)
    steps: int = 0
    preemptions: int = 0
    duration_s: float = 0.0
    trace: list[tuple[int, int]] = field(default_factory=list)

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
) -> SimResult:
    """Run ``num_requests`` identical-shape requests closed-loop at ``concurrency`` or Poisson at ``rate``/s."""
    if (concurrency is None) == (rate is None):
        raise ValueError("simulate() needs exactly one of concurrency or rate")
    if concurrency is not None and concurrency < 1:
        raise ValueError(f"--concurrency values must be >= 1, got {concurrency}")
    if rate is not None and rate <= 0:
        raise ValueError(f"--rate values must be > 0, got {rate}")
    clock = VirtualClock()
    bm = BlockManager(settings.num_kv_blocks, settings.block_size, settings.enable_prefix_caching)
    sched = Scheduler(bm, settings.max_num_seqs, settings.max_num_batched_tokens, clock=clock)
    ex = SimulatedExecutor(step_time, settings.num_kv_blocks, settings.block_size, clock)
    rng = random.Random(seed)
    prefix = [rng.randrange(2, 1 << 30) for _ in range(min(shared_prefix_tokens, prompt_tokens - 1))]
    params = SamplingParams(max_tokens=output_tokens, ignore_eos=True)
    needed = bm.blocks_needed(prompt_tokens + output_tokens)
    if needed > settings.num_kv_blocks:
        raise ValueError(
            f"one request needs {needed} KV blocks but the cache holds {settings.num_kv_blocks}: it does not fit"
        )
    arrivals: list[float] = []
    if rate is not None:
        t = 0.0
        for _ in range(num_requests):
            t += rng.expovariate(rate)
            arrivals.append(t)
    result = SimResult()
    live: dict[int, tuple[EngineSequence, SimRequest]] = {}
    issued = 0

    def admit(at: float) -> None:
        nonlocal issued
        seq = EngineSequence(
            issued, str(issued), _prompt(rng, prompt_tokens, prefix), params, arrival_time=at
        )
        req = SimRequest(at, prompt_tokens, output_tokens)
        live[seq.seq_id] = (seq, req)
        result.requests.append(req)
        sched.add(seq)
        issued += 1

    if concurrency is not None:
        for _ in range(min(concurrency, num_requests)):
            admit(0.0)
    while len(result.requests) < num_requests or live:
        if rate is not None:
            while issued < num_requests and arrivals[issued] <= clock.now:
                admit(arrivals[issued])
            if not live and issued < num_requests:
                clock.now = arrivals[issued]
                continue
        out = sched.schedule()
        if out.empty:
            raise RuntimeError("simulation stalled: nothing schedulable (KV cache too small?)")
        samples = ex.execute(out)
        sched.update(out)
        for s in out.scheduled:
            if s.seq.seq_id not in samples:
                continue
            seq, req = live[s.seq.seq_id]
            seq.append_token(samples[seq.seq_id].token_id)
            if req.first_token is None:
                req.first_token = clock.now
                req.queue_s = (seq.metrics.first_scheduled_time or req.arrival) - req.arrival
            if seq.num_output_tokens >= output_tokens:
                req.finished = clock.now
                sched.finish(seq)
                del live[seq.seq_id]
                if concurrency is not None and issued < num_requests:
                    admit(clock.now)
        if ex.steps > max_steps:
            raise RuntimeError(f"simulation exceeded {max_steps} steps")
    result.steps = ex.steps
    result.trace = ex.trace
    result.preemptions = sched.num_preemptions
    first = min((r.arrival for r in result.requests), default=0.0)
    result.duration_s = max((r.finished or 0.0) for r in result.requests) - first
    return result


def percentile(values: list[float], q: float) -> float:
    """Linear-interpolated percentile, q in [0, 1]."""
    if not values:
        return math.nan
    s = sorted(values)
    k = (len(s) - 1) * q
    lo = int(k)
    hi = min(lo + 1, len(s) - 1)
    return s[lo] + (s[hi] - s[lo]) * (k - lo)
