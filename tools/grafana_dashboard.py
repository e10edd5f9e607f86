"""Write docs/grafana/glassbox.json: a Grafana dashboard over the server's Prometheus metrics (/metrics).

Each panel is a PromQL query on the names server/metrics.py registers (``glassbox:`` prefix); the data
source is a dashboard variable, so the file imports into any Grafana with a Prometheus data source.
tests/server/test_dashboard.py checks that every metric a query names is one the server exposes.

Usage::

    python tools/grafana_dashboard.py            # rewrites docs/grafana/glassbox.json
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

OUT = Path(__file__).resolve().parent.parent / "docs" / "grafana" / "glassbox.json"
DS = {"type": "prometheus", "uid": "${datasource}"}
RATE = "[$__rate_interval]"


def quantiles(metric: str, by: str = "") -> list[tuple[str, str]]:
    """p50/p90/p99 of a histogram (per ``by`` label when given)."""
    group = f"le, {by}" if by else "le"
    legend = f"{{{{{by}}}}} " if by else ""
    return [
        (f"histogram_quantile({q}, sum by ({group}) (rate(glassbox:{metric}_bucket{RATE})))", f"{legend}p{p}")
        for q, p in ((0.5, 50), (0.9, 90), (0.99, 99))
    ]


def panel(
    title: str, targets: list[tuple[str, str]], unit: str, description: str, kind: str = "timeseries"
) -> dict[str, Any]:
    return {
        "type": kind,
        "title": title,
        "description": description,
        "datasource": DS,
        "fieldConfig": {"defaults": {"unit": unit}, "overrides": []},
        "options": {"legend": {"displayMode": "list", "placement": "bottom"}} if kind == "timeseries" else {},
        "targets": [
            {"datasource": DS, "expr": expr, "legendFormat": legend, "refId": chr(ord("A") + i)}
            for i, (expr, legend) in enumerate(targets)
        ],
    }


def row(title: str) -> dict[str, Any]:
    return {"type": "row", "title": title, "collapsed": False, "panels": []}


def panels() -> list[dict[str, Any]]:
    return [
        row("Load"),
        panel(
            "Requests running and waiting",
            [("glassbox:num_requests_running", "running"), ("glassbox:num_requests_waiting", "waiting")],
            "short",
            "Sequences in the running batch, and waiting for a slot (queueing).",
        ),
        panel(
            "KV cache in use",
            [("glassbox:kv_cache_usage_perc", "in use")],
            "percentunit",
            "Share of KV blocks held by live sequences (prefix-cache blocks that are free count as free).",
        ),
        panel(
            "KV cache blocks",
            [("glassbox:kv_cache_free_blocks", "free"), ("glassbox:kv_cache_total_blocks", "total")],
            "short",
            "Free and total KV-cache blocks.",
        ),
        row("The three numbers: queue, prefill (TTFT), decode"),
        panel("Time to first token", quantiles("time_to_first_token_seconds"), "s", "TTFT, queue included."),
        panel(
            "Inter-token latency",
            quantiles("inter_token_latency_seconds"),
            "s",
            "Gaps between a request's tokens.",
        ),
        panel("Queue wait", quantiles("request_queue_time_seconds"), "s", "Arrival to the first schedule."),
        panel(
            "Prefill time",
            quantiles("request_prefill_time_seconds"),
            "s",
            "First schedule to the first token.",
        ),
        panel("Decode time", quantiles("request_decode_time_seconds"), "s", "First token to the last."),
        panel(
            "End-to-end latency", quantiles("e2e_request_latency_seconds"), "s", "Arrival to the last token."
        ),
        row("Throughput"),
        panel(
            "Tokens per second",
            [
                (f"rate(glassbox:generation_tokens_total{RATE})", "generated"),
                (f"rate(glassbox:prompt_tokens_total{RATE})", "prompt"),
                (f"rate(glassbox:prompt_tokens_cached_total{RATE})", "prompt, from the prefix cache"),
            ],
            "short",
            "Generated and prompt tokens per second (prompt tokens counted once per sequence).",
        ),
        panel(
            "Requests per second by finish reason",
            [
                (
                    f"sum by (finished_reason) (rate(glassbox:request_success_total{RATE}))",
                    "{{finished_reason}}",
                )
            ],
            "reqps",
            "Requests ended: stop, length, abort.",
        ),
        panel(
            "Prefix-cache hit rate",
            [
                (
                    f"rate(glassbox:prefix_cache_hits_total{RATE}) / rate(glassbox:prefix_cache_queries_total{RATE})",
                    "hits / queried prompt tokens",
                )
            ],
            "percentunit",
            "Share of looked-up prompt tokens the prefix cache served.",
        ),
        panel(
            "Preemptions per second",
            [(f"rate(glassbox:num_preemptions_total{RATE})", "preemptions")],
            "short",
            "Sequences preempted (KV dropped, recomputed later): the KV cache is too small for the load.",
        ),
        row("Engine steps"),
        panel(
            "Step time by phase",
            quantiles("step_duration_seconds", "phase"),
            "s",
            "Engine step duration (schedule, execute, post-process) per phase: prefill, decode, mixed.",
        ),
        panel(
            "Steps per second and tokens per step",
            [
                (f"rate(glassbox:iteration_tokens_total_count{RATE})", "steps/s"),
                (
                    f"rate(glassbox:iteration_tokens_total_sum{RATE}) / rate(glassbox:iteration_tokens_total_count{RATE})",
                    "tokens/step",
                ),
            ],
            "short",
            "Engine steps per second and the tokens each computed (prompt chunks + one per decoding sequence).",
        ),
        panel(
            "Speculative decoding acceptance",
            [
                (
                    f"rate(glassbox:spec_decode_num_accepted_tokens_total{RATE}) / "
                    f"rate(glassbox:spec_decode_num_draft_tokens_total{RATE})",
                    "accepted / proposed",
                ),
                (
                    f"1 + rate(glassbox:spec_decode_num_accepted_tokens_total{RATE}) / "
                    f"rate(glassbox:spec_decode_num_drafts_total{RATE})",
                    "mean acceptance length",
                ),
            ],
            "short",
            "With --speculative-config: the share of draft tokens accepted and tokens per verifying step.",
        ),
    ]


def layout(items: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Ids and grid positions: rows full width, panels three to a row (8 of 24 columns, 8 high)."""
    y, x = 0, 0
    for i, p in enumerate(items, start=1):
        p["id"] = i
        if p["type"] == "row":
            if x:
                y, x = y + 8, 0
            p["gridPos"] = {"h": 1, "w": 24, "x": 0, "y": y}
            y += 1
            continue
        p["gridPos"] = {"h": 8, "w": 8, "x": x, "y": y}
        x += 8
        if x >= 24:
            y, x = y + 8, 0
    return items


def dashboard() -> dict[str, Any]:
    return {
        "title": "glassbox",
        "uid": "glassbox-server",
        "description": "glassbox serve: load, the three numbers (queue, TTFT, decode), throughput, engine steps.",
        "tags": ["glassbox", "llm", "inference"],
        "editable": True,
        "schemaVersion": 39,
        "version": 1,
        "refresh": "10s",
        "time": {"from": "now-30m", "to": "now"},
        "timezone": "browser",
        "templating": {
            "list": [
                {
                    "name": "datasource",
                    "label": "Prometheus",
                    "type": "datasource",
                    "query": "prometheus",
                    "current": {},
                    "hide": 0,
                }
            ]
        },
        "annotations": {"list": []},
        "panels": layout(panels()),
    }


def main() -> None:
    OUT.parent.mkdir(parents=True, exist_ok=True)
    OUT.write_text(json.dumps(dashboard(), indent=2) + "\n")
    print(f"wrote {OUT}")


if __name__ == "__main__":
    main()
