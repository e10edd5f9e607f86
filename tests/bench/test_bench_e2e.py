"""glassbox bench against our real server (a subprocess serving a tiny random Llama on CPU)."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from bench_expectations import LATENCY_KEYS, RUN_KEYS
from server_harness import free_port
from tiny_models import build_tiny_model

from glassbox.cli import main

MAX_MODEL_LEN = 512


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return build_tiny_model("llama", tmp_path_factory.mktemp("models"))


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory, model_dir: Path) -> Iterator[str]:
    model = model_dir
    port = free_port()
    log = tmp_path_factory.mktemp("log") / "server.log"
    cmd = [
        sys.executable,
        "-m",
        "glassbox.cli",
        "serve",
        str(model),
        "--port",
        str(port),
        "--device",
        "cpu",
        "--max-model-len",
        str(MAX_MODEL_LEN),
        "--max-num-seqs",
        "16",
    ]
    with log.open("wb") as out:
        proc = subprocess.Popen(
            cmd, stdout=out, stderr=subprocess.STDOUT, env=dict(os.environ, OMP_NUM_THREADS="1")
        )
    url = f"http://127.0.0.1:{port}"
    deadline = time.monotonic() + 120
    while True:
        try:
            if httpx.get(url + "/v1/models", timeout=1.0).status_code == 200:
                break
        except httpx.HTTPError:
            pass
        if proc.poll() is not None or time.monotonic() > deadline:
            proc.kill()
            pytest.fail(f"server did not start: {log.read_text()[-3000:]}")
        time.sleep(0.3)
    yield url
    proc.send_signal(signal.SIGINT)
    try:
        proc.wait(timeout=20)
    except subprocess.TimeoutExpired:
        proc.kill()


def _bench(capsys: pytest.CaptureFixture[str], *argv: str) -> dict[str, Any]:
    capsys.readouterr()
    rc = main(["bench", *argv, "--json"])
    out = capsys.readouterr().out
    assert rc == 0, out
    return dict(json.loads(out))


def test_closed_loop_counts_percentiles_throughput_and_files(
    server: str, capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    res = _bench(
        capsys,
        server,
        "--concurrency",
        "1,4",
        "--num-requests",
        "12",
        "--prompt-tokens",
        "48",
        "--output-tokens",
        "24",
        "--slo",
        "ttft=5,tpot=1",
        "--out",
        str(tmp_path),
    )
    meta, runs = res["meta"], res["runs"]
    assert meta["prompt_length_source"] == "server" and meta["prompt_lengths_exact"]
    assert meta["max_model_len"] == MAX_MODEL_LEN
    assert [r["concurrency"] for r in runs] == [1, 4]
    for r in runs:
        assert RUN_KEYS <= set(r)
        for key in LATENCY_KEYS:
            d = r[key]
            assert set(d) == {"mean", "p50", "p90", "p99"}
            assert 0 < d["p50"] <= d["p90"] <= d["p99"], (key, d)
        assert (r["completed"], r["failed"]) == (12, 0), (r["errors"], r["error_examples"])
        assert r["short_outputs"] == 0 and r["usage_reported"]  # ignore_eos/min_tokens honoured
        assert r["mean_prompt_tokens"] == 48  # exact prompt length, per the server's usage
        assert r["total_output_tokens"] == 12 * 24
        assert r["output_tok_s"] * r["duration_s"] == pytest.approx(r["total_output_tokens"], rel=1e-6)
        assert r["total_tok_s"] * r["duration_s"] == pytest.approx(12 * (48 + 24), rel=1e-6)
        assert r["goodput"]["good_requests"] <= r["completed"]
        s = r["server"]
        assert s["requests_with_metrics"] == 12
        for key in ("queue_s", "prefill_s", "decode_s"):
            assert s[key]["p50"] is not None and s[key]["p50"] <= s[key]["p99"]
        # the client sees at least what the server measured
        assert r["e2e_s"]["p50"] >= s["decode_s"]["p50"]
    assert runs[1]["output_tok_s"] > runs[0]["output_tok_s"]
    for name in (
        "results.json",
        "results.csv",
        "report.md",
        "throughput_vs_concurrency.png",
        "latency_vs_concurrency.png",
    ):
        assert (tmp_path / name).stat().st_size > 0, name
    assert (tmp_path / "throughput_vs_concurrency.png").read_bytes()[:4] == b"\x89PNG"
    assert json.loads((tmp_path / "results.json").read_text())["runs"] == runs


def test_rejected_prompts_fail_with_their_reason_and_the_run_goes_on(
    server: str, capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    data = tmp_path / "mixed.jsonl"
    too_long = " ".join(["self"] * (MAX_MODEL_LEN + 50))
    data.write_text(
        "\n".join(
            json.dumps(x)
            for x in (
                {"prompt": "def main():", "output_tokens": 8},
                {"prompt": too_long, "output_tokens": 8},
                {"prompt": "import os\nimport sys", "output_tokens": 8},
            )
        )
        + "\n"
    )
    res = _bench(
        capsys, server, "--dataset", str(data), "--concurrency", "2", "--num-requests", "9", "--warmup", "0"
    )
    (run,) = res["runs"]
    assert run["completed"] == 6 and run["failed"] == 3
    assert run["errors"] == {"http_400": 3}
    assert "token" in run["error_examples"]["http_400"].lower()


def test_open_loop_and_too_long_synthetic_workload(server: str, capsys: pytest.CaptureFixture[str]) -> None:
    res = _bench(
        capsys,
        server,
        "--rate",
        "20",
        "--num-requests",
        "6",
        "--prompt-tokens",
        "600",
        "--output-tokens",
        "4",
        "--warmup",
        "1",
    )
    (run,) = res["runs"]
    assert run["rate"] == 20 and run["concurrency"] is None
    assert run["completed"] == 0 and run["failed"] == 6 and run["errors"] == {"http_400": 6}
    assert run["ttft_s"]["p50"] is None  # no data, same schema
    res = _bench(
        capsys, server, "--rate", "8", "--num-requests", "6", "--prompt-tokens", "16", "--output-tokens", "4"
    )
    assert res["runs"][0]["completed"] == 6


def test_shared_prefix_is_served_from_the_prefix_cache(
    server: str, capsys: pytest.CaptureFixture[str]
) -> None:
    res = _bench(
        capsys,
        server,
        "--workload",
        "shared-prefix",
        "--prompt-tokens",
        "160",
        "--output-tokens",
        "4",
        "--concurrency",
        "1",
        "--num-requests",
        "6",
    )
    unique, shared = res["runs"]
    assert (unique["workload"], shared["workload"]) == ("unique-prefix", "shared-prefix")
    assert shared["shared_prefix_tokens"] == 120
    assert unique["server"]["cached_prompt_fraction"] < 0.2
    assert shared["server"]["cached_prompt_fraction"] > 0.5


def _finished_requests(server: str) -> float:
    """The server's count of finished requests (all reasons), from /metrics."""
    text = httpx.get(server + "/metrics", timeout=5.0).text
    return sum(
        float(line.rsplit(" ", 1)[1])
        for line in text.splitlines()
        if line.startswith("glassbox:request_success_total{")
    )


