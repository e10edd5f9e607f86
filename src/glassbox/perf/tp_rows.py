"""The plan's tensor-parallel comparison: the same request on 1, 2 and 4 ranks over the chosen link.

Each row is a full re-plan with ``engine.tp`` set (per-rank memory, single-request prefill/decode/TTFT,
and the largest --concurrency simulated with the engine's scheduler), plus the all-reduce time of one
layer in a decode step (one token per sequence) and in a prefill chunk.
"""

from __future__ import annotations

from dataclasses import replace
from typing import Any

from glassbox.perf.cost_model import decode_cost, step_cost
from glassbox.perf.hardware import GIB
from glassbox.perf.load_rows import concurrency_rows
from glassbox.perf.memory_plan import plan_memory
from glassbox.perf.plan_request import PlanRequest, Setup
from glassbox.perf.tensor_parallel import TensorParallel, check_tp, layer_allreduce_s

TP_SIZES = (1, 2, 4)


def tp_row(req: PlanRequest, s: Setup, size: int) -> dict[str, Any]:
    """One rank count's figures (``s.engine.tp.link`` is the link)."""
    engine = replace(s.engine, tp=TensorParallel(size, s.engine.tp.link))
    t = replace(s, engine=engine)
    top = max(req.concurrency)
    memory = plan_memory(
        t.facts,
        t.scheme,
        t.hw,
        engine,
        req.seq_len,
        top,
        req.prompt_tokens,
        req.memory_utilization,
        t.kv_bytes,
        req.spec_tokens,
    )
    pre = t.prefill(req)
    start = req.context_tokens + req.prompt_tokens
    steps = max(req.output_tokens - 1, 1)
    dec = decode_cost(t.facts, t.scheme, t.hw, engine, 1, start, steps, t.kv_bytes)
    one = step_cost(t.facts, t.scheme, t.hw, engine, [(1, start)], t.kv_bytes)
    chunk = min(engine.max_batched_tokens or req.prompt_tokens, req.prompt_tokens)
    load = concurrency_rows(replace(req, concurrency=(top,)), t, memory)[0]
    return {
        "tensor_parallel_size": size,
        "weights_gib_per_rank": round(memory.weights / GIB, 3),
        "kv_bytes_per_token_per_rank": round(memory.kv_bytes_per_token),
        "fits": memory.fits,
        "max_concurrency": memory.max_concurrency,
        "allreduce_us_per_layer_decode": round(layer_allreduce_s(t.facts, engine.tp, 1) * 1e6, 2),
        "allreduce_us_per_layer_prefill": round(layer_allreduce_s(t.facts, engine.tp, chunk) * 1e6, 2),
        "decode_comm_share": round(one.comm_s / one.seconds, 4) if one.seconds else 0.0,
        "prefill_tok_s": round(req.prompt_tokens / pre.seconds, 2),
        "decode_tok_s": round(steps / dec.seconds, 2),
        "tpot_ms": round(dec.seconds / steps * 1e3, 3),
        "ttft_s": round(engine.request_overhead_s + pre.seconds, 4),
        "concurrency": top,
        "aggregate_tok_s": load["aggregate_tok_s"],
        "per_request_tok_s": load["per_request_tok_s"],
    }


def tp_rows(req: PlanRequest, s: Setup) -> list[dict[str, Any]]:
    """Rows for TP 1, 2, 4 (the sizes the model's heads allow, and the requested one), or [] without a
    link (--interconnect)."""
    if s.engine.tp.link is None:
        return []
    sizes = sorted({*TP_SIZES, req.tensor_parallel_size})
    rows = []
    for size in sizes:
        try:
            check_tp(s.facts, size)
        except ValueError:
            continue
        rows.append(tp_row(req, s, size))
    return rows
