"""Runs a whole benchmark: every workload at every concurrency and rate, with warm-up and a progress bar."""

from __future__ import annotations

import asyncio
import logging
import math
from collections.abc import Callable
from dataclasses import dataclass, field

import httpx
from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TaskID, TextColumn, TimeElapsedColumn

from glassbox.bench.client import RequestOptions, RequestResult, client_limits
from glassbox.bench.loadgen import RunRecord, run_closed_loop, run_open_loop, warm_up
from glassbox.bench.tokens import PromptBuilder
from glassbox.bench.workloads import Workload

logger = logging.getLogger(__name__)


@dataclass
class BenchPlan:
    """Everything one `glassbox bench` invocation will run."""

    workloads: list[Workload]
    builder: PromptBuilder
    options: RequestOptions
    concurrency: list[int] = field(default_factory=list)
    rates: list[float] = field(default_factory=list)
    num_requests: int | None = None  # per run; None with duration_s None: a default by load
    duration_s: float | None = None
    warmup: int = 2
    seed: int = 0

    def runs(self) -> list[RunRecord]:
        """One record per (workload, load) in the order they will run."""
        out = []
        for w in self.workloads:
            out += [RunRecord(w, concurrency=c) for c in self.concurrency]
            out += [RunRecord(w, rate=r) for r in self.rates]
        return out

    def requests_for(self, record: RunRecord) -> int | None:
        """The run's request count: --num-requests, else (without --duration) enough to fill the load."""
        if self.num_requests is not None or self.duration_s is not None:
            return self.num_requests
        if record.concurrency is not None:
            return max(16, 4 * record.concurrency)
        return max(16, math.ceil(20 * (record.rate or 1.0)))


def _fixed_output_rejected(results: list[RequestResult]) -> bool:
    return (
        bool(results)
        and all(r.error in ("http_400", "http_422") for r in results)
        and any(
            k in r.error_detail
            for r in results
            for k in ("ignore_eos", "min_tokens", "extra", "unrecognized")
        )
    )


async def execute(
    plan: BenchPlan,
    records: list[RunRecord],
    console: Console,
    on_run_done: Callable[[RunRecord], None] | None = None,
) -> None:
    """Run ``plan``, appending each run's record to ``records`` as it starts (so that Ctrl-C keeps it)."""
    timeout = httpx.Timeout(plan.options.timeout_s, connect=min(plan.options.timeout_s, 30.0))
    limits = client_limits()
    progress = Progress(
        TextColumn("{task.description}"),
        BarColumn(),
        MofNCompleteColumn(),
        TimeElapsedColumn(),
        console=console,
        transient=True,
        disable=not console.is_terminal,
    )
    async with httpx.AsyncClient(timeout=timeout, limits=limits) as client:
        with progress:
            for i, record in enumerate(plan.runs()):
                w = record.workload
                n = plan.requests_for(record)
                desc = f"{w.name} {record.label}"
                if plan.warmup:
                    warm = await warm_up(
                        client,
                        plan.options,
                        w.requests(plan.builder, -1 - plan.seed * 1000 - i, plan.seed),
                        plan.warmup,
                        record.concurrency or min(plan.warmup, 4),
                    )
                    if plan.options.fixed_output and _fixed_output_rejected(warm):
                        logger.warning("the server rejects ignore_eos/min_tokens; asking without them")
                        plan.options.fixed_output = False
                    if all(not r.ok for r in warm):
                        logger.warning(
                            "%s: every warm-up request failed (%s)", desc, warm[0].error_detail[:120]
                        )
                task = progress.add_task(desc, total=n)
                records.append(record)

                def done(_: RequestResult, task: TaskID = task) -> None:
                    progress.advance(task)

                requests = w.requests(plan.builder, plan.seed * 1000 + i, plan.seed)
                if record.concurrency is not None:
                    await run_closed_loop(client, plan.options, record, requests, n, plan.duration_s, done)
                else:
                    await run_open_loop(
                        client,
                        plan.options,
                        record,
                        requests,
                        n,
                        plan.duration_s,
                        seed=plan.seed + i,
                        on_done=done,
                    )
                progress.remove_task(task)
                if on_run_done:
                    on_run_done(record)


def run_plan(
    plan: BenchPlan, console: Console, on_run_done: Callable[[RunRecord], None] | None = None
) -> tuple[list[RunRecord], bool]:
    """Run ``plan`` to the end or to Ctrl-C; returns the records (the last possibly partial) and whether
    it was interrupted."""
    records: list[RunRecord] = []
    try:
        asyncio.run(execute(plan, records, console, on_run_done))
    except KeyboardInterrupt:
        if records:
            records[-1].interrupted = True
        return [r for r in records if r.results], True
    return records, False
