"""``glassbox plan``: assemble memory fit, prefill, decode, TTFT, concurrency and rate rows into one dict
(with --tensor-parallel-size, one rank's memory and a step's all-reduces; with --interconnect, a TP 1/2/4
comparison from perf/tp_rows.py).

The concurrency and rate rows come from perf/load_rows.py: the engine's real Scheduler and BlockManager
on a virtual clock, each step timed by ``cost_model.step_time`` (with --spec-tokens, speculative steps
whose drafts the simulator accepts at --acceptance-rate; perf/spec_plan.py the single-request figure).
"""

from __future__ import annotations

from typing import Any

from glassbox.models.facts import ModelFacts
from glassbox.perf.cost_model import decode_cost
from glassbox.perf.explain import explain
from glassbox.perf.load_rows import concurrency_rows, rate_rows
from glassbox.perf.memory_plan import plan_memory
from glassbox.perf.plan_request import PlanRequest, Setup, resolve
from glassbox.perf.spec_plan import speculative_row
from glassbox.perf.tp_rows import tp_rows


def plan(req: PlanRequest) -> dict[str, Any]:
    """The full plan as a JSON-ready dict (see plan_cli for the keys users rely on)."""
    s = resolve(req)
    ceiling = s.engine.ceiling()
    memory = plan_memory(
        s.facts,
        s.scheme,
        s.hw,
        s.engine,
        req.seq_len,
        max(req.concurrency),
        req.prompt_tokens,
        req.memory_utilization,
        s.kv_bytes,
        req.spec_tokens,
    )
    pre, pre_ceil = s.prefill(req), s.prefill(req, ceiling)
    start = req.context_tokens + req.prompt_tokens
    steps = max(req.output_tokens - 1, 1)  # the first token comes out of the prefill
    dec = decode_cost(s.facts, s.scheme, s.hw, s.engine, 1, start, steps, s.kv_bytes)
    dec_ceil = decode_cost(s.facts, s.scheme, s.hw, ceiling, 1, start, steps, s.kv_bytes)
    ttft = s.engine.request_overhead_s + pre.seconds
    decode_s = dec.seconds if req.output_tokens > 1 else 0.0
    warnings = []
    if s.facts.max_context and req.seq_len > s.facts.max_context:
        warnings.append(
            f"{req.seq_len:,} tokens per sequence exceed the model's {s.facts.max_context:,}-token limit"
        )
    decode_tok_s = round(steps / dec.seconds, 2)
    if not memory.fits:
        warnings.append(f"needs {memory.total / 2**30:,.1f} GiB of a {memory.budget / 2**30:,.1f} GiB budget")
    warnings += [f"hardware probe: {w}" for w in s.hw.extra.get("warnings", [])]  # stale or busy figures
    return {
        "warnings": warnings,
        "model": _model_dict(s.facts),
        "hardware": {
            "name": s.hw.name,
            "memory_gib": round(s.hw.memory_gib, 2),
            "bandwidth_gbs": s.hw.bandwidth_gbs,
            "tflops": s.hw.tflops,
            "unified_memory": s.hw.unified_memory,
            "source": s.hw.source,
        },
        "quant": {
            "requested": req.quant,
            "scheme": s.scheme.label,
            "formats": s.scheme.describe(),
            "bits_per_weight": {
                g: round(s.scheme.format_for(g).bits_per_weight, 3) for g in s.scheme.describe()
            },
        },
        "engine": {
            "name": s.engine.name,
            "eta_bw": s.engine.eta_bw,
            "eta_flops": s.engine.eta_flops,
            "eta_attn": s.engine.eta_attn or s.engine.eta_flops,  # attention's share of the 16-bit peak
            "moe_flops_factor": s.engine.moe_flops_factor,
            "step_overhead_s": s.engine.step_overhead_s,
            "request_overhead_s": s.engine.request_overhead_s,
            "fitted_on": s.engine.fitted_on,
        },
        "workload": {
            "prompt_tokens": req.prompt_tokens,
            "output_tokens": req.output_tokens,
            "context_tokens": req.context_tokens,
            "memory_utilization": req.memory_utilization,
            "kv_cache_dtype": req.kv_cache_dtype,
            "spec_tokens": req.spec_tokens,
            "acceptance_rate": req.acceptance_rate,
            "tensor_parallel_size": req.tensor_parallel_size,
            "interconnect": _link_dict(s),
        },
        "memory": memory.to_dict(),
        "prefill": {
            "tok_s": round(req.prompt_tokens / pre.seconds, 2),
            "ceiling_tok_s": round(req.prompt_tokens / pre_ceil.seconds, 2),
            "bound": pre.bound,
            "seconds": round(pre.seconds, 4),
            "steps": pre.steps,
        },
        "decode": {
            "tok_s": decode_tok_s,
            "ceiling_tok_s": round(steps / dec_ceil.seconds, 2),
            "bound": dec.bound,
            "step_s": round(dec.seconds / steps, 5),
        },
        "speculative": speculative_row(s, req, decode_tok_s),  # None without --spec-tokens
        "ttft_s": round(ttft, 4),
        "e2e_s": round(ttft + decode_s, 4),
        "concurrency": concurrency_rows(req, s, memory),
        "rate": rate_rows(req, s, memory),
        "tensor_parallel": tp_rows(req, s),  # [] without --interconnect
        "explain": explain(s, req),  # the terms of prefill, decode and TTFT (perf/explain.py)
    }


def _link_dict(s: Setup) -> dict[str, Any] | None:
    link = s.engine.tp.link
    if link is None:
        return None
    return {
        "name": link.name,
        "bandwidth_gbs": link.bandwidth_bytes_s / 1e9,
        "latency_us": link.latency_s * 1e6,
        "source": link.source,
    }


def _model_dict(f: ModelFacts) -> dict[str, Any]:
    return {
        "name": f.name,
        "model_type": f.model_type,
        "total_params": f.total_params,
        "active_params": f.active_params,
        "layers": f.num_layers,
        "hidden_size": f.hidden_size,
        "attention": f.describe_attention(),
        "kv_heads": f.num_kv_heads,
        "head_dim": f.head_dim,
        "moe": {"experts": f.num_experts, "top_k": f.experts_per_token, "moe_layers": f.moe_layers}
        if f.is_moe
        else None,
        "native_quant": f.native_quant.describe() if f.native_quant else None,
        "notes": list(f.notes),
    }
