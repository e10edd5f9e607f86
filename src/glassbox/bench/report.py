"""Reports of a benchmark: the terminal table (rich), results.json, results.csv and report.md."""

from __future__ import annotations

import csv
import json
from pathlib import Path
from typing import Any

from rich import box
from rich.console import Console
from rich.markup import escape
from rich.table import Table

from glassbox.bench.workloads import load_label


def _ms(d: dict[str, Any] | None, key: str) -> str:
    v = (d or {}).get(key)
    return "-" if v is None else f"{v * 1e3:.1f}"


def _num(v: float | None, digits: int = 1) -> str:
    return "-" if v is None else f"{v:,.{digits}f}"


THROUGHPUT_HEADER = [
    "workload",
    "load",
    "in/out",
    "ok",
    "fail",
    "req/s",
    "out tok/s",
    "total tok/s",
    "tok/s/req p50",
    "goodput req/s",
]
LATENCY_HEADER = [
    "workload",
    "load",
    "TTFT p50",
    "TTFT p90",
    "TTFT p99",
    "TPOT p50",
    "TPOT p99",
    "ITL p50",
    "E2E p50",
    "prefill tok/s",
]
SERVER_HEADER = [
    "workload",
    "load",
    "queue p50",
    "queue p99",
    "prefill p50",
    "prefill p99",
    "decode p50",
    "TTFT p50",
    "cached",
]


def throughput_rows(runs: list[dict[str, Any]]) -> list[list[str]]:
    """One row of THROUGHPUT_HEADER per run."""
    rows = []
    for r in runs:
        good = r.get("goodput")
        rows.append(
            [
                r["workload"],
                load_label(r),
                f"{r['prompt_tokens']}/{r['output_tokens']}",
                str(r["completed"]),
                str(r["failed"]),
                _num(r["request_rate"], 2),
                _num(r["output_tok_s"]),
                _num(r["total_tok_s"]),
                _num(r["per_request_decode_tok_s"]["p50"]),
                "-" if not good else _num(good["req_s"], 2),
            ]
        )
    return rows


def latency_rows(runs: list[dict[str, Any]]) -> list[list[str]]:
    """One row of LATENCY_HEADER per run (milliseconds, prefill in tok/s)."""
    return [
        [
            r["workload"],
            load_label(r),
            _ms(r["ttft_s"], "p50"),
            _ms(r["ttft_s"], "p90"),
            _ms(r["ttft_s"], "p99"),
            _ms(r["tpot_s"], "p50"),
            _ms(r["tpot_s"], "p99"),
            _ms(r["itl_s"], "p50"),
            _ms(r["e2e_s"], "p50"),
            _num(r["prefill_tok_s"]["p50"]),
        ]
        for r in runs
    ]


def server_rows(runs: list[dict[str, Any]]) -> list[list[str]]:
    """One row of SERVER_HEADER per run whose responses carried server metrics."""
    rows = []
    for r in runs:
        s = r.get("server")
        if not s:
            continue
        frac = s.get("cached_prompt_fraction")
        rows.append(
            [
                r["workload"],
                load_label(r),
                _ms(s["queue_s"], "p50"),
                _ms(s["queue_s"], "p99"),
                _ms(s["prefill_s"], "p50"),
                _ms(s["prefill_s"], "p99"),
                _ms(s["decode_s"], "p50"),
                _ms(s["ttft_s"], "p50"),
                "-" if frac is None else f"{frac:.0%}",
            ]
        )
    return rows


def notes(result: dict[str, Any]) -> list[str]:
    """Caveats a reader must see: estimated lengths, ignored fixed-length requests, interruptions."""
    meta = result.get("meta", {})
    out = []
    if meta.get("prompt_length_source") == "estimate":
        out.append(
            "Prompt lengths are estimates (no /tokenize on the server and no --tokenizer given); "
            "throughput uses the server's usage counts where it reports them."
        )
    elif meta.get("prompt_lengths_exact") is False:
        out.append("Prompt lengths are approximate: the tokenizer's counts did not add up word by word.")
    short = sum(r.get("short_outputs", 0) for r in result["runs"])
    if short:
        out.append(
            f"{short} request(s) ended before their fixed output length: the server does not honour "
            "ignore_eos/min_tokens (or stopped for another reason); TPOT still uses real counts."
        )
    if any(r.get("usage_reported") is False for r in result["runs"]):
        out.append("The server sent no usage in its stream; output tokens were counted as content chunks.")
    for r in result["runs"]:
        for cls, n in r["errors"].items():
            example = r.get("error_examples", {}).get(cls, "")
            out.append(
                f"{r['workload']} {load_label(r)}: {n} failed with {cls}"
                + (f": {example}" if example else "")
            )
    if meta.get("interrupted"):
        out.append("Interrupted (Ctrl-C): the last run holds only the requests that finished before it.")
    return out


