"""Unit tests of glassbox bench's pure parts: statistics, workloads and exact-length prompts, reports."""

from __future__ import annotations

import json
import random
from pathlib import Path

import numpy as np
import pytest
from bench_expectations import LATENCY_KEYS, RUN_KEYS
from tokenizer_factory import build_tokenizer_dir

from glassbox.bench.client import RequestResult, build_body, server_metrics
from glassbox.bench.loadgen import RunRecord
from glassbox.bench.report import write_outputs
from glassbox.bench.stats import distribution, parse_slo, summarize, tpot_s
from glassbox.bench.tokens import EstimateTokenCounter, LocalTokenCounter, calibrate
from glassbox.bench.workloads import (
    RequestSpec,
    Workload,
    count_dataset,
    default_grid,
    load_dataset,
    named_workloads,
)


@pytest.fixture(scope="module")
def counter(tmp_path_factory: pytest.TempPathFactory) -> LocalTokenCounter:
    return LocalTokenCounter(build_tokenizer_dir(tmp_path_factory.mktemp("tok")))


def test_distribution_matches_numpy() -> None:
    rng = np.random.default_rng(0)
    for n in (1, 2, 7, 100, 1001):
        xs = rng.exponential(0.2, n).tolist()
        d = distribution(xs)
        assert d["mean"] == pytest.approx(np.mean(xs))
        for q in (50, 90, 99):
            assert d[f"p{q}"] == pytest.approx(np.percentile(xs, q))
        assert d["p50"] <= d["p90"] <= d["p99"]  # type: ignore[operator]
    assert distribution([]) == {"mean": None, "p50": None, "p90": None, "p99": None}


def _result(start: float, ttft: float, e2e: float, out: int, prompt: int = 10, **kw: object) -> RequestResult:
    gaps = [(e2e - ttft) / (out - 1)] * (out - 1) if out > 1 else []
    return RequestResult(
        ok=True,
        start=start,
        ttft_s=ttft,
        e2e_s=e2e,
        itl_s=gaps,
        prompt_tokens=prompt,
        output_tokens=out,
        usage_reported=True,
        max_tokens=out,
        **kw,
    )  # type: ignore[arg-type]


def test_summary_counts_rates_and_tpot() -> None:
    rec = RunRecord(Workload("w", 10, 5), concurrency=2, t0=100.0)
    rec.results = [
        _result(100.0, 0.1, 0.5, 5),
        _result(100.0, 0.2, 1.2, 11, prompt=20),
        RequestResult(ok=False, start=100.5, e2e_s=0.01, error="http_400", error_detail="too long"),
        RequestResult(ok=False, start=100.6, e2e_s=0.01, error="http_400", error_detail="too long"),
        RequestResult(ok=False, start=100.7, e2e_s=2.0, error="timeout"),
    ]
    rec.t_end = 102.0
    s = summarize(rec, parse_slo("ttft=0.15,tpot=0.2"))
    assert RUN_KEYS <= set(s)
    assert s["completed"] == 2 and s["failed"] == 3
    assert s["errors"] == {"http_400": 2, "timeout": 1}
    assert s["error_examples"]["http_400"] == "too long"
    assert s["duration_s"] == pytest.approx(2.0)
    assert s["output_tok_s"] * s["duration_s"] == pytest.approx(16)
    assert s["total_tok_s"] * s["duration_s"] == pytest.approx(16 + 30)
    assert s["request_rate"] == pytest.approx(1.0)
    # TPOT excludes the first token: (0.5 - 0.1) / 4 and (1.2 - 0.2) / 10
    assert tpot_s(rec.results[0]) == pytest.approx(0.1)
    assert s["tpot_s"]["mean"] == pytest.approx((0.1 + 0.1) / 2)
    assert s["per_request_decode_tok_s"]["p50"] == pytest.approx(10.0)
    assert s["prefill_tok_s"]["mean"] == pytest.approx((10 / 0.1 + 20 / 0.2) / 2)
    assert s["goodput"]["good_requests"] == 1 and s["goodput"]["fraction"] == pytest.approx(1 / 5)
    assert s["server"] is None
    for key in LATENCY_KEYS:
        d = s[key]
        assert set(d) == {"mean", "p50", "p90", "p99"}
        assert d["p50"] <= d["p90"] <= d["p99"]


