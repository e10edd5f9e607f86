"""`glassbox bench URL --depth 0,4096,16384 --concurrency 1,5,10`: llama-benchy's runs, measured.

As llama-benchy runs them (github.com/eugr/llama-benchy, runner.py): the latency is measured first
(``api``: GET /v1/models; ``generation``: the first byte of a one-token request; ``none``: 0), one warm-up
request is sent, then for each depth and each concurrency ``c``, ``runs`` times, ``c`` requests are sent at
once, each with ``depth + pp`` fresh prompt tokens (new random words every request, so a prefix cache never
holds them) and ``tg`` output tokens. The figures and the table are bench/benchy_table.py's.
"""

from __future__ import annotations

import asyncio
import itertools
import random
import time
from dataclasses import dataclass

import httpx

from glassbox.bench.benchy_table import BenchyTest, Timeline
from glassbox.bench.client import RequestOptions, RequestResult, client_limits, send_request
from glassbox.bench.tokens import PromptBuilder
from glassbox.bench.workloads import RequestSpec

LATENCY_MODES = ("api", "generation", "none")
LATENCY_PROBES = 3  # llama-benchy averages three


@dataclass
class BenchyPlan:
    """What one `glassbox bench --depth ...` runs."""

    depths: list[int]
    concurrency: list[int]
    pp: int
    tg: int
    runs: int
    latency_mode: str
    builder: PromptBuilder
    options: RequestOptions
    seed: int = 0


def timeline(res: RequestResult) -> Timeline:
    """A request's times on the client's clock (content chunks at TTFT + the gaps after it)."""
    first = None if res.ttft_s is None else res.start + res.ttft_s
    times: list[float] = []
    if first is not None:
        times = [first, *(first + t for t in itertools.accumulate(res.itl_s))]
    return Timeline(
        start=res.start,
        first_response=None if res.ttfr_s is None else res.start + res.ttfr_s,
        first_token=first,
        end=res.start + (res.e2e_s or 0.0),
        prompt_tokens=res.prompt_tokens or 0,
        output_tokens=res.output_tokens,
        token_times=times,
    )


async def measure_latency(client: httpx.AsyncClient, plan: BenchyPlan) -> float:
    """Seconds of latency that est_ppt subtracts (the mean of LATENCY_PROBES tries)."""
    if plan.latency_mode == "none":
        return 0.0
    rng = random.Random(plan.seed - 1)
    got: list[float] = []
    for _ in range(LATENCY_PROBES):
        if plan.latency_mode == "api":
            t0 = time.perf_counter()
            r = await client.get(plan.options.base_url + "/v1/models")
            if r.status_code == 200:
                got.append(time.perf_counter() - t0)
            continue
        spec = RequestSpec(plan.builder.prompt(2, rng), 1, None)
        res = await send_request(client, spec, plan.options)
        if res.ok and res.ttfr_s is not None:
            got.append(res.ttfr_s)
    return sum(got) / len(got) if got else 0.0


async def _batch(
    client: httpx.AsyncClient, plan: BenchyPlan, depth: int, c: int, rng: random.Random
) -> list[RequestResult]:
    n = depth + plan.pp
    specs = [RequestSpec(plan.builder.prompt(n, rng), plan.tg, n) for _ in range(c)]
    return list(await asyncio.gather(*(send_request(client, s, plan.options) for s in specs)))


async def execute(plan: BenchyPlan) -> tuple[list[BenchyTest], float]:
    """Every (depth, concurrency) test in llama-benchy's order; returns them and the latency."""
    timeout = httpx.Timeout(plan.options.timeout_s, connect=min(plan.options.timeout_s, 30.0))
    limits = client_limits()
    rng = random.Random(plan.seed)
    async with httpx.AsyncClient(timeout=timeout, limits=limits) as client:
        latency = await measure_latency(client, plan)
        await send_request(
            client, RequestSpec(plan.builder.prompt(16, rng), 4, None), plan.options
        )  # warm-up
        tests = []
        for depth in plan.depths:
            for c in plan.concurrency:
                test = BenchyTest(depth, plan.pp, plan.tg, c, [], latency)
                for _ in range(plan.runs):
                    results = await _batch(client, plan, depth, c, rng)
                    test.runs.append([timeline(r) for r in results if r.ok])
                    for r in results:
                        if not r.ok:  # left out of the figures, as llama-benchy does; counted and named
                            test.failed += 1
                            test.error = test.error or f"{r.error}: {r.error_detail[:200]}"
                tests.append(test)
    return tests, latency


def run_benchy(plan: BenchyPlan) -> tuple[list[BenchyTest], float]:
    return asyncio.run(execute(plan))
