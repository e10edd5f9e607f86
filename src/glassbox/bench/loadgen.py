"""Load generation: a closed loop at a fixed concurrency, or open-loop Poisson arrivals at a fixed rate.

Each run records finished requests into a :class:`RunRecord` as they finish, so that an interrupted run
(Ctrl-C) still holds everything measured up to that moment.
"""

from __future__ import annotations

import asyncio
import itertools
import random
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field

import httpx

from glassbox.bench.client import RequestOptions, RequestResult, send_request
from glassbox.bench.workloads import RequestSpec, Workload


@dataclass
class RunRecord:
    """One run (a workload at one concurrency or one rate) and the results measured so far."""

    workload: Workload
    concurrency: int | None = None  # closed loop
    rate: float | None = None  # open loop, requests per second
    results: list[RequestResult] = field(default_factory=list)
    t0: float = 0.0  # perf_counter at the start of the measured part
    t_end: float | None = None
    interrupted: bool = False

    @property
    def label(self) -> str:
        return f"c={self.concurrency}" if self.concurrency is not None else f"rate={self.rate:g}/s"

    def duration_s(self) -> float:
        """From the run's start to its last finished request (or to now, while it runs)."""
        ends = [r.end for r in self.results]
        end = self.t_end if self.t_end is not None else (max(ends) if ends else time.perf_counter())
        return max(end - self.t0, 0.0)


OnDone = Callable[[RequestResult], None]


def _limit(num_requests: int | None, duration_s: float | None) -> tuple[int | None, float | None]:
    if num_requests is None and duration_s is None:
        raise ValueError("give --num-requests or --duration")
    return num_requests, duration_s


async def run_closed_loop(
    client: httpx.AsyncClient,
    opts: RequestOptions,
    record: RunRecord,
    requests: Iterator[RequestSpec],
    num_requests: int | None,
    duration_s: float | None,
    on_done: OnDone | None = None,
) -> None:
    """``record.concurrency`` workers, each sending its next request as soon as its last one finished.

    Stops issuing after ``num_requests`` in all, or once ``duration_s`` has passed (in-flight ones finish).
    """
    n_max, dur = _limit(num_requests, duration_s)
    assert record.concurrency is not None and record.concurrency >= 1
    issued = itertools.count()
    record.t0 = time.perf_counter()

    async def worker() -> None:
        while True:
            if dur is not None and time.perf_counter() - record.t0 >= dur:
                return
            if n_max is not None and next(issued) >= n_max:
                return
            res = await send_request(client, next(requests), opts)
            record.results.append(res)
            if on_done:
                on_done(res)

    await asyncio.gather(*(worker() for _ in range(record.concurrency)))
    record.t_end = time.perf_counter()


async def run_open_loop(
    client: httpx.AsyncClient,
    opts: RequestOptions,
    record: RunRecord,
    requests: Iterator[RequestSpec],
    num_requests: int | None,
    duration_s: float | None,
    seed: int = 0,
    on_done: OnDone | None = None,
) -> None:
    """Poisson arrivals at ``record.rate`` requests/s, sent whether or not earlier ones have finished.

    Stops arriving after ``num_requests`` arrivals or ``duration_s`` seconds, then waits for the stragglers.
    """
    n_max, dur = _limit(num_requests, duration_s)
    assert record.rate is not None and record.rate > 0
    rng = random.Random(seed)
    tasks: list[asyncio.Task[None]] = []

    async def one(spec: RequestSpec) -> None:
        res = await send_request(client, spec, opts)
        record.results.append(res)
        if on_done:
            on_done(res)

    record.t0 = time.perf_counter()
    next_at = record.t0
    try:
        for i in itertools.count():
            if n_max is not None and i >= n_max:
                break
            if dur is not None and next_at - record.t0 >= dur:
                break
            delay = next_at - time.perf_counter()
            if delay > 0:
                await asyncio.sleep(delay)
            tasks.append(asyncio.create_task(one(next(requests))))
            next_at += rng.expovariate(record.rate)
        await asyncio.gather(*tasks)
    finally:
        for t in tasks:
            t.cancel()
    record.t_end = time.perf_counter()


async def warm_up(
    client: httpx.AsyncClient,
    opts: RequestOptions,
    requests: Iterator[RequestSpec],
    count: int,
    concurrency: int,
    max_tokens: int = 16,
) -> list[RequestResult]:
    """Send ``count`` requests (short outputs) at ``concurrency``; their results are not measured."""
    specs = [next(requests) for _ in range(count)]
    specs = [RequestSpec(s.prompt, min(s.max_tokens, max_tokens), s.prompt_tokens) for s in specs]
    sem = asyncio.Semaphore(max(concurrency, 1))

    async def one(spec: RequestSpec) -> RequestResult:
        async with sem:
            return await send_request(client, spec, opts)

    return list(await asyncio.gather(*(one(s) for s in specs)))