def test_server_metrics_distributions_and_llamacpp_timings() -> None:
    m = server_metrics(
        {
            "metrics": {
                "queue_s": 0.01,
                "prefill_s": 0.02,
                "decode_s": 0.3,
                "prompt_tokens": 100,
                "cached_prompt_tokens": 64,
                "note": "x",
            }
        }
    )
    assert m == {
        "queue_s": 0.01,
        "prefill_s": 0.02,
        "decode_s": 0.3,
        "prompt_tokens": 100.0,
        "cached_prompt_tokens": 64.0,
    }
    t = server_metrics(
        {"timings": {"prompt_n": 12, "prompt_ms": 30.0, "predicted_n": 8, "predicted_ms": 80.0}}
    )
    assert t == {"prefill_s": 0.03, "decode_s": 0.08, "prompt_tokens": 12.0, "output_tokens": 8.0}
    assert server_metrics({"choices": []}) is None
    rec = RunRecord(Workload("w", 10, 5), rate=1.0, t0=0.0)
    rec.results = [_result(0.0, 0.1, 0.5, 5, server=dict(m, queue_s=q)) for q in (0.0, 0.1, 0.2)]
    s = summarize(rec)["server"]
    assert s["queue_s"]["p50"] == pytest.approx(0.1)
    assert s["cached_prompt_fraction"] == pytest.approx(0.64)
    assert s["requests_with_metrics"] == 3


def test_parse_slo_rejects_bad_keys() -> None:
    assert parse_slo("ttft=0.5, tpot_s=0.05,e2e=3") == {"ttft": 0.5, "tpot": 0.05, "e2e": 3.0}
    with pytest.raises(ValueError, match="--slo"):
        parse_slo("latency=1")
    with pytest.raises(ValueError, match="--slo"):
        parse_slo("ttft=-1")


def test_prompts_have_exact_token_lengths(counter: LocalTokenCounter) -> None:
    builder = calibrate(counter)
    assert builder.exact and builder.source == "local"
    rng = random.Random(1)
    for n in (builder.overhead + 1, 16, 100, 257, 900):
        assert counter.count(builder.prompt(n, rng)) == n
    w = Workload("w", 64, 8)
    specs = [s for _, s in zip(range(3), w.requests(builder, seed=0), strict=False)]
    assert len({s.prompt for s in specs}) == 3
    assert all(counter.count(s.prompt) == 64 == s.prompt_tokens for s in specs)
    other = next(w.requests(builder, seed=1))
    assert other.prompt not in {s.prompt for s in specs}  # every run gets prompts of its own


def test_shared_prefix_prompts_share_their_first_tokens(counter: LocalTokenCounter) -> None:
    builder = calibrate(counter)
    w = Workload("sp", 96, 8, shared_prefix_tokens=64)
    a, b = (
        counter.tokenizer.encode(s.prompt) for _, s in zip(range(2), w.requests(builder, 0), strict=False)
    )
    c = counter.tokenizer.encode(next(w.requests(builder, 5)).prompt)
    assert len(a) == len(b) == len(c) == 96
    assert a[:64] == b[:64] == c[:64] and a != b


def test_estimate_counter_is_reported_as_such() -> None:
    builder = calibrate(EstimateTokenCounter())
    assert builder.source == "estimate" and not builder.exact
    assert len(builder.prompt(50, random.Random(0)).split()) == 50


def test_default_grid_fits_the_context() -> None:
    for ctx in (512, 1024, 4096, 131072, None):
        grid = default_grid(ctx)
        assert len(grid) == 9 and len({w.name for w in grid}) == 9
        assert all(w.prompt_tokens + w.output_tokens <= (ctx or 4096) for w in grid)
    big = {w.name: w for w in default_grid(131072)}
    assert big["large-large"].prompt_tokens == 8192 and big["small-small"].output_tokens == 32
    assert [w.name for w in named_workloads("shared-prefix", 1024, 200, 10, None)] == [
        "unique-prefix",
        "shared-prefix",
    ]
    with pytest.raises(ValueError, match="--workload"):
        named_workloads("nope", None, 1, 1, None)
    with pytest.raises(ValueError, match="--shared-prefix-tokens"):
        Workload("x", 10, 1, shared_prefix_tokens=11)


