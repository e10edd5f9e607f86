"""Refit every Spark engine profile on its fit rows (perf/spark_rows.py) and report every row's error,
held-out MAPE per engine and kind, and leave-one-model-out errors, as Markdown.

    PYTHONPATH=src python benchmarks/planner_fit.py [--out benchmarks/results/planner-fit-<date>.md]
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

from glassbox.perf.calibrate import error, fit_engine, fit_step_sync, leave_one_model_out, mape, predict
from glassbox.perf.engine_profiles import PROFILES
from glassbox.perf.spark_rows import BATCH_SIZES, BATCHED_CONTEXT, BATCHED_DECODE, ROWS, rows
from glassbox.perf.tensor_parallel import INTERCONNECTS

ENGINES = ("ollama", "llama.cpp", "sglang", "vllm", "trt-llm")


def report() -> str:
    lines = [
        f"# Planner fit on published DGX Spark rows ({time.strftime('%Y-%m-%d')})",
        "",
        "No run on this machine: the cost model's predictions against published figures "
        "(`benchmarks/planner_fit.py`). Rows, sources and the fit/held-out split: "
        "`src/glassbox/perf/spark_rows.py` (split set before fitting). Error = predicted / published - 1.",
        "",
    ]
    for name in ENGINES:
        fit = fit_engine(name, rows(name, "fit"))
        stored = PROFILES[name]
        lines += [f"## {name}", ""]
        lines.append(
            "Refit: "
            + ", ".join(f"{k} {v:.4g} (stored {getattr(stored, k):.4g})" for k, v in fit.values.items())
        )
        if name == "vllm":
            sync = fit_step_sync(rows(name, "fit"), stored)
            link = INTERCONNECTS["200gbe-roce"]
            lines.append(
                f"; 200gbe-roce step_sync_s {sync * 1e3:.2f} ms (stored {link.step_sync_s * 1e3:.2f} ms)"
            )
        lines += [
            "",
            "| split | row | published | predicted | error | source |",
            "|---|---|---:|---:|---:|---|",
        ]
        for r in rows(name):
            p = predict(r, stored)
            err = "" if r.split == "excluded" else f"{p / r.measured - 1:+.1%}"
            lines.append(f"| {r.split} | {r.label} | {r.measured:.4g} | {p:.4g} | {err} | {r.source} |")
        held = [r for r in rows(name, "held")]
        for kind in ("decode", "prefill", "ttft"):
            errs = [error(r, stored) for r in held if r.kind == kind]
            if errs:
                lines.append(f"\nHeld-out {kind} MAPE: {mape(errs):.1%} over {len(errs)} rows")
        loo = leave_one_model_out(name, rows(name, "fit"))
        if len(loo) > 1:
            lines += ["", "Leave one model out (refit without the model's fit rows, then predict them):", ""]
            for model, pairs in loo.items():
                cells = ", ".join(
                    f"{r.kind}{' b' + str(r.batch) if r.batch > 1 else ''} {e:+.1%}" for r, e in pairs
                )
                lines.append(f"- {model}: {cells}")
            allerr = [e for pairs in loo.values() for _, e in pairs]
            lines.append(f"- leave-one-model-out MAPE: {mape(allerr):.1%} over {len(allerr)} rows")
        else:
            lines += ["", "Leave one model out: not possible (one model among the fit rows)."]
        lines.append("")
    lines += batched_section()
    excluded = [r for r in ROWS if r.split == "excluded"]
    if excluded:
        lines += ["Excluded rows (reason in spark_rows.py): " + "; ".join(r.label for r in excluded), ""]
    return "\n".join(lines) + "\n"


def batched_section() -> list[str]:
    """Batched decode (llama-batched-bench) predicted with the expected union of experts, llama.cpp profile."""
    from glassbox.perf.calibrate import SPARK
    from glassbox.perf.cost_model import expected_distinct_experts, step_cost
    from glassbox.perf.model_presets import load_model_facts
    from glassbox.perf.quant import resolve_scheme

    eng = PROFILES["llama.cpp"]
    head = " | ".join(f"B={b}" for b in BATCH_SIZES)
    lines = [
        "## Batched MoE decode: the expected union of experts vs llama-batched-bench (held out)",
        "",
        "Aggregate tok/s, published / predicted (error); in brackets the experts a step reads per MoE layer "
        "under uniform routing, E (1 - (1 - k/E)^B).",
        "",
        f"| model | {head} |",
        "|---|" + "---:|" * len(BATCH_SIZES),
    ]
    for (model, quant), measured in BATCHED_DECODE.items():
        f = load_model_facts(model)
        s = resolve_scheme(quant, f.native_quant, f.dtype, eng.gguf, eng.mixed_rest_format)
        cells = []
        for b, y in zip(BATCH_SIZES, measured, strict=True):
            p = b / step_cost(f, s, SPARK, eng, [(1, BATCHED_CONTEXT)] * b).seconds
            union = expected_distinct_experts(f.num_experts, f.experts_per_token, b)
            cells.append(f"{y:.0f} / {p:.0f} ({p / y - 1:+.0%})" + (f" [{union:.1f}]" if f.is_moe else ""))
        lines.append(f"| {model} {quant} | " + " | ".join(cells) + " |")
    return [*lines, ""]


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--out", default="")
    args = ap.parse_args()
    text = report()
    out = (
        Path(args.out)
        if args.out
        else (Path(__file__).resolve().parent / "results" / f"planner-fit-{time.strftime('%Y-%m-%d')}.md")
    )
    out.write_text(text)
    sys.stdout.write(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
