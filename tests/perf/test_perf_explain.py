"""``plan --explain``: the terms add up to the figures they explain, by the step formula."""

from __future__ import annotations

import argparse
from dataclasses import replace

import pytest

from glassbox.perf import plan_cli
from glassbox.perf.cost_model import step_cost
from glassbox.perf.engine_profiles import PROFILES
from glassbox.perf.hardware import PRESETS
from glassbox.perf.model_presets import load_model_facts
from glassbox.perf.planner import PlanRequest, plan
from glassbox.perf.quant import resolve_scheme


@pytest.mark.parametrize("engine", ["vllm", "glassbox-cpu"])
def test_terms_add_up_to_the_step(engine: str) -> None:
    eng = replace(PROFILES[engine], step_overhead_s=1e-3, seq_overhead_s=2e-5)
    f = load_model_facts("qwen3-30b-a3b")
    s = resolve_scheme("nvfp4", f.native_quant, f.dtype, eng.gguf, eng.mixed_rest_format)
    for batch in ([(1, 4096)] * 3, [(2048, 0)]):
        t = step_cost(f, s, PRESETS["dgx-spark"], eng, batch).terms
        parts = t["linear_s"] + t["experts_s"] + t["lm_head_s"] + t["attention_s"] + t["scan_s"]
        assert parts == pytest.approx(t["compute_s"])
        busy = max(t["memory_s"], t["compute_s"]) if t["overlapped"] else t["memory_s"] + t["compute_s"]
        host = t["step_overhead_s"] + t["layer_overhead_s"] + t["seq_overhead_s"]
        assert t["seconds"] == pytest.approx(busy + t["prompt_prep_s"] + host + t["comm_s"])
        assert t["seq_overhead_s"] == pytest.approx(2e-5 * len(batch))


def test_plan_json_explains_prefill_decode_and_ttft() -> None:
    req = PlanRequest("llama-3.3-70b", "dgx-spark", "nvfp4", "vllm", 32768, 64, concurrency=(1,))
    out = plan(req)
    x = out["explain"]
    assert x["rates"]["linear_dtype"] == "fp4"  # the prompt GEMMs at the FP4 rate
    assert x["prefill"]["seconds"] == pytest.approx(out["prefill"]["seconds"], rel=1e-3)
    assert x["ttft"]["prefill_s"] + x["ttft"]["request_overhead_s"] == pytest.approx(out["ttft_s"], rel=1e-3)
    assert x["prefill"]["steps"] == out["prefill"]["steps"] == 4  # 8,192-token chunks


def test_cli_explain_prints_the_terms(capsys: pytest.CaptureFixture[str]) -> None:
    p = argparse.ArgumentParser()
    sub = p.add_subparsers()
    plan_cli.add_parser(sub)
    args = p.parse_args(
        ["plan", "llama-3.1-8b", "--hardware", "dgx-spark", "--concurrency", "1", "--explain"]
    )
    assert args.func(args) == 0
    text = capsys.readouterr().out
    assert "Why: the terms" in text and "attention_s" in text and "TTFT = prefill" in text