def test_dataset_jsonl(tmp_path: Path, counter: LocalTokenCounter) -> None:
    f = tmp_path / "d.jsonl"
    f.write_text('{"prompt": "def f(x): return x"}\n\n{"text": "import os", "output_tokens": 7}\n')
    w = load_dataset(f, default_output_tokens=20)
    assert [s.max_tokens for s in w.dataset] == [20, 7]
    count_dataset(w, counter)
    assert all(s.prompt_tokens == counter.count(s.prompt) for s in w.dataset)
    assert [s.prompt for _, s in zip(range(3), w.requests(calibrate(counter), 0), strict=False)] == [
        "def f(x): return x",
        "import os",
        "def f(x): return x",
    ]
    (tmp_path / "bad.jsonl").write_text('{"prompt": 3}\n')
    with pytest.raises(ValueError, match="bad.jsonl:1"):
        load_dataset(tmp_path / "bad.jsonl", 5)


def test_request_body_asks_for_fixed_output() -> None:
    from glassbox.bench.client import RequestOptions

    opts = RequestOptions("http://x", "m")
    body = build_body(RequestSpec("hi", 12, 3), opts)
    assert body["ignore_eos"] is True and body["min_tokens"] == 12 and body["stream_options"]["include_usage"]
    opts.fixed_output, opts.endpoint = False, "chat"
    body = build_body(RequestSpec("hi", 12, 3), opts)
    assert "ignore_eos" not in body and body["messages"] == [{"role": "user", "content": "hi"}]


def test_reports_and_plots_are_written(tmp_path: Path) -> None:
    runs = []
    for c in (1, 2, 4):
        rec = RunRecord(Workload("w", 10, 5), concurrency=c, t0=0.0)
        rec.results = [_result(0.0, 0.05 * c, 0.5 * c, 5) for _ in range(4)]
        runs.append(summarize(rec))
    rec = RunRecord(Workload("w", 10, 5), rate=2.0, t0=0.0)
    rec.results = [_result(0.0, 0.1, 0.5, 5)]
    runs.append(summarize(rec))
    result = {"meta": {"url": "http://x", "prompt_length_source": "server"}, "runs": runs}
    paths = write_outputs(result, tmp_path / "out")
    names = {p.name for p in paths}
    assert {
        "results.json",
        "results.csv",
        "report.md",
        "throughput_vs_concurrency.png",
        "latency_vs_concurrency.png",
        "throughput_vs_rate.png",
        "latency_vs_rate.png",
    } <= names
    for p in paths:
        assert p.stat().st_size > 0
    assert json.loads((tmp_path / "out" / "results.json").read_text())["runs"][2]["concurrency"] == 4
    csv_lines = (tmp_path / "out" / "results.csv").read_text().splitlines()
    assert len(csv_lines) == 5 and "ttft_s_p99" in csv_lines[0]
    assert "| w | c=4 |" in (tmp_path / "out" / "report.md").read_text()


def _stream_once(*events: dict[str, object]) -> RequestResult:
    """One request against a peer server (httpx's mock transport) that streams ``events`` then [DONE]."""
    import asyncio

    import httpx

    from glassbox.bench.client import RequestOptions, send_request
    from glassbox.bench.workloads import RequestSpec

    body = "".join(f"data: {json.dumps(e)}\n\n" for e in events) + "data: [DONE]\n\n"

    def answer(_: httpx.Request) -> httpx.Response:
        return httpx.Response(200, text=body, headers={"content-type": "text/event-stream"})

    async def go() -> RequestResult:
        async with httpx.AsyncClient(transport=httpx.MockTransport(answer)) as client:
            opts = RequestOptions(base_url="http://peer", model="m")
            return await send_request(client, RequestSpec(prompt="hi", prompt_tokens=1, max_tokens=3), opts)

    return asyncio.run(go())


def test_tokens_without_visible_text_finish_and_an_empty_stream_fails() -> None:
    # three special tokens (skipped in detokenization): the server sends only the finishing chunk
    finish = {"choices": [{"index": 0, "text": "", "finish_reason": "length"}]}
    usage = {"choices": [], "usage": {"prompt_tokens": 1, "completion_tokens": 3}}
    res = _stream_once(finish, usage)
    assert res.ok and res.output_tokens == 3 and res.ttft_s == res.ttfr_s and res.ttft_s is not None
    empty = _stream_once(finish, {"choices": [], "usage": {"prompt_tokens": 1, "completion_tokens": 0}})
    assert not empty.ok and empty.error == "no_output"


def test_the_client_drops_idle_connections_before_uvicorn_does() -> None:
    # a request sent on a connection the server closes at that moment fails; uvicorn closes after 5 s idle
    import uvicorn

    from glassbox.bench.client import client_limits

    expiry = client_limits().keepalive_expiry
    assert expiry is not None and expiry < uvicorn.Config(app=None).timeout_keep_alive
