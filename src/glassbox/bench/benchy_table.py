"""The table the DGX Spark community publishes: llama-benchy's pp/tg rows at context depths and concurrency
levels (github.com/eugr/llama-benchy, src/llama_benchy/results.py), from request timelines.

``glassbox bench URL --depth ...`` fills the timelines from streamed requests (bench/benchy.py) and
``glassbox plan MODEL --depth ...`` from the simulator (perf/benchy_plan.py); both print them here, so a
measured table, a predicted one and a published one read line by line. What each figure is, as llama-benchy
computes it (one *run* is ``c`` requests sent at once, each with ``depth + pp`` fresh prompt tokens):

- ``pp`` ``t/s``: prompt tokens / est_ppt (c = 1); with c > 1 ``t/s (total)`` is the run's prompt tokens /
  (last first-token time - first send) and ``t/s (req)`` the mean of the requests' own rates.
- ``tg`` ``t/s``: (tokens - 1) / (end - first token) per request; with c > 1 ``t/s (total)`` is the run's
  (tokens - requests) / (last token time - first first-token time).
- ``peak t/s``: the most tokens streamed in any 1 s window (over all requests of a run; a run shorter than
  1 s: its tokens / its span); ``peak t/s (req)`` the mean of each request's own.
- ``ttfr``: send to the first streamed chunk with a choice; ``e2e_ttft``: to the first content;
  ``est_ppt`` = ttfr - the latency measured before the runs (the prompt's processing, network excluded).
- every figure is the mean ± the (population) standard deviation over the runs' values; times in ms.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any


@dataclass
class Timeline:
    """One request, times in seconds on one clock: sent, first chunk, first content, each content chunk
    (``token_times``), end of stream; tokens as counted by usage (or chunks)."""

    start: float
    first_response: float | None
    first_token: float | None
    end: float
    prompt_tokens: int
    output_tokens: int
    token_times: list[float] = field(default_factory=list)


@dataclass
class BenchyTest:
    """One row pair's worth of runs: ``runs[i]`` is the i-th batch of ``concurrency`` requests."""

    depth: int
    pp: int
    tg: int
    concurrency: int
    runs: list[list[Timeline]]
    latency_s: float = 0.0
    failed: int = 0  # requests that got no answer (left out of the figures)
    error: str = ""  # the first failure's class and message


def peak_rate(times: list[float], window: float = 1.0) -> float:
    """Most timestamps in any ``window``-long span / window (llama-benchy's peak; a burst shorter than the
    window: its count over its own span)."""
    if not times:
        return 0.0
    ts = sorted(times)
    span = ts[-1] - ts[0]
    if 0 < span < window:
        return len(ts) / span
    best, lo = 0, 0
    for hi, t in enumerate(ts):
        while lo < hi and ts[lo] <= t - window:
            lo += 1
        best = max(best, hi - lo + 1)
    return best / window


@dataclass
class _Values:
    pp: list[float] = field(default_factory=list)  # per request
    tg: list[float] = field(default_factory=list)
    pp_total: list[float] = field(default_factory=list)  # per run
    tg_total: list[float] = field(default_factory=list)
    peak: list[float] = field(default_factory=list)
    peak_req: list[float] = field(default_factory=list)
    ttfr: list[float] = field(default_factory=list)
    est_ppt: list[float] = field(default_factory=list)
    e2e_ttft: list[float] = field(default_factory=list)


def _add_run(v: _Values, batch: list[Timeline], expected_prompt: int, latency: float) -> None:
    done = [r for r in batch if r.first_token is not None]
    if not done:
        return
    prompt_total = 0
    for r in done:
        assert r.first_token is not None
        # llama-benchy trusts the server's prompt count within 20% of what was asked
        ok = r.prompt_tokens > 0 and abs(r.prompt_tokens - expected_prompt) < 0.2 * expected_prompt
        prompt = r.prompt_tokens if ok else expected_prompt
        prompt_total += prompt
        ttfr = (r.first_response if r.first_response is not None else r.first_token) - r.start
        est = max(0.0, ttfr - latency)
        v.ttfr.append(ttfr)
        v.e2e_ttft.append(r.first_token - r.start)
        v.est_ppt.append(est)
        if est > 0:
            v.pp.append(prompt / est)
        if r.output_tokens > 1 and r.end > r.first_token:
            v.tg.append((r.output_tokens - 1) / (r.end - r.first_token))
        if r.token_times:
            v.peak_req.append(peak_rate(r.token_times))
    first_send = min(r.start for r in done)
    last_first = max(r.first_token or 0.0 for r in done)
    if last_first > first_send:
        v.pp_total.append(prompt_total / (last_first - first_send))
    first_first = min(r.first_token or 0.0 for r in done)
    last_token = max((r.token_times[-1] if r.token_times else r.end) for r in done)
    tokens = sum(r.output_tokens for r in done)
    if last_token > first_first and tokens > len(done):
        v.tg_total.append((tokens - len(done)) / (last_token - first_first))
    every = [t for r in done for t in r.token_times]
    if every:
        v.peak.append(peak_rate(every))


