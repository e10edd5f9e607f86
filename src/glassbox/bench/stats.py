"""Statistics of one run: counts, rates, latency distributions, goodput and the server's own split.

Definitions follow vLLM's benchmark: TTFT is the time to the first content chunk; TPOT is
(E2E - TTFT) / (output_tokens - 1) per request, so it excludes the first token; ITL is every gap between
content chunks, pooled over requests; throughput divides token totals of completed requests by the run's
duration.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Sequence
from typing import Any

import numpy as np

from glassbox.bench.client import RequestResult
from glassbox.bench.loadgen import RunRecord

PERCENTILES = (50, 90, 99)
SLO_KEYS = ("ttft", "tpot", "e2e")  # --slo ttft=0.5,tpot=0.05,e2e=10 (seconds)
SERVER_TIMES = ("queue_s", "prefill_s", "decode_s", "ttft_s", "e2e_s", "prefill_tok_s", "decode_tok_s")


def distribution(values: Sequence[float]) -> dict[str, float | None]:
    """{mean, p50, p90, p99} (numpy's linear interpolation); all None when there are no values."""
    if len(values) == 0:
        return {"mean": None, **{f"p{p}": None for p in PERCENTILES}}
    arr = np.asarray(values, dtype=np.float64)
    pct = np.percentile(arr, PERCENTILES)
    return {"mean": float(arr.mean()), **{f"p{p}": float(v) for p, v in zip(PERCENTILES, pct, strict=True)}}


def parse_slo(text: str | None) -> dict[str, float]:
    """'ttft=0.5,tpot=0.05' -> {"ttft": 0.5, "tpot": 0.05}; raises ValueError naming --slo."""
    if not text:
        return {}
    slo: dict[str, float] = {}
    for part in text.split(","):
        key, sep, value = part.partition("=")
        key = key.strip().lower().removesuffix("_s")
        if not sep or key not in SLO_KEYS:
            raise ValueError(f"--slo takes KEY=SECONDS pairs with KEY in {list(SLO_KEYS)}, got {part!r}")
        try:
            slo[key] = float(value)
        except ValueError:
            raise ValueError(f"--slo {key} must be a number of seconds, got {value!r}") from None
        if slo[key] <= 0:
            raise ValueError(f"--slo {key} must be positive, got {value}")
    return slo


def tpot_s(r: RequestResult) -> float | None:
    """Time per output token after the first; None for single-token answers."""
    if not r.ok or r.ttft_s is None or r.e2e_s is None or r.output_tokens < 2:
        return None
    return (r.e2e_s - r.ttft_s) / (r.output_tokens - 1)


def meets_slo(r: RequestResult, slo: dict[str, float]) -> bool:
    """Whether a completed request meets every given objective."""
    if not r.ok:
        return False
    values = {"ttft": r.ttft_s, "tpot": tpot_s(r), "e2e": r.e2e_s}
    return all(values[k] is None or values[k] <= limit for k, limit in slo.items())  # type: ignore[operator]


def _server_stats(done: list[RequestResult]) -> dict[str, Any] | None:
    with_metrics = [r.server for r in done if r.server]
    if not with_metrics:
        return None
    out: dict[str, Any] = {k: distribution([m[k] for m in with_metrics if k in m]) for k in SERVER_TIMES}
    prompt = sum(m.get("prompt_tokens", 0.0) for m in with_metrics)
    cached = sum(m.get("cached_prompt_tokens", 0.0) for m in with_metrics)
    out["requests_with_metrics"] = len(with_metrics)
    out["cached_prompt_tokens"] = int(cached)
    out["cached_prompt_fraction"] = cached / prompt if prompt else None
    return out


def summarize(record: RunRecord, slo: dict[str, float] | None = None) -> dict[str, Any]:
    """The run's row of the JSON report (keys are the stable schema; latencies are distributions)."""
    done = [r for r in record.results if r.ok]
    failed = [r for r in record.results if not r.ok]
    errors = Counter(str(r.error) for r in failed)
    examples: dict[str, str] = {}
    for r in failed:
        examples.setdefault(str(r.error), r.error_detail)
    duration = record.duration_s()
    out_tokens = sum(r.output_tokens for r in done)
    prompt_known = [r.prompt_tokens for r in done if r.prompt_tokens is not None]
    in_tokens = sum(prompt_known)
    per_s = (lambda x: x / duration) if duration > 0 else (lambda x: 0.0)
    tpots = [t for r in done if (t := tpot_s(r)) is not None]
    decode_rates = [
        (r.output_tokens - 1) / (r.e2e_s - r.ttft_s)
        for r in done
        if r.output_tokens > 1 and r.e2e_s is not None and r.ttft_s is not None and r.e2e_s > r.ttft_s
    ]
    prefill_rates = [r.prompt_tokens / r.ttft_s for r in done if r.prompt_tokens and r.ttft_s]
    cached = [r.cached_prompt_tokens for r in done if r.cached_prompt_tokens is not None]
    goodput = None
    if slo:
        good = sum(1 for r in done if meets_slo(r, slo))
        goodput = {
            "slo": dict(slo),
            "good_requests": good,
            "req_s": per_s(good),
            "fraction": good / len(record.results) if record.results else None,
        }
    w = record.workload
    return {
        "workload": w.name,
        "concurrency": record.concurrency,
        "rate": record.rate,
        "prompt_tokens": w.prompt_tokens,
        "output_tokens": w.output_tokens,
        "shared_prefix_tokens": w.shared_prefix_tokens,
        "completed": len(done),
        "failed": len(failed),
        "errors": dict(errors),
        "error_examples": examples,
        "duration_s": duration,
        "request_rate": per_s(len(done)),
        "output_tok_s": per_s(out_tokens),
        "total_tok_s": per_s(out_tokens + in_tokens),
        "total_output_tokens": out_tokens,
        "total_prompt_tokens": in_tokens,
        "mean_prompt_tokens": in_tokens / len(prompt_known) if prompt_known else None,
        "mean_output_tokens": out_tokens / len(done) if done else None,
        "cached_prompt_tokens": sum(cached) if cached else None,  # from usage, when the server reports it
        "short_outputs": sum(1 for r in done if r.output_tokens < r.max_tokens),
        "usage_reported": all(r.usage_reported for r in done) if done else None,
        "ttft_s": distribution([r.ttft_s for r in done if r.ttft_s is not None]),
        "tpot_s": distribution(tpots),
        "itl_s": distribution([g for r in done for g in r.itl_s]),
        "e2e_s": distribution([r.e2e_s for r in done if r.e2e_s is not None]),
        "per_request_decode_tok_s": distribution(decode_rates),
        "prefill_tok_s": distribution(prefill_rates),
        "goodput": goodput,
        "server": _server_stats(done),
        "interrupted": record.interrupted,
    }
