"""llama-benchy's pp/tg table: its figures on hand-computed timelines, `glassbox plan --depth` on presets,
and `glassbox bench --depth` against a real `glassbox serve` of the demo model."""

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
from server_harness import free_port

from glassbox.bench.benchy_table import BenchyTest, Timeline, markdown, peak_rate, rows
from glassbox.cli import main
from glassbox.perf.benchy_plan import benchy_plan
from glassbox.perf.plan_request import PlanRequest
from glassbox.perf.planner import plan

# llama-benchy's own column names (src/llama_benchy/results.py, _generate_md_report)
HEAD_C1 = ["model", "test", "t/s", "peak t/s", "ttfr (ms)", "est_ppt (ms)", "e2e_ttft (ms)"]
HEAD_CN = ["model", "test", "t/s (total)", "t/s (req)", "peak t/s", "peak t/s (req)"] + HEAD_C1[4:]


def _two_requests() -> BenchyTest:
    # c = 2 sent at 0; 100-token prompts; 4 tokens each, 0.1 s apart; latency 0.1 s
    r1 = Timeline(0.0, 0.5, 0.5, 0.85, 100, 4, [0.5, 0.6, 0.7, 0.8])
    r2 = Timeline(0.0, 0.9, 0.9, 1.25, 0, 4, [0.9, 1.0, 1.1, 1.2])  # no usage: the asked 100 counts
    return BenchyTest(depth=64, pp=36, tg=4, concurrency=2, runs=[[r1, r2]], latency_s=0.1)


def test_figures_are_llama_benchys_on_a_hand_computed_run() -> None:
    pp, tg = rows("m", [_two_requests()])
    assert pp["test"] == "pp36 @ d64 (c2)" and tg["test"] == "tg4 @ d64 (c2)"
    approx = pytest.approx
    # est_ppt = ttfr - latency: 0.4 and 0.8 s -> 250 and 125 t/s per request
    assert pp["t_s_req"]["mean"] == approx(187.5) and pp["t_s_req"]["std"] == approx(62.5)
    assert pp["t_s"]["mean"] == approx(200 / 0.9)  # both prompts / (last first token - first send)
    assert pp["ttfr_ms"]["mean"] == approx(700.0) and pp["ttfr_ms"]["std"] == approx(200.0)
    assert pp["est_ppt_ms"]["mean"] == approx(600.0)
    assert tg["t_s_req"]["mean"] == approx(3 / 0.35)  # (4 - 1) / (end - first token)
    assert tg["t_s"]["mean"] == approx(6 / 0.7)  # (8 - 2) / (last token - first first token)
    assert tg["peak_t_s"]["mean"] == approx(8 / 0.7)  # all 8 tokens inside one second: count / span
    assert tg["peak_t_s_req"]["mean"] == approx(4 / 0.3)


def test_peak_is_the_busiest_one_second_window() -> None:
    # windows ending at each token: the one ending at 1.4 holds 0.5, 0.9, 1.0, 1.4
    assert peak_rate([0.0, 0.5, 0.9, 1.0, 1.4, 2.5]) == 4.0
    assert peak_rate([]) == 0.0


def test_markdown_has_llama_benchys_columns_and_names() -> None:
    one = BenchyTest(0, 2048, 32, 1, [[Timeline(0.0, 1.0, 1.0, 2.0, 2048, 32, [1.0, 2.0])]])
    text = markdown(rows("m", [one]))
    head, rule, first, second = text.splitlines()
    assert [c.strip() for c in head.strip("|").split("|")] == HEAD_C1
    assert rule.startswith("|:-") and rule.endswith(":|")
    assert " pp2048 |" in first and "2048.00 ± 0.00" in first  # 2048 tokens in 1 s
    assert " tg32 |" in second and "31.00 ± 0.00" in second
    many = markdown(rows("m", [one, _two_requests()]), spread=False)
    assert [c.strip() for c in many.splitlines()[0].strip("|").split("|")] == HEAD_CN
    assert "pp2048 (c1)" in many and "±" not in many


