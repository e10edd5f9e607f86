"""Concurrency and rate rows of a plan, simulated with the engine's own scheduler (perf/simulator.py)."""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

from glassbox.config import DEFAULT_BLOCK_SIZE as BLOCK_SIZE
from glassbox.engine.kv_plan import blocks_that_fit
from glassbox.perf.memory_plan import MemoryPlan
from glassbox.perf.plan_request import PlanRequest, Setup
from glassbox.perf.simulator import SimResult, SimSettings, percentile, simulate

RATE_REQUESTS = 64  # requests per simulated Poisson run


def _settings(req: PlanRequest, s: Setup, memory: MemoryPlan) -> tuple[SimSettings, int] | None:
    """KV blocks left for prompt + output after each running sequence's --context depth; None: nothing fits."""
    free = memory.budget - memory.weights - memory.activations - memory.runtime
    per_token = memory.kv_bytes_per_token  # one rank's, with tensor parallelism
    slots = max(0, min(s.engine.max_num_seqs, memory.max_concurrency))
    free -= slots * memory.state_bytes_per_seq  # a hybrid model's states first, as the engine (kv_plan)
    if slots == 0 or free <= 0:
        return None
    blocks = blocks_that_fit(free, per_token, BLOCK_SIZE) if per_token > 0 else 1 << 30
    blocks -= slots * math.ceil(req.context_tokens / BLOCK_SIZE)  # each live sequence's prior context
    need = math.ceil((req.prompt_tokens + req.output_tokens) / BLOCK_SIZE)
    if blocks < need:
        return None
    blocks = min(blocks, slots * need)  # more than every running sequence can use never changes the run
    chunk = s.engine.max_batched_tokens or (req.prompt_tokens + req.context_tokens)
    settings = SimSettings(
        num_kv_blocks=blocks,
        block_size=BLOCK_SIZE,
        max_num_seqs=slots,
        num_state_slots=slots if memory.state_bytes_per_seq else 0,
        max_num_batched_tokens=chunk,
        request_overhead_s=s.engine.request_overhead_s,
        spec_tokens=req.spec_tokens,
        acceptance_rate=req.acceptance_rate or 0.0,
    )
    return settings, slots


settings_for = _settings  # its public name (perf/benchy_plan.py)


def _step_fn(req: PlanRequest, s: Setup):  # type: ignore[no-untyped-def]
    base = s.step_time_fn()
    ctx = req.context_tokens
    if not ctx:
        return base

    def with_context(batch: Sequence[tuple[int, int]]) -> float:
        return base([(n, c + ctx) for n, c in batch])

    return with_context


def _summary(sim: SimResult, req: PlanRequest, overhead: float) -> dict[str, Any]:
    ttfts = sim.ttfts(overhead)
    tpots = sim.tpots()
    return {
        "aggregate_tok_s": round(sim.aggregate_tok_s, 2),
        "per_request_tok_s": round(1.0 / percentile(tpots, 0.5), 2) if tpots else 0.0,
        "ttft_s_p50": round(percentile(ttfts, 0.5), 4),
        "ttft_s_p99": round(percentile(ttfts, 0.99), 4),
        "tpot_s_p50": round(percentile(tpots, 0.5), 5) if tpots else None,
        "queue_s_p50": round(percentile([r.queue_s for r in sim.requests], 0.5), 4),
        "requests": len(sim.requests),
        "steps": sim.steps,
        "preemptions": sim.preemptions,
    }


def concurrency_rows(req: PlanRequest, s: Setup, memory: MemoryPlan) -> list[dict[str, Any]]:
    """Closed loop: c users, each sending its next request when the previous one ends (3c requests)."""
    prepared = _settings(req, s, memory)
    rows: list[dict[str, Any]] = []
    for c in req.concurrency:
        if prepared is None:
            rows.append(
                {
                    "concurrency": c,
                    "aggregate_tok_s": 0.0,
                    "per_request_tok_s": 0.0,
                    "ttft_s_p50": None,
                    "ttft_s_p99": None,
                    "running": 0,
                    "fits": False,
                }
            )
            continue
        settings, slots = prepared
        sim = simulate(
            _step_fn(req, s),
            settings,
            req.prompt_tokens,
            req.output_tokens,
            max(3 * c, 8),
            concurrency=c,
            draft_time=s.draft_time_fn(req.spec_tokens),
        )
        row = {
            "concurrency": c,
            **_summary(sim, req, settings.request_overhead_s),
            "running": min(c, slots),
            "fits": c <= memory.max_concurrency,
        }
        rows.append(row)
    return rows


def rate_rows(req: PlanRequest, s: Setup, memory: MemoryPlan) -> list[dict[str, Any]]:
    """Open loop: Poisson arrivals at each rate (requests/s), RATE_REQUESTS requests per rate."""
    prepared = _settings(req, s, memory)
    rows: list[dict[str, Any]] = []
    for rate in req.rates:
        if prepared is None:
            rows.append({"rate_rps": rate, "overloaded": True, "fits": False})
            continue
        settings, _ = prepared
        sim = simulate(
            _step_fn(req, s),
            settings,
            req.prompt_tokens,
            req.output_tokens,
            RATE_REQUESTS,
            rate=rate,
            draft_time=s.draft_time_fn(req.spec_tokens),
        )
        served = len(sim.requests) / sim.duration_s if sim.duration_s > 0 else 0.0
        arrivals = [r.arrival for r in sim.requests]
        span = max(arrivals) - min(arrivals)
        offered = (len(arrivals) - 1) / span if span > 0 else math.inf  # the realized arrival rate
        row = {
            "rate_rps": rate,
            **_summary(sim, req, settings.request_overhead_s),
            "served_rps": round(served, 4),
            # served well below what arrived: the queue grew through the run
            "overloaded": served < 0.9 * offered,
        }
        rows.append(row)
    return rows
