"""The shipped ``glassbox`` engine profile against glassbox's own H100 measurements
(benchmarks/results/gpu-2026-11-26.json, fitted by benchmarks/plan_vs_gpu.py): the fitted cells closely, the
held-out ones (a 4K TTFT, a 256-request throughput run through the simulator) within 15%."""

from __future__ import annotations

import json
import sys
from dataclasses import replace
from pathlib import Path

from glassbox.perf.cost_model import step_cost
from glassbox.perf.engine_profiles import get_engine
from glassbox.perf.model_presets import load_model_facts
from glassbox.perf.probe import get_hardware
from glassbox.perf.quant import resolve_scheme

BENCH = Path(__file__).resolve().parents[2] / "benchmarks"
sys.path.insert(0, str(BENCH))
from plan_vs_gpu import FIT, cells  # noqa: E402


def test_glassbox_profile_predicts_its_h100_measurements() -> None:
    run = json.loads((BENCH / "results" / "gpu-2026-11-26.json").read_text())
    hw, eng = get_hardware("h100-sxm"), get_engine("glassbox")
    cs = cells(run)
    assert set(cs) >= {*FIT, "ttft_4096", "throughput_256"}
    for key, c in cs.items():
        err = c["predict"](hw, eng) / c["measured_s"] - 1
        assert abs(err) < (0.05 if key in FIT else 0.15), (key, err)


def test_seq_overhead_is_paid_per_sequence() -> None:
    facts = load_model_facts("qwen3-0.6b")
    scheme = resolve_scheme("bf16", facts.native_quant, facts.dtype, False, None)
    hw, base = get_hardware("h100-sxm"), replace(get_engine("glassbox"), seq_overhead_s=0.0)
    more = replace(base, seq_overhead_s=1e-3)
    for n in (1, 64):
        batch = [(1, 500)] * n
        extra = (
            step_cost(facts, scheme, hw, more, batch).seconds
            - step_cost(facts, scheme, hw, base, batch).seconds
        )
        assert abs(extra - n * 1e-3) < 1e-9
