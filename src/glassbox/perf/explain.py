"""``plan --explain``: the terms each predicted figure is made of (bytes, FLOPs, the efficiencies and dtypes
they ran at, host overheads, collectives), from the same ``step_cost`` the figures come from.

prefill sums its chunks' terms; decode is one step at the run's mean context; TTFT is prefill plus the
request overhead. Within a step: seconds = max(memory_s, compute_s) (overlapped engines) or their sum
(CPU), + prompt_prep_s (glassbox-cpu's weight copies before a prompt's GEMMs: perf/cpu_terms.py)
+ step/layer/sequence overheads + comm_s.
"""

from __future__ import annotations

from typing import Any

from glassbox.perf.cost_model import StepCost, compute_dtype, step_cost
from glassbox.perf.plan_request import PlanRequest, Setup


def _sum(costs: list[StepCost]) -> dict[str, float]:
    out: dict[str, float] = {}
    for c in costs:
        for k, v in c.terms.items():
            out[k] = out.get(k, 0.0) + v
    if costs:
        out["overlapped"] = costs[0].terms.get("overlapped", 0.0)
    return out


def _rounded(terms: dict[str, float]) -> dict[str, float]:
    return {k: float(f"{v:.4g}") for k, v in terms.items()}


def explain(s: Setup, req: PlanRequest) -> dict[str, Any]:
    """The terms of prefill, decode and TTFT for the plan's single request (JSON-ready)."""
    e, hw = s.engine, s.hw
    chunk = e.max_batched_tokens or req.prompt_tokens
    pre, done = [], 0
    while done < req.prompt_tokens:
        n = min(chunk, req.prompt_tokens - done)
        pre.append(step_cost(s.facts, s.scheme, hw, e, [(n, req.context_tokens + done)], s.kv_bytes))
        done += n
    mid = req.context_tokens + req.prompt_tokens + max(req.output_tokens - 1, 1) // 2
    dec = step_cost(s.facts, s.scheme, hw, e, [(1, mid)], s.kv_bytes)
    prefill = _sum(pre)
    rates = {
        "bandwidth_gbs": hw.bandwidth_gbs * e.eta_bw,
        "linear_dtype": compute_dtype(s.scheme.main, hw, e),
        "linear_tflops": hw.peak_flops(compute_dtype(s.scheme.main, hw, e)) * e.eta_flops / 1e12,
        "expert_dtype": compute_dtype(s.scheme.experts, hw, e, experts=True),
        "attention_tflops": hw.peak_flops("bf16") * (e.eta_attn or e.eta_flops) / 1e12,
        "eta_bw": e.eta_bw,
        "eta_flops": e.eta_flops,
        "eta_attn": e.eta_attn or e.eta_flops,
        "moe_flops_factor": e.moe_flops_factor,
    }
    return {
        "rates": rates,
        "prefill": {"steps": len(pre), **_rounded(prefill)},
        "decode": {"context": mid, **_rounded(dec.terms)},
        "ttft": {
            "prefill_s": float(f"{prefill.get('seconds', 0.0):.4g}"),
            "request_overhead_s": e.request_overhead_s,
        },
        "tensor_parallel": {"size": e.tp.size, "link": e.tp.link.name if e.tp.link else None},
    }


def render_explain(console: Any, result: dict[str, Any]) -> None:
    """The terms as one table: prefill (all chunks) and one decode step."""
    from rich.table import Table

    x = result["explain"]
    r = x["rates"]
    t = Table(title="Why: the terms of each figure (seconds unless named; per rank)")
    for col in ("term", "prefill", "decode step"):
        t.add_column(col, justify="left" if col == "term" else "right")
    keys = [k for k in x["decode"] if k not in ("context", "overlapped")]
    for k in keys:
        a, b = x["prefill"].get(k, 0.0), x["decode"].get(k, 0.0)
        if a or b:
            t.add_row(k, f"{a:.4g}", f"{b:.4g}")
    console.print(t)
    console.print(
        f"rates: weights/KV at {r['bandwidth_gbs']:.1f} GB/s (eta_bw {r['eta_bw']}); linears in "
        f"{r['linear_dtype']} at {r['linear_tflops']:.1f} TFLOP/s (eta_flops {r['eta_flops']}); experts in "
        f"{r['expert_dtype']} (x{r['moe_flops_factor']}); attention at {r['attention_tflops']:.1f} TFLOP/s; "
        f"memory and compute {'overlapped (max)' if x['decode'].get('overlapped') else 'added'}; "
        f"TTFT = prefill {x['ttft']['prefill_s']} s + request overhead {x['ttft']['request_overhead_s']} s"
    )
