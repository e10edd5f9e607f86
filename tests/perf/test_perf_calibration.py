"""Engine profiles vs published DGX Spark rows (perf/spark_rows.py): the stored constants are the refit of
the fit rows, fit rows are reproduced, and the held-out rows stay inside the bounds the issue set
(long-prompt TTFT within 30%) or the errors recorded in benchmarks/results/planner-fit-2026-11-28.md."""

from __future__ import annotations

from dataclasses import replace

import pytest

from glassbox.perf.calibrate import error, fit_engine, fit_step_sync, leave_one_model_out, mape, predict
from glassbox.perf.engine_profiles import PROFILES
from glassbox.perf.spark_rows import ROWS, Row, rows
from glassbox.perf.tensor_parallel import INTERCONNECTS

ENGINES = ("ollama", "llama.cpp", "sglang", "vllm", "trt-llm")
# a fit row's error: the one-parameter-per-kind fit leaves a residual where rows of one kind disagree
# (vLLM: one request overhead for Nemotron's 58-token and the 8B's 29-token TTFT; 15% apart)
FIT_TOLERANCE = {"decode": 0.06, "prefill": 0.03, "ttft": 0.16, "tp_speedup": 0.01}


@pytest.mark.parametrize("name", ENGINES)
def test_stored_profile_matches_refit(name: str) -> None:
    fit = fit_engine(name, rows(name, "fit"))
    for field, value in fit.values.items():
        stored = getattr(PROFILES[name], field)
        assert stored == pytest.approx(value, rel=0.02, abs=0.002), (
            f"{name}.{field}: stored {stored}, fit {value}"
        )


def test_stored_step_sync_matches_refit() -> None:
    fitted = fit_step_sync(rows("vllm", "fit"), PROFILES["vllm"])
    assert INTERCONNECTS["200gbe-roce"].step_sync_s == pytest.approx(fitted, rel=0.02)


@pytest.mark.parametrize("row", rows(split="fit"), ids=lambda r: r.label)
def test_fit_rows_reproduced(row: Row) -> None:
    assert abs(error(row, PROFILES[row.engine])) < FIT_TOLERANCE[row.kind]


def test_long_prompt_ttft_within_30_percent() -> None:
    # issue 41's target: Llama 3.3 70B NVFP4, 32K prompt, vLLM: 33 s on one Spark, 21 s on two
    long = [r for r in rows("vllm", "held", ("ttft",)) if r.prompt >= 32768]
    assert {r.tp for r in long} == {1, 2}
    for r in long:
        assert abs(error(r, PROFILES["vllm"])) < 0.30, r.label


def test_fp4_prompt_gemms_are_what_close_the_long_prompt_gap() -> None:
    # the same rows with the linears widened to bf16 (the model before): 98 s and 53 s, off by 3x and 2.5x
    widened = replace(PROFILES["vllm"], native_fp4=False)
    for r in rows("vllm", "held", ("ttft",)):
        if r.prompt >= 32768:
            assert error(r, widened) > 1.0, r.label


def test_held_out_errors_no_worse_than_recorded() -> None:
    # regressions guard: the held-out MAPEs recorded in benchmarks/results/planner-fit-2026-11-28.md
    # (+1 point of slack for float noise); where they miss the targets the note says so
    recorded = {("llama.cpp", "decode"): 0.082, ("llama.cpp", "prefill"): 0.168, ("vllm", "ttft"): 0.240}
    for (name, kind), bound in recorded.items():
        errs = [error(r, PROFILES[name]) for r in rows(name, "held", (kind,))]
        assert mape(errs) <= bound + 0.01, (name, kind, mape(errs))


def test_leave_one_model_out_runs_for_every_multi_model_engine() -> None:
    for name in ("ollama", "llama.cpp", "vllm"):
        loo = leave_one_model_out(name, rows(name, "fit"))
        assert len(loo) >= 2
        assert all(pairs for pairs in loo.values())


def test_rows_name_sources_and_a_split() -> None:
    assert all(r.source and r.split in ("fit", "held", "excluded") for r in ROWS)
    assert {r.engine for r in rows(split="held")} >= {"llama.cpp", "vllm", "trt-llm"}


def test_ideal_is_an_upper_bound() -> None:
    for row in rows(kinds=("decode", "prefill", "ttft")):
        ideal = predict(row, PROFILES[row.engine].ceiling())
        real = predict(row, PROFILES[row.engine])
        assert (ideal <= real) if row.kind == "ttft" else (ideal >= real)


def test_efficiencies_inside_brief_range() -> None:
    # BRIEF: real engines reach 55-87% of the bandwidth ceiling in decode on a Spark.
    for name in ENGINES:
        assert 0.55 <= PROFILES[name].eta_bw <= 0.87
    assert all(0 < p.eta_flops <= 1 and 0 < p.moe_flops_factor <= 1 for p in PROFILES.values())