def test_ctrl_c_still_reports_what_was_measured(server: str, tmp_path: Path) -> None:
    cmd = [
        sys.executable,
        "-m",
        "glassbox.cli",
        "bench",
        server,
        "--concurrency",
        "2",
        "--num-requests",
        "100000",
        "--prompt-tokens",
        "16",
        "--output-tokens",
        "8",
        "--json",
        "--out",
        str(tmp_path),
    ]
    before = _finished_requests(server)
    # A shell that runs this suite in the background ignores SIGINT, and children inherit that: give the
    # bench the default disposition a terminal's Ctrl-C would meet.
    proc = subprocess.Popen(
        cmd,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL),
    )
    deadline = time.monotonic() + 60
    # wait until measured requests have finished: past the 2 warm-up requests (other tests' requests on
    # this shared server are all done before this one starts, so the counter only moves for ours)
    while time.monotonic() < deadline and _finished_requests(server) < before + 2 + 4:
        time.sleep(0.1)
    proc.send_signal(signal.SIGINT)
    out, err = proc.communicate(timeout=120)  # 3 s quiet; over 30 s at load 5 (the report and its plots)
    assert proc.returncode == 130, err.decode()[-2000:]
    res = json.loads(out)
    assert res["meta"]["interrupted"] is True
    (run,) = res["runs"]
    assert run["interrupted"] is True and run["completed"] > 0
    assert (tmp_path / "results.json").is_file()


def test_compare_plan_pairs_predictions_with_measurements(
    server: str, model_dir: Path, capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    res = _bench(
        capsys,
        server,
        "--concurrency",
        "1",
        "--num-requests",
        "4",
        "--prompt-tokens",
        "32",
        "--output-tokens",
        "8",
        "--compare-plan",
        str(model_dir),
        "--hardware",
        "h100-sxm",
        "--out",
        str(tmp_path),
    )
    cmp = res["compare_plan"]
    assert cmp["hardware"] == "h100-sxm" and cmp["quant"] == "native"
    metrics = {(r["load"], r["metric"]) for r in cmp["rows"]}
    assert {("c=1", "decode tok/s (1 request)"), ("c=1", "TTFT p50 s"), ("c=1", "aggregate tok/s")} <= metrics
    for r in cmp["rows"]:
        if r["metric"] != "queue p50 s (server)":
            assert r["predicted"] > 0 and r["measured"] > 0
            assert r["ratio"] == pytest.approx(r["measured"] / r["predicted"])
    assert "## Planner vs measured" in (tmp_path / "report.md").read_text()
