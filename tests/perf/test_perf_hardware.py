"""Hardware presets (BRIEF's table) and the cached local probe."""

from __future__ import annotations

import argparse
import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from glassbox.perf import hardware_cli, machine_load, probe
from glassbox.perf.hardware import PRESETS
from glassbox.perf.probe import get_hardware, probe_local

# BRIEF.md's hardware table: bandwidth GB/s and dense BF16 TFLOP/s.
BRIEF = {
    "dgx-spark": (273, None),
    "h100-sxm": (3350, 989),
    "h200": (4800, 989),
    "b200": (8000, 2250),
    "a100-80g": (2039, 312),
    "rtx-4090": (1008, 165),
    "rtx-5090": (1792, 210),
}


@pytest.mark.parametrize("name", sorted(BRIEF))
def test_presets_match_brief(name: str) -> None:
    bw, bf16 = BRIEF[name]
    spec = PRESETS[name]
    assert spec.bandwidth_gbs == bw
    if bf16 is not None:
        assert spec.tflops["bf16"] == pytest.approx(bf16, rel=0.01)
    assert spec.source


def test_spark_semantics() -> None:
    spark = PRESETS["dgx-spark"]
    assert spark.unified_memory and spark.fp4_engine_support  # sm_121 FP4 GEMMs ship (vLLM, TRT-LLM)
    assert spark.tflops["fp4"] * 2 == 1000  # BRIEF: ~1 PFLOP FP4 *sparse*
    assert PRESETS["h100-sxm"].tflops["fp8"] == pytest.approx(1979)
    assert {"m4-max", "strix-halo", "h100-pcie"} <= set(PRESETS)


def test_unknown_hardware_names_the_flag() -> None:
    with pytest.raises(ValueError, match="--hardware must be one of"):
        get_hardware("abacus")
    with pytest.raises(ValueError, match="--dtype"):
        probe_local("cpu", "int3")


QUICK = {"budget_s": 0.1, "working_set": 64 << 20}  # small and short: these tests check the bookkeeping


def _rewrite(path: Path, edit: Callable[[dict[str, Any]], None]) -> None:
    rec = json.loads(path.read_text())
    edit(rec)
    path.write_text(json.dumps(rec))


def _quiet(rec: dict[str, Any]) -> None:
    """Mark every figure as taken on a quiet machine (this test machine is shared: the policy for busy
    figures is tested on its own below)."""
    for fig in rec["figures"].values():
        fig["load"]["busy"] = False


