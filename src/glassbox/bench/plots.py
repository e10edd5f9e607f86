"""PNG plots of a benchmark: throughput and latency percentiles against concurrency or request rate."""

from __future__ import annotations

from pathlib import Path
from typing import Any

STYLES = {"p50": "-", "p90": "--", "p99": ":"}


def _series(runs: list[dict[str, Any]], axis: str) -> dict[str, list[dict[str, Any]]]:
    """Runs with ``axis`` set ("concurrency" or "rate"), grouped by workload and sorted along the axis."""
    by: dict[str, list[dict[str, Any]]] = {}
    for r in runs:
        if r.get(axis) is not None:
            by.setdefault(r["workload"], []).append(r)
    return {w: sorted(rs, key=lambda r: r[axis]) for w, rs in by.items()}


def _axis(ax: Any, axis: str, xs: list[float]) -> None:
    """Label the x axis; concurrency levels that double get a log2 scale with their own ticks."""
    ax.set_xlabel(axis if axis == "concurrency" else "request rate (req/s)")
    ax.grid(alpha=0.3)
    ax.set_ylim(bottom=0)
    if axis == "concurrency" and xs and min(xs) > 0 and max(xs) / min(xs) >= 4:
        ax.set_xscale("log", base=2)
        ax.set_xticks(sorted(set(xs)), [f"{x:g}" for x in sorted(set(xs))])


def _plot_throughput(series: dict[str, list[dict[str, Any]]], axis: str, path: Path) -> None:
    import matplotlib.pyplot as plt

    fig, (agg, per) = plt.subplots(1, 2, figsize=(11, 4.2))
    for name, rs in series.items():
        xs = [r[axis] for r in rs]
        agg.plot(xs, [r["output_tok_s"] for r in rs], marker="o", label=name)
        per.plot(
            xs, [r["per_request_decode_tok_s"]["p50"] or float("nan") for r in rs], marker="o", label=name
        )
    agg.set_title("aggregate output tok/s")
    per.set_title("per-request decode tok/s (p50)")
    xs_all = [r[axis] for rs in series.values() for r in rs]
    for ax in (agg, per):
        _axis(ax, axis, xs_all)
    agg.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def _plot_latency(series: dict[str, list[dict[str, Any]]], axis: str, path: Path) -> None:
    import matplotlib.pyplot as plt

    fig, (ttft, tpot) = plt.subplots(1, 2, figsize=(11, 4.2))
    colors = plt.rcParams["axes.prop_cycle"].by_key()["color"]
    for i, (name, rs) in enumerate(series.items()):
        xs = [r[axis] for r in rs]
        color = colors[i % len(colors)]
        for q, style in STYLES.items():
            label = f"{name} {q}"
            ttft.plot(
                xs,
                [(r["ttft_s"][q] or float("nan")) * 1e3 for r in rs],
                style,
                marker="o",
                color=color,
                label=label,
            )
            tpot.plot(
                xs,
                [(r["tpot_s"][q] or float("nan")) * 1e3 for r in rs],
                style,
                marker="o",
                color=color,
                label=label,
            )
    ttft.set_title("TTFT (ms): p50 solid, p90 dashed, p99 dotted")
    tpot.set_title("TPOT (ms): p50 solid, p90 dashed, p99 dotted")
    xs_all = [r[axis] for rs in series.values() for r in rs]
    for ax in (ttft, tpot):
        _axis(ax, axis, xs_all)
    ttft.legend(fontsize=6, ncol=2)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def write_plots(runs: list[dict[str, Any]], out_dir: Path) -> list[Path]:
    """throughput_vs_{concurrency,rate}.png and latency_vs_{concurrency,rate}.png for the axes present."""
    import matplotlib

    matplotlib.use("Agg")
    written = []
    for axis in ("concurrency", "rate"):
        series = _series(runs, axis)
        if not series:
            continue
        for kind, plot in (("throughput", _plot_throughput), ("latency", _plot_latency)):
            path = out_dir / f"{kind}_vs_{axis}.png"
            plot(series, axis, path)
            written.append(path)
    return written
