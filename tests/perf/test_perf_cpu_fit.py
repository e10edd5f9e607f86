"""glassbox-cpu's host terms at the probe's op speed, and perf/cpu_fit.py's reading, merging and fitting of
plan_vs_trace.py runs, on hand-computed cases."""

from __future__ import annotations

from dataclasses import replace
from typing import Any

import pytest

from glassbox.perf import cpu_fit
from glassbox.perf.cost_model import step_cost
from glassbox.perf.engine_profiles import PROFILES
from glassbox.perf.hardware import HardwareSpec
from glassbox.perf.model_presets import load_model_facts
from glassbox.perf.quant import resolve_scheme

CPU = PROFILES["glassbox-cpu"]
MODEL = "llama-3.1-8b"  # a bf16 preset past 1 GiB: its decode cell is the one that fits eta_bw


def _host(op_s: float | None, host_op_s: float) -> float:
    facts = load_model_facts(MODEL)
    scheme = resolve_scheme("native", facts.native_quant, facts.dtype, False, None)
    hw = HardwareSpec("cpu", 64.0, 10.0, {"bf16": 0.5}, True, extra={} if op_s is None else {"op_s": op_s})
    eng = replace(
        CPU, host_op_s=host_op_s, step_overhead_s=1e-4, layer_overhead_s=2e-5, prompt_layer_overhead_s=1e-3,
        seq_overhead_s=3e-5,
    )  # fmt: skip
    return step_cost(facts, scheme, hw, eng, [(16, 0)]).overhead_s


def test_host_terms_scale_by_the_op_probe() -> None:
    # one 16-token prompt step of 32 layers: 1e-4 + (2e-5 + 1e-3) x 32 + 3e-5 = 0.03277 s where the op took
    # what it took at the fit; 3x slower ops (6 us against 2 us): 3x that; no op figure or no host_op_s: 1x
    base = 1e-4 + (2e-5 + 1e-3) * 32 + 3e-5
    assert _host(2e-6, 2e-6) == pytest.approx(base)
    assert _host(6e-6, 2e-6) == pytest.approx(3 * base)
    assert _host(None, 2e-6) == pytest.approx(base)
    assert _host(6e-6, 0.0) == pytest.approx(base)


def _probe(model: str, read: float, op_us: float = 2.0) -> dict[str, Any]:
    return {"model": model, "read_gbs_cpu": read, "tflops_cpu": 0.5, "op_us_cpu": op_us, "read_gbs": read,
            "tflops": 0.5, "op_us": op_us}  # fmt: skip


def _run(step: float, decode: float, read: float = 10.0) -> dict[str, Any]:
    cell = {
        "path": MODEL,
        "prefill": {"step_cpu_s": {"16": step}, "ttft_cpu_s": {"16": step + 1e-3},
                    "step_s": {"16": 2 * step}, "ttft_s": {"16": 2 * step}},
        "decode_context": 144, "decode_token_cpu_s": decode, "decode_token_s": 2 * decode,
    }  # fmt: skip
    return {"date": "d", "machine": "m", "torch": "t", "probes": [_probe(MODEL, read)], "cells": {"m1": cell}}


def test_cells_read_each_clock() -> None:
    cells = {c.label: c.measured for c in cpu_fit.cells(_run(0.2, 0.03), "cpu")}
    assert cells == {"m1 prefill p16": 0.2, "m1 ttft p16": pytest.approx(0.201), "m1 decode d144": 0.03}
    wall = {c.label: c.measured for c in cpu_fit.cells(_run(0.2, 0.03), "wall")}
    assert wall["m1 prefill p16"] == 0.4 and wall["m1 decode d144"] == 0.06


def test_merge_takes_each_figure_s_median_and_every_probe() -> None:
    merged = cpu_fit.merge([_run(0.1, 0.05), _run(0.9, 0.01), _run(0.2, 0.02)])
    c = merged["cells"]["m1"]
    assert c["prefill"]["step_cpu_s"]["16"] == 0.2 and c["decode_token_cpu_s"] == 0.02
    assert len(merged["probes"]) == 3 and merged["date"] == "d + d + d"


def test_fit_recovers_a_known_streaming_share() -> None:
    # the decode cell made by the cost model at eta_bw = 0.9 on a 10 GB/s probe: the fit, started at 0.78,
    # finds 0.9 (the golden-section search's tolerance: 1e-5 of the range's top, 4.0)
    true = replace(CPU, eta_bw=0.9)
    hw = HardwareSpec("cpu", 64.0, 10.0, {"bf16": 0.5}, True, extra={"op_s": 2e-6})
    probe_cell = cpu_fit.Cell("m1", MODEL, "decode", 1, 144, 1.0)
    run = _run(0.2, cpu_fit.predict(probe_cell, true, hw))
    decode = [c for c in cpu_fit.cells(run, "cpu") if c.kind == "decode"]
    fitted = cpu_fit.fit(run, decode, replace(CPU, eta_bw=0.78))
    assert fitted.eta_bw == pytest.approx(0.9, abs=1e-4)
    assert fitted.host_op_s == pytest.approx(2e-6)  # the run's op time, where its host terms were fitted
