"""``glassbox plan MODEL --hardware H --depth 0,4096,16384 --concurrency 1,5,10``: llama-benchy's table
(bench/benchy_table.py) from a prediction, to hold line by line against ``glassbox bench --depth`` and
against published runs.

Each test is what llama-benchy sends: ``c`` requests at once, each of ``depth + pp`` fresh prompt tokens
(nothing cached: llama-benchy's prompts never repeat) and ``tg`` output tokens, here run through the
engine's own scheduler on the simulator's virtual clock (perf/simulator.py), each step timed by the cost
model. A request's tokens come out when its step ends (the last prefill chunk's step: the first token),
all shifted by the profile's per-request overhead (the host work before its prompt is scheduled). The
prediction has no network: ttfr = e2e_ttft = the predicted TTFT and est_ppt = ttfr (latency 0, as
llama-benchy's ``api`` mode measures on a local link). One run each, so no spread.
"""

from __future__ import annotations

import json
import random
import sys
import time
from collections.abc import Sequence
from dataclasses import replace
from typing import Any

from glassbox.bench.benchy_table import BenchyTest, Timeline, rows
from glassbox.perf.load_rows import settings_for
from glassbox.perf.memory_plan import plan_memory
from glassbox.perf.plan_request import PlanRequest, Setup, resolve
from glassbox.perf.simulator import SimRequestSpec, run_requests
from glassbox.sampling_params import SamplingParams


def _test(req: PlanRequest, s: Setup, depth: int, c: int) -> tuple[BenchyTest, bool]:
    """One (depth, c) test simulated; whether its c requests fit in memory at once."""
    prompt = depth + req.prompt_tokens
    one = replace(req, prompt_tokens=prompt, context_tokens=0, concurrency=(c,))
    memory = plan_memory(
        s.facts, s.scheme, s.hw, s.engine, one.seq_len, c, prompt, req.memory_utilization, s.kv_bytes
    )
    prepared = settings_for(one, s, memory)
    test = BenchyTest(depth, req.prompt_tokens, req.output_tokens, c, [])
    if prepared is None:
        return test, False
    settings, _ = prepared
    base = s.step_time_fn()
    ends: list[float] = []  # each step's end on the virtual clock (the simulator advances it by the step)

    def timed(batch: Sequence[tuple[int, int]]) -> float:
        dt = base(batch)
        ends.append((ends[-1] if ends else 0.0) + dt)
        return dt

    rng = random.Random(depth * 1009 + c)
    params = SamplingParams(max_tokens=req.output_tokens, ignore_eos=True)
    specs = [
        SimRequestSpec([rng.randrange(2, 1 << 30) for _ in range(prompt)], params, request_id=f"r{i}")
        for i in range(c)
    ]
    sim = run_requests(specs, timed, settings, concurrency=c, record=True)
    tokens: dict[str, list[float]] = {spec.request_id: [] for spec in specs}
    for end, step in zip(ends, sim.step_traces, strict=True):
        for rid, _, start, n in step.batch:
            if start + n >= prompt:  # a decode row, or the chunk that ends the prompt: one token out
                tokens[rid].append(end)
    lag = settings.request_overhead_s
    run = []
    for spec, r in zip(specs, sim.requests, strict=True):
        first = None if r.first_token is None else r.first_token + lag
        run.append(
            Timeline(
                start=r.arrival,
                first_response=first,
                first_token=first,
                end=(r.finished or 0.0) + lag,
                prompt_tokens=prompt,
                output_tokens=r.output_tokens,
                token_times=[t + lag for t in tokens[spec.request_id]],
            )
        )
    test.runs.append(run)
    return test, c <= memory.max_concurrency


def benchy_plan(req: PlanRequest, depths: Sequence[int]) -> dict[str, Any]:
    """The predicted table's rows (bench/benchy_table.rows) for every depth and ``req.concurrency``, in
    llama-benchy's order (depth, then concurrency), with what the prediction stood on."""
    if not depths or any(d < 0 for d in depths):
        raise ValueError(f"--depth must be a comma list of integers >= 0, got {list(depths)}")
    if req.spec_tokens or req.context_tokens:
        raise ValueError("--depth is llama-benchy's context; it does not take --context or --spec-tokens")
    s = resolve(req)
    tests, unfit = [], []
    for d in depths:
        for c in req.concurrency:
            test, fits = _test(req, s, d, c)
            tests.append(test)
            if not fits:
                unfit.append(f"depth {d} at c{c}: {c} x {d + req.prompt_tokens + req.output_tokens} tokens")
    return {
        "model": s.facts.name,
        "hardware": s.hw.name,
        "engine": s.engine.name,
        "quant": s.scheme.label,
        "pp": req.prompt_tokens,
        "tg": req.output_tokens,
        "benchy": rows(s.facts.name, tests),
        "does_not_fit": unfit,
        "warnings": [f"hardware probe: {w}" for w in s.hw.extra.get("warnings", [])],
    }


def run_depths(args: Any, req: PlanRequest) -> int:
    """``glassbox plan ... --depth``: the predicted table (markdown, as llama-benchy prints) or --json."""
    from glassbox.bench.benchy_cli import depth_list, footer
    from glassbox.bench.benchy_table import markdown

    try:
        result = benchy_plan(req, depth_list(args.depth))
    except ValueError as exc:
        sys.stderr.write(f"glassbox plan: error: {exc}\n")
        return 2
    if args.json:
        sys.stdout.write(json.dumps(result, indent=2) + "\n")
        return 0
    meta = {"date": time.strftime("%Y-%m-%d %H:%M:%S"), "latency_mode": "none"}
    source = f"glassbox plan (predicted: {result['hardware']}, engine {result['engine']}, weights {result['quant']})"
    lines = [markdown(result["benchy"], spread=False), "", footer(meta, source)]
    lines += [f"warning: does not fit at once: {u}" for u in result["does_not_fit"]]
    lines += [f"warning: {w}" for w in result["warnings"]]
    sys.stdout.write("\n".join(lines) + "\n")
    return 0