def test_plan_table_at_c1_is_the_single_request_plan() -> None:
    """The simulated table (step by step) against the plan's own phase sums, at depth 0 and 4096."""
    base = dict(model="llama-3.1-8b", hardware="dgx-spark", quant="q4_k_m", engine="llama.cpp")
    req = PlanRequest(**base, prompt_tokens=512, output_tokens=32, concurrency=(1, 4))  # type: ignore[arg-type]
    table = benchy_plan(req, [0, 4096])["benchy"]
    assert [r["test"] for r in table] == [
        "pp512 (c1)", "tg32 (c1)", "pp512 (c4)", "tg32 (c4)",
        "pp512 @ d4096 (c1)", "tg32 @ d4096 (c1)", "pp512 @ d4096 (c4)", "tg32 @ d4096 (c4)",
    ]  # fmt: skip
    for depth, pp, tg in ((0, table[0], table[1]), (4096, table[4], table[5])):
        single = plan(PlanRequest(**base, prompt_tokens=depth + 512, output_tokens=32, concurrency=(1,)))  # type: ignore[arg-type]
        # the same steps timed by the same cost model: equal to rounding (the plan rounds TTFT to 0.1 ms)
        assert pp["e2e_ttft_ms"]["mean"] == pytest.approx(single["ttft_s"] * 1e3, abs=0.06)
        # decode: the plan integrates 4 sampled steps over a context linear in length; the table times each
        assert tg["t_s"]["mean"] == pytest.approx(single["decode"]["tok_s"], rel=0.01)
    # four prompts at once share the prefill: each waits longer, the run's rate holds or rises
    assert table[2]["ttfr_ms"]["mean"] > table[0]["ttfr_ms"]["mean"]
    assert table[3]["t_s"]["mean"] > table[1]["t_s"]["mean"]  # batched decode: more tokens a second
    assert table[3]["t_s_req"]["mean"] < table[1]["t_s"]["mean"]  # each one slower
    assert table[4]["t_s"]["mean"] < table[0]["t_s"]["mean"]  # attention over 4K more: slower prompt


def test_plan_depth_cli_prints_the_table(capsys: pytest.CaptureFixture[str]) -> None:
    argv = ["plan", "qwen3-0.6b", "--hardware", "dgx-spark", "--engine", "vllm", "--depth", "0,4096"]
    assert main([*argv, "--concurrency", "1,5,10"]) == 0
    out = capsys.readouterr().out
    assert " pp2048 @ d4096 (c10) |" in out and " tg32 (c5) |" in out
    assert main([*argv, "--context", "10"]) == 2  # --context is --depth's job here
    assert "--context" in capsys.readouterr().err


@pytest.fixture(scope="module")
def demo_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    port = free_port()
    log = tmp_path_factory.mktemp("log") / "server.log"
    cmd = [sys.executable, "-m", "glassbox.cli", "serve", "glassbox-demo", "--port", str(port), "--device", "cpu",
           "--max-num-seqs", "4", "--max-model-len", "512"]  # fmt: skip
    with log.open("wb") as out:
        proc = subprocess.Popen(
            cmd, stdout=out, stderr=subprocess.STDOUT, env=dict(os.environ, OMP_NUM_THREADS="1")
        )
    url = f"http://127.0.0.1:{port}"
    deadline = time.monotonic() + 180
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


def _requests_served(url: str) -> float:
    text = httpx.get(url + "/metrics", timeout=10.0).text
    return sum(
        float(line.split()[-1])
        for line in text.splitlines()
        if line.startswith("glassbox:request_success_total")
    )


def test_bench_depth_against_a_real_server(
    demo_server: str, capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    before = _requests_served(demo_server)
    argv = ["bench", demo_server, "--depth", "0,48", "--concurrency", "1,2", "--prompt-tokens", "16",
            "--output-tokens", "6", "--runs", "2", "--latency-mode", "api", "--out", str(tmp_path)]  # fmt: skip
    assert main([*argv, "--json"]) == 0
    result: dict[str, Any] = json.loads(capsys.readouterr().out)
    # 3 latency probes are GETs; 1 warm-up + (1 + 2) requests x 2 runs x 2 depths
    assert _requests_served(demo_server) - before == 1 + 3 * 2 * 2
    table = result["benchy"]
    assert [r["test"] for r in table] == [
        "pp16 (c1)", "tg6 (c1)", "pp16 (c2)", "tg6 (c2)",
        "pp16 @ d48 (c1)", "tg6 @ d48 (c1)", "pp16 @ d48 (c2)", "tg6 @ d48 (c2)",
    ]  # fmt: skip
    assert not result["failures"] and result["meta"]["prompt_lengths_exact"]
    latency = result["meta"]["latency_ms"]
    for pp, tg in zip(table[::2], table[1::2], strict=True):
        n = 2 * (1 if pp["concurrency"] == 1 else 2)  # every request of both runs timed
        assert pp["ttfr_ms"]["n"] == n and tg["t_s_req"]["n"] == n
        # est_ppt is each ttfr less the measured latency, clamped at 0 (as llama-benchy does)
        ttfr, est = pp["ttfr_ms"]["mean"], pp["est_ppt_ms"]["mean"]
        assert ttfr - latency - 1e-6 <= est <= ttfr
        assert tg["peak_t_s"] is not None and tg["t_s"]["mean"] > 0
    md = (tmp_path / "benchy.md").read_text()
    assert [c.strip() for c in md.splitlines()[0].strip("|").split("|")] == HEAD_CN
    assert "latency mode: api" in md