def test_probe_keeps_each_figures_own_time(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    """The real probe: per figure a value, time, threads, load and repetitions; a cached figure is reused;
    adding a dtype's FLOP/s leaves the bandwidth's time alone; a figure older than a day, or taken with
    other threads than the engine's, is measured again (and only that one)."""
    monkeypatch.setenv("GLASSBOX_CACHE_DIR", str(tmp_path))
    monkeypatch.setenv("GLASSBOX_NUM_THREADS", "1")
    path = tmp_path / "probe-cpu.json"
    spec = probe_local("cpu", "bfloat16", **QUICK)
    assert spec.measured and spec.name == "local"
    rec = json.loads(path.read_text())
    assert rec["version"] == probe.CACHE_VERSION
    assert set(rec["figures"]) == {"read_gbs", "tflops_bf16", "op_us"}  # op_us: the host's small-op time
    assert (
        spec.extra["op_s"] == pytest.approx(rec["figures"]["op_us"]["value"] * 1e-6)
        and spec.extra["op_s"] > 0
    )
    read = rec["figures"]["read_gbs"]
    assert spec.bandwidth_gbs == read["value"] == pytest.approx(max(read["reps"]), abs=1e-3)
    assert read["value"] > 0 and len(read["reps"]) == probe.REPS
    assert read["threads"] == 1 and read["working_set_mib"] == 64
    assert {"loadavg_1m", "other_cores", "cores", "busy"} <= set(read["load"])
    _rewrite(path, _quiet)
    mtime = path.stat().st_mtime_ns
    again = probe_local("cpu", "bfloat16", **QUICK)
    assert again.bandwidth_gbs == spec.bandwidth_gbs and path.stat().st_mtime_ns == mtime  # from the cache
    assert again.extra["warnings"] == []
    both = probe_local("cpu", "float32", **QUICK)  # a dtype not in the cache is measured and added
    rec2 = json.loads(path.read_text())
    assert set(both.tflops) == {"bf16", "fp32"} and both.bandwidth_gbs == spec.bandwidth_gbs
    for name in ("read_gbs", "tflops_bf16"):  # not re-stamped
        assert rec2["figures"][name]["unix_time"] == rec["figures"][name]["unix_time"]
    assert rec2["figures"]["tflops_fp32"]["unix_time"] > rec["figures"]["tflops_bf16"]["unix_time"]

    def age_read(r: dict[str, Any]) -> None:
        _quiet(r)
        r["figures"]["read_gbs"]["unix_time"] -= 2 * 86400
        r["figures"]["tflops_fp32"]["threads"] = 7

    _rewrite(path, age_read)
    probe_local("cpu", "float32", **QUICK)
    rec3 = json.loads(path.read_text())
    assert rec3["figures"]["read_gbs"]["unix_time"] > rec2["figures"]["read_gbs"]["unix_time"]  # stale
    assert rec3["figures"]["tflops_fp32"]["threads"] == 1  # measured again on the engine's threads
    assert rec3["figures"]["tflops_fp32"]["unix_time"] > rec2["figures"]["tflops_fp32"]["unix_time"]
    assert (
        rec3["figures"]["tflops_bf16"]["unix_time"] == rec2["figures"]["tflops_bf16"]["unix_time"]
    )  # untouched
    forced = probe_local("cpu", "bfloat16", force=True, **QUICK)
    assert set(forced.tflops) == {"bf16"}  # measured afresh: a new record
    assert (
        json.loads(path.read_text())["figures"]["read_gbs"]["unix_time"]
        > rec3["figures"]["read_gbs"]["unix_time"]
    )


def test_an_old_cache_layout_is_measured_afresh(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    """A cache with one time stamp for every figure (the first layout) is not trusted."""
    monkeypatch.setenv("GLASSBOX_CACHE_DIR", str(tmp_path))
    old = {"device": "cpu", "device_name": "x", "memory_gib": 1.0, "read_gbs": 1e6}
    old |= {"bandwidth_gbs": 1e6, "tflops": {"bf16": 1e6}, "measured_at": "2020-01-01T00:00:00"}
    (tmp_path / "probe-cpu.json").write_text(json.dumps(old))
    spec = probe_local("cpu", "bfloat16", **QUICK)
    assert spec.bandwidth_gbs < 1e5 and spec.tflops["bf16"] < 1e5
    assert json.loads((tmp_path / "probe-cpu.json").read_text())["version"] == probe.CACHE_VERSION


def _figure(value: float, age_s: float, busy: bool, threads: int = 2) -> dict[str, Any]:
    load = {"loadavg_1m": 1.9, "other_cores": 1.4 if busy else 0.1, "cores": 2, "busy": busy}
    return {"value": value, "measured_at": "then", "unix_time": 1e9 - age_s, "threads": threads, "load": load}


def test_which_figures_are_measured_again() -> None:
    now = 1e9
    assert probe.remeasure_reason(None, now, 2) == "missing"
    assert probe.remeasure_reason(_figure(1, 3600, False), now, 2) is None
    assert probe.remeasure_reason(_figure(1, 2 * 86400, False), now, 2) == "stale"
    assert probe.remeasure_reason(_figure(1, 60, False, threads=1), now, 2) == "threads"
    assert probe.remeasure_reason(_figure(1, 60, True), now, 2) == "busy"


def test_reports_flag_busy_and_old_figures() -> None:
    """What trace, plan and hardware print about the probe: a busy or old bandwidth or FLOP/s figure is
    named, a quiet fresh one is not."""
    import time

    fresh = time.time()
    rec = {"device": "cpu", "device_name": "test CPU", "memory_gib": 8.0, "figures": {}}
    rec["figures"] = {
        "read_gbs": _figure(20.0, 1e9 - fresh, busy=True),
        "tflops_bf16": _figure(0.4, 1e9 - fresh + 3 * 86400, busy=False),
    }
    spec = probe.spec_from_record(rec)
    assert spec.bandwidth_gbs == 20.0 and spec.tflops == {"bf16": 0.4}
    (busy,) = [w for w in spec.extra["warnings"] if "busy" in w]
    assert busy.startswith("read bandwidth") and "others 1.40 / 2 cores" in busy
    assert any(w.startswith("tflops bf16 is 72 hours old") for w in spec.extra["warnings"])
    assert len(spec.extra["warnings"]) == 2
    rec["figures"]["read_gbs"]["load"]["busy"] = False
    rec["figures"]["tflops_bf16"]["unix_time"] = fresh
    assert probe.spec_from_record(rec).extra["warnings"] == []


def test_machine_load() -> None:
    """Other processes' CPU is the machine's busy time less our own; the busy rule is half the cores."""
    a = machine_load.CpuSample(wall_s=0.0, busy_s=100.0, own_s=5.0)
    b = machine_load.CpuSample(wall_s=2.0, busy_s=103.0, own_s=6.0)  # 3 s busy, 1 s of it ours
    assert machine_load.other_cores(a, b) == pytest.approx(1.0)
    assert machine_load.other_cores(a, machine_load.CpuSample(2.0, None, 6.0)) is None
    assert machine_load.is_busy(1.1, 0.0, 2) and not machine_load.is_busy(0.9, 9.0, 2)
    assert machine_load.is_busy(None, 1.5, 2) and not machine_load.is_busy(None, 0.5, 2)
    s1 = machine_load.sample()
    sum(i * i for i in range(200_000))
    s2 = machine_load.sample()
    assert s2.own_s > s1.own_s and (s1.busy_s is None or s2.busy_s is not None and s2.busy_s >= s1.busy_s)
    assert probe.working_set_bytes("cpu") >= min(512 << 20, 16 * probe.last_level_cache_bytes(), 64 << 20)


def test_hardware_cli_probe_json(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """`glassbox hardware --probe --json` prints what the (real) probe measured and cached."""
    monkeypatch.setenv("GLASSBOX_CACHE_DIR", str(tmp_path))
    parser = argparse.ArgumentParser()
    hardware_cli.add_parser(parser.add_subparsers())
    args = parser.parse_args(["hardware", "--probe", "--device", "cpu", "--json"])
    assert args.func(args) == 0
    out = json.loads(capsys.readouterr().out)
    cached = json.loads((tmp_path / "probe-cpu.json").read_text())
    figures = cached["figures"]
    assert out["tflops"] == {"bf16": figures["tflops_bf16"]["value"], "fp32": figures["tflops_fp32"]["value"]}
    assert out["bandwidth_gbs"] == figures["read_gbs"]["value"] > 0
    assert out["extra"]["figures"] == figures and isinstance(out["extra"]["warnings"], list)


def test_real_measurements_are_plausible() -> None:
    bw = max(probe.copy_bandwidth_reps("cpu", 0.05, 64 << 20))
    read = max(probe.read_bandwidth_reps("cpu", 0.05, 64 << 20))
    assert 0.1 < read < 5000
    tflops = probe.measure_matmul("cpu", "float32", budget_s=0.05)
    assert 0.1 < bw < 5000  # GB/s: any CPU memory system
    assert 1e-4 < tflops < 1000
