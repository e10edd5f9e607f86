"""Fit glassbox-cpu on one run of benchmarks/plan_vs_trace.py and hold it against others (perf/cpu_fit.py).

Prints and writes (``--out``, markdown) the fitted constants, every cell of the fit run in CPU time, the
leave-one-model-out errors, and for each held-out run its cells in CPU time (the fit's clock) and in wall
time (the run's own wall-clock probe: what `glassbox plan --hardware local` would have used), each
beside the run's load and probe.

    PYTHONPATH=src python benchmarks/planner_cpu_fit.py FIT.json [FIT2.json ...] [--held H.json ...] [--out x.md]
    PYTHONPATH=src python benchmarks/planner_cpu_fit.py RUN.json [...] --check   (the committed profile, no fit)

Several fit runs are fitted as one (each model's figures the median over them: perf/cpu_fit.merge).
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
from dataclasses import replace
from pathlib import Path
from typing import Any

from glassbox.perf import cpu_fit
from glassbox.perf.engine_profiles import PROFILES, EngineProfile

CONSTANTS = [name for name, _ in cpu_fit.STAGES] + ["request_overhead_s"]
# glassbox-cpu before this fit (the 2026-11-22 EPYC fit: benchmarks/plan_vs_measured.py), the new terms
# neutral or at their design value: what leave-one-model-out falls back on for a constant it cannot refit
BEFORE = replace(
    PROFILES["glassbox-cpu"], eta_bw=0.78, eta_flops=0.84, eta_attn=0.0, step_overhead_s=0.0, request_overhead_s=0.002,
    prompt_layer_overhead_s=60e-6, tile_flops_share=1.0, block_gemv_factor=1.0, activation_passes=0.0,
    dequant_tail_bytes_per_value=0.0,
)  # fmt: skip


def _probe_line(run: dict[str, Any]) -> str:
    ps = run["probes"]

    def med(k: str) -> float:
        return statistics.median(p[k] for p in ps)

    return (
        f"load {min(p['load'] for p in ps):.1f}-{max(p['load'] for p in ps):.1f}; probe (median of {len(ps)}): "
        f"read {med('read_gbs'):.2f} GB/s wall, {med('read_gbs_cpu'):.2f} per CPU-second; bf16 matmul "
        f"{med('tflops'):.3f} TFLOP/s wall, {med('tflops_cpu'):.3f} per CPU-second; CPU share {med('cpu_share'):.2f}"
    )


def _table(rows: list[tuple[cpu_fit.Cell, float, float]]) -> list[str]:
    out = ["| cell | measured ms | predicted ms | error |", "|---|---:|---:|---:|"]
    out += [f"| {c.label} | {c.measured * 1e3:,.2f} | {p * 1e3:,.2f} | {e:+.1%} |" for c, p, e in rows]
    errs = [e for _, _, e in rows]
    out.append(
        f"| **MAPE** ({len(errs)} cells; max {max(abs(e) for e in errs):.1%}) | | | {cpu_fit.mape(errs):.1%} |"
    )
    return out


def report(
    fit_paths: list[Path], held: list[Path], base: EngineProfile, lomo_base: EngineProfile
) -> tuple[EngineProfile, str]:
    run = cpu_fit.merge([json.loads(p.read_text()) for p in fit_paths])
    eng = cpu_fit.fit(run, cpu_fit.cells(run, "cpu"), base)
    names = ", ".join(f"`{p.name}`" for p in fit_paths)
    lines = [
        f"## Fit: {names} ({run['date']}, {run['machine']}, torch {run['torch']})",
        "",
        _probe_line(run),
        "",
        "| constant | value |",
        "|---|---:|",
        *(f"| {k} | {getattr(eng, k):.6g} |" for k in CONSTANTS),
        "",
        "In CPU time, every cell fitted:",
        "",
        *_table(cpu_fit.errors(run, eng, "cpu")),
        "",
        "Leave one model out (refit on the other two models' cells; a constant only the left-out model's "
        "cells carry keeps its value before this fit, the 2026-11-22 EPYC profile's or neutral):",
        "",
    ]
    for model, rows in cpu_fit.leave_one_model_out(run, lomo_base).items():
        errs = [e for _, _, e in rows]
        lines.append(
            f"- {model}: MAPE {cpu_fit.mape(errs):.1%}, max {max(abs(e) for e in errs):.1%} ({len(errs)} cells)"
        )
    for path in held:
        other = json.loads(path.read_text())
        lines += ["", f"## Held out: `{path.name}` ({other['date']})", "", _probe_line(other), ""]
        for clock in ("cpu", "wall"):
            lines += [f"In {clock} time:", "", *_table(cpu_fit.errors(other, eng, clock)), ""]
    return eng, "\n".join(lines) + "\n"


def check(paths: list[Path]) -> str:
    """The committed glassbox-cpu profile, unfitted, against each run: its cells and each model's MAPE."""
    lines = []
    for path in paths:
        run = json.loads(path.read_text())
        rows = cpu_fit.errors(run, PROFILES["glassbox-cpu"], "cpu")
        lines += [f"## The committed profile on `{path.name}` ({run['date']})", "", _probe_line(run), ""]
        for model in run["cells"]:
            errs = [e for c, _, e in rows if c.model == model]
            lines.append(f"- {model}: MAPE {cpu_fit.mape(errs):.1%}, max {max(abs(e) for e in errs):.1%}")
        lines += ["", "In CPU time:", "", *_table(rows), ""]
    return "\n".join(lines) + "\n"


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("fit", type=Path, nargs="+")
    ap.add_argument("--held", type=Path, nargs="*", default=[])
    ap.add_argument("--out", type=Path, default=None)
    ap.add_argument("--check", action="store_true", help="no fit: the committed profile against each run")
    args = ap.parse_args()
    if args.check:
        text = check(args.fit)
        sys.stdout.write(text)
        if args.out:
            args.out.write_text(text)
        return 0
    eng, text = report(args.fit, args.held, BEFORE, BEFORE)  # from a fixed start: the fit is reproducible
    sys.stdout.write(text)
    sys.stdout.write("profile: " + ", ".join(f"{k}={getattr(eng, k):.4g}" for k in CONSTANTS) + "\n")
    if args.out:
        args.out.write_text(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
