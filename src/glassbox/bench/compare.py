"""--compare-plan: the planner's prediction for the benchmarked workloads, side by side with the measurement.

Predictions are made before the benchmark runs (so that a bad model or hardware name fails at once); the
pairing happens after. A shared-prefix workload is predicted with its prefix already in the KV cache.
"""

from __future__ import annotations

from typing import Any

from rich import box
from rich.console import Console
from rich.table import Table

from glassbox.bench.workloads import Workload, load_label


def predict(
    model: str,
    hardware: str,
    quant: str | None,
    engine: str,
    workloads: list[Workload],
    concurrency: list[int],
    rates: list[float],
) -> dict[str, Any]:
    """One planner run per workload, at the benchmark's concurrency levels and rates."""
    from glassbox.perf.planner import PlanRequest, plan

    plans = {}
    for w in workloads:
        prefix = min(w.shared_prefix_tokens, max(w.prompt_tokens - 1, 0))
        req = PlanRequest(
            model=model,
            hardware=hardware,
            quant=quant or "native",
            engine=engine,
            prompt_tokens=max(w.prompt_tokens - prefix, 1),
            output_tokens=w.output_tokens,
            context_tokens=prefix,
            concurrency=tuple(concurrency) or (1,),
            rates=tuple(rates),
        )
        plans[w.name] = plan(req)
    return {
        "model": model,
        "hardware": hardware,
        "quant": quant or "native",
        "engine": engine,
        "plans": plans,
    }


def _p50(d: dict[str, Any] | None) -> float | None:
    return None if not d else d.get("p50")


def _load_row(plan: dict[str, Any], run: dict[str, Any]) -> dict[str, Any] | None:
    if run.get("concurrency") is not None:
        rows = [r for r in plan.get("concurrency", []) if r.get("concurrency") == run["concurrency"]]
    else:
        rows = [r for r in plan.get("rate", []) if r.get("rate_rps") == run["rate"]]
    return rows[0] if rows else None


def _pairs(plan: dict[str, Any], run: dict[str, Any]) -> list[tuple[str, Any, Any]]:
    server = run.get("server") or {}
    pairs: list[tuple[str, Any, Any]] = []
    if run.get("concurrency") == 1:  # the planner's single-request speeds
        measured_prefill = _p50(server.get("prefill_tok_s")) or _p50(run["prefill_tok_s"])
        pairs += [
            ("prefill tok/s (1 request)", plan["prefill"]["tok_s"], measured_prefill),
            ("decode tok/s (1 request)", plan["decode"]["tok_s"], _p50(run["per_request_decode_tok_s"])),
        ]
    row = _load_row(plan, run)
    if row is None:
        return pairs
    pairs += [
        ("TTFT p50 s", row.get("ttft_s_p50"), _p50(run["ttft_s"])),
        ("TTFT p99 s", row.get("ttft_s_p99"), run["ttft_s"]["p99"]),
        ("TPOT p50 s", row.get("tpot_s_p50"), _p50(run["tpot_s"])),
        ("per-request tok/s", row.get("per_request_tok_s"), _p50(run["per_request_decode_tok_s"])),
        ("aggregate tok/s", row.get("aggregate_tok_s"), run["output_tok_s"]),
    ]
    if server:
        pairs.append(("queue p50 s (server)", row.get("queue_s_p50"), _p50(server.get("queue_s"))))
    return pairs


def compare(prediction: dict[str, Any], runs: list[dict[str, Any]]) -> dict[str, Any]:
    """Rows of {workload, load, metric, predicted, measured, ratio (measured / predicted)}."""
    rows = []
    for run in runs:
        plan = prediction["plans"].get(run["workload"])
        if plan is None:
            continue
        for metric, pred, meas in _pairs(plan, run):
            ratio = meas / pred if isinstance(pred, (int, float)) and pred and meas is not None else None
            rows.append(
                {
                    "workload": run["workload"],
                    "load": load_label(run),
                    "metric": metric,
                    "predicted": pred,
                    "measured": meas,
                    "ratio": ratio,
                }
            )
    return {k: v for k, v in prediction.items() if k != "plans"} | {"rows": rows}


def _fmt(v: Any) -> str:
    if v is None:
        return "-"
    return f"{v:,.1f}" if abs(v) >= 100 else f"{v:.4g}"


def _cells(row: dict[str, Any]) -> list[str]:
    ratio = row["ratio"]
    return [
        row["workload"],
        row["load"],
        row["metric"],
        _fmt(row["predicted"]),
        _fmt(row["measured"]),
        "-" if ratio is None else f"{ratio:.2f}x",
    ]


HEADER = ["workload", "load", "metric", "predicted", "measured", "measured/predicted"]


def print_table(result: dict[str, Any], console: Console) -> None:
    """The comparison as a rich table."""
    title = (
        f"planner ({result['model']} on {result['hardware']}, {result['quant']}, "
        f"{result['engine']} profile) vs measured"
    )
    table = Table(title=title, header_style="bold", box=box.SIMPLE_HEAD, pad_edge=False)
    for h in HEADER:
        table.add_column(h, justify="left" if h in ("workload", "load", "metric") else "right", no_wrap=True)
    for row in result["rows"]:
        table.add_row(*_cells(row))
    console.print(table)


def markdown_table(result: dict[str, Any]) -> str:
    """The comparison as a Markdown table (for report.md)."""
    lines = [
        f"Planner: `{result['model']}` on `{result['hardware']}`, quant `{result['quant']}`, "
        f"engine profile `{result['engine']}`.",
        "",
        "| " + " | ".join(HEADER) + " |",
        "|" + "---|" * len(HEADER),
    ]
    lines += ["| " + " | ".join(_cells(row)) + " |" for row in result["rows"]]
    return "\n".join(lines)
