"""``glassbox hardware [--probe] [--json]``: list the hardware presets, or measure this machine."""

from __future__ import annotations

import argparse
import json
import sys
from typing import Any

from glassbox.perf.hardware import PRESETS, HardwareSpec, spec_to_dict
from glassbox.perf.probe import cache_path, probe_local

_DTYPE_COLUMNS = ("bf16", "fp8", "fp4", "int8", "fp32")


def add_parser(subparsers: argparse._SubParsersAction) -> None:
    """Register the ``hardware`` subcommand."""
    p = subparsers.add_parser(
        "hardware",
        help="list hardware presets, or --probe this machine's bandwidth and matmul FLOP/s",
        description="List the hardware presets the planner knows (dense TFLOP/s), or measure this machine: "
        "read bandwidth (sustained, a buffer far beyond the caches, the engine's threads) "
        "and matmul FLOP/s, each figure cached with its own time and the machine's load, for "
        "`plan --hardware local` and `trace`.",
    )
    p.add_argument("--probe", action="store_true", help="measure this machine (cached; see --force)")
    p.add_argument(
        "--device", default="auto", help="device to probe: auto, cpu, cuda or cuda:N (default auto)"
    )
    p.add_argument("--force", action="store_true", help="re-measure even if a cached probe exists")
    p.add_argument("--json", action="store_true", help="print JSON")
    p.set_defaults(func=run)


def _probe(device: str, force: bool) -> HardwareSpec:
    import torch

    if device == "auto":
        device = "cuda" if torch.cuda.is_available() else "cpu"
    dtypes = ("bfloat16",) if device.startswith("cuda") else ("bfloat16", "float32")
    spec = probe_local(device, dtypes[0], force=force)
    for dtype in dtypes[1:]:
        spec = probe_local(device, dtype)
    return spec


def run(args: argparse.Namespace) -> int:
    """Entry point of ``glassbox hardware``; returns the exit status."""
    try:
        specs = [_probe(args.device, args.force)] if args.probe else list(PRESETS.values())
    except ValueError as exc:
        sys.stderr.write(f"glassbox hardware: error: {exc}\n")
        return 2
    if args.json:
        payload: Any = spec_to_dict(specs[0]) if args.probe else [spec_to_dict(s) for s in specs]
        sys.stdout.write(json.dumps(payload, indent=2) + "\n")
        return 0
    render(specs, probed=args.probe)
    return 0


def _num(v: float) -> str:
    """Three significant figures for small rates (a CPU's 0.9 TFLOP/s), thousands separators for big."""
    return f"{v:,.0f}" if v >= 100 else f"{v:.3g}"


def render(specs: list[HardwareSpec], probed: bool) -> None:
    from rich.console import Console
    from rich.table import Table

    console = Console()
    title = "This machine (measured" if probed else "Hardware presets (dense"
    t = Table(title=title + " TFLOP/s per dtype; sparse datasheet peaks are 2x)")
    t.add_column("name", no_wrap=True)
    t.add_column("GiB", justify="right")
    t.add_column("GB/s", justify="right")
    for dtype in _DTYPE_COLUMNS:
        t.add_column(dtype, justify="right")
    t.add_column("unified")
    for s in specs:
        flops = [_num(s.tflops[d]) if d in s.tflops else "-" for d in _DTYPE_COLUMNS]
        t.add_row(
            s.name,
            f"{s.memory_gib:,.0f}",
            f"{s.bandwidth_gbs:,.0f}",
            *flops,
            "yes" if s.unified_memory else "no",
        )
    console.print(t)
    for s in specs:
        console.print(f"[dim]{s.name}: {s.source}[/]")
    if probed and specs:
        _render_figures(console, specs[0])
        console.print(f"[dim]cached at {cache_path(str(specs[0].extra.get('device', 'cpu')))}[/]")


def _render_figures(console: Any, spec: HardwareSpec) -> None:
    """Each probe figure with its own time, threads and the machine's load while it was taken."""
    from rich.table import Table

    from glassbox.perf.machine_load import describe

    t = Table(title="probe figures, each with its own time and load (bandwidth = read)")
    for col in ("figure", "value (reps)", "measured at", "thr", "load while measured"):
        t.add_column(col, no_wrap=col != "load while measured")
    for name, fig in spec.extra.get("figures", {}).items():
        reps = fig.get("reps")
        value = f"{_num(fig['value'])} " + ("GB/s" if name.endswith("_gbs") else "TFLOP/s")
        if reps:
            value += f" ({min(reps):.3g}-{max(reps):.3g})"
        busy = " [red]busy[/]" if fig["load"].get("busy") else ""
        t.add_row(
            name.replace("tflops_", ""),
            value,
            fig["measured_at"][:19].replace("T", " "),
            str(fig["threads"] or ""),
            describe(fig["load"]).replace("load avg", "avg").replace("others", "oth") + busy,
        )
    console.print(t)
    for w in spec.extra.get("warnings", []):
        console.print(f"[yellow]warning: {w}[/]")