def _stat(values: list[float], scale: float = 1.0) -> dict[str, Any] | None:
    if not values:
        return None
    scaled = [x * scale for x in values]
    mean = sum(scaled) / len(scaled)
    std = math.sqrt(sum((x - mean) ** 2 for x in scaled) / len(scaled))
    return {"mean": mean, "std": std, "n": len(scaled)}


def rows(model: str, tests: list[BenchyTest]) -> list[dict[str, Any]]:
    """Two rows per test (``pp`` then ``tg``), named as llama-benchy names them (`pp2048 @ d4096 (c5)`;
    the concurrency suffix only when some test has c > 1)."""
    suffix = max((t.concurrency for t in tests), default=1) > 1
    out: list[dict[str, Any]] = []
    for t in tests:
        v = _Values()
        for batch in t.runs:
            _add_run(v, batch, t.depth + t.pp, t.latency_s)
        d = f" @ d{t.depth}" if t.depth > 0 else ""
        c = f" (c{t.concurrency})" if suffix else ""
        single = t.concurrency == 1
        base = {"model": model, "depth": t.depth, "concurrency": t.concurrency, "failed": t.failed}
        out.append(
            {
                **base,
                "test": f"pp{t.pp}{d}{c}",
                "t_s": _stat(v.pp if single else v.pp_total),
                "t_s_req": _stat(v.pp),
                "peak_t_s": None,
                "peak_t_s_req": None,
                "ttfr_ms": _stat(v.ttfr, 1e3),
                "est_ppt_ms": _stat(v.est_ppt, 1e3),
                "e2e_ttft_ms": _stat(v.e2e_ttft, 1e3),
            }
        )
        out.append(
            {
                **base,
                "test": f"tg{t.tg}{d}{c}",
                "t_s": _stat(v.tg if single else v.tg_total),
                "t_s_req": _stat(v.tg),
                "peak_t_s": _stat(v.peak),
                "peak_t_s_req": _stat(v.peak_req),
                "ttfr_ms": None,
                "est_ppt_ms": None,
                "e2e_ttft_ms": None,
            }
        )
    return out


def _cell(stat: dict[str, Any] | None, spread: bool) -> str:
    if stat is None:
        return ""
    return f"{stat['mean']:.2f} ± {stat['std']:.2f}" if spread else f"{stat['mean']:.2f}"


def markdown(table: list[dict[str, Any]], spread: bool = True) -> str:
    """llama-benchy's markdown table (tabulate's "pipe" layout: the model left-aligned, the rest right).
    ``spread``: figures as mean ± std (measured); without it, one value each (a prediction)."""
    many = max((r["concurrency"] for r in table), default=1) > 1
    if many:
        head = ["model", "test", "t/s (total)", "t/s (req)", "peak t/s", "peak t/s (req)"]
        keys = ["t_s", "t_s_req", "peak_t_s", "peak_t_s_req"]
    else:
        head, keys = ["model", "test", "t/s", "peak t/s"], ["t_s", "peak_t_s"]
    head += ["ttfr (ms)", "est_ppt (ms)", "e2e_ttft (ms)"]
    keys += ["ttfr_ms", "est_ppt_ms", "e2e_ttft_ms"]
    body = [[r["model"], r["test"], *(_cell(r[k], spread) for k in keys)] for r in table]
    widths = [max(len(h), *(len(row[i]) for row in body)) if body else len(h) for i, h in enumerate(head)]

    def line(cells: list[str]) -> str:
        parts = [cells[0].ljust(widths[0])] + [c.rjust(w) for c, w in zip(cells[1:], widths[1:], strict=True)]
        return "| " + " | ".join(parts) + " |"

    rule = "|:" + "-" * (widths[0] + 1) + "|" + "|".join("-" * (w + 1) + ":" for w in widths[1:]) + "|"
    return "\n".join([line(head), rule, *(line(row) for row in body)])