def _rich_table(title: str, header: list[str], rows: list[list[str]]) -> Table:
    table = Table(title=title, header_style="bold", box=box.SIMPLE_HEAD, pad_edge=False)
    for h in header:
        left = h in ("workload", "load")
        table.add_column(h, justify="left" if left else "right", no_wrap=left)
    for row in rows:
        table.add_row(*row)
    return table


def print_tables(result: dict[str, Any], console: Console) -> None:
    """The end-of-run tables on ``console``: throughput, latency (ms) and, when reported, the server's split."""
    runs = result["runs"]
    console.print(_rich_table("throughput", THROUGHPUT_HEADER, throughput_rows(runs)))
    console.print(_rich_table("latency (ms)", LATENCY_HEADER, latency_rows(runs)))
    if srows := server_rows(runs):
        console.print(
            _rich_table("server side (ms, as the server measured each request)", SERVER_HEADER, srows)
        )
    for n in notes(result):
        console.print(f"[yellow]note:[/] {escape(n)}", highlight=False)


def _md_table(header: list[str], rows: list[list[str]]) -> str:
    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    lines += ["| " + " | ".join(c.replace("|", "/") for c in row) + " |" for row in rows]
    return "\n".join(lines)


def markdown(result: dict[str, Any], plots: list[str]) -> str:
    """report.md: the setup, both tables, caveats and the plots."""
    meta = result.get("meta", {})
    parts = [
        "# glassbox bench report",
        "",
        f"- server: `{meta.get('url')}`, model `{meta.get('model')}`, endpoint `{meta.get('endpoint')}`",
        f"- context limit: {meta.get('max_model_len') or 'unknown'}; prompt lengths from "
        f"{meta.get('prompt_length_source')}; started {meta.get('started_at')}",
        "",
        "## Throughput",
        "",
        _md_table(THROUGHPUT_HEADER, throughput_rows(result["runs"])),
        "",
        "## Latency (ms)",
        "",
        _md_table(LATENCY_HEADER, latency_rows(result["runs"])),
        "",
    ]
    srows = server_rows(result["runs"])
    if srows:
        parts += [
            "## Server side",
            "",
            "Per-request timings (ms) the server reported: queue wait, prefill, decode.",
            "",
            _md_table(SERVER_HEADER, srows),
            "",
        ]
    if result.get("compare_plan"):
        from glassbox.bench.compare import markdown_table

        parts += ["## Planner vs measured", "", markdown_table(result["compare_plan"]), ""]
    if n := notes(result):
        parts += ["## Notes", ""] + [f"- {x}" for x in n] + [""]
    if plots:
        parts += ["## Plots", ""] + [f"![{Path(p).stem}]({Path(p).name})" for p in plots] + [""]
    return "\n".join(parts)


def _flatten(run: dict[str, Any]) -> dict[str, Any]:
    flat: dict[str, Any] = {}
    for key, value in run.items():
        if key in ("errors", "error_examples", "goodput"):
            flat[key] = json.dumps(value) if value else ""
        elif key == "server":
            for sk, sv in (value or {}).items():
                if isinstance(sv, dict):
                    flat.update({f"server_{sk}_{q}": v for q, v in sv.items()})
                else:
                    flat[f"server_{sk}"] = sv
        elif isinstance(value, dict):
            flat.update({f"{key}_{q}": v for q, v in value.items()})
        else:
            flat[key] = value
    return flat


def write_csv(runs: list[dict[str, Any]], path: Path) -> None:
    """One row per run; distributions become KEY_mean, KEY_p50, ... columns."""
    rows = [_flatten(r) for r in runs]
    fields: list[str] = []
    for row in rows:
        fields += [k for k in row if k not in fields]
    with path.open("w", newline="", encoding="utf-8") as f:
        w = csv.DictWriter(f, fieldnames=fields)
        w.writeheader()
        w.writerows(rows)


def write_outputs(result: dict[str, Any], out_dir: Path) -> list[Path]:
    """results.json, results.csv, report.md and the plots in ``out_dir``; returns the paths written."""
    from glassbox.bench.plots import write_plots

    out_dir.mkdir(parents=True, exist_ok=True)
    written = [out_dir / "results.json", out_dir / "results.csv"]
    written[0].write_text(json.dumps(result, indent=2) + "\n", encoding="utf-8")
    write_csv(result["runs"], written[1])
    plots = write_plots(result["runs"], out_dir)
    md = out_dir / "report.md"
    md.write_text(markdown(result, [str(p) for p in plots]), encoding="utf-8")
    return written + [md] + plots
