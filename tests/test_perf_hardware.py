"""Hardware presets (BRIEF's table) and the cached local probe."""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import pytest

from glassbox.perf import hardware, hardware_cli
from glassbox.perf.hardware import PRESETS, get_hardware, probe_local

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
    assert spark.unified_memory and not spark.fp4_engine_support
    assert spark.tflops["fp4"] * 2 == 1000  # BRIEF: ~1 PFLOP FP4 *sparse*
    assert PRESETS["h100-sxm"].tflops["fp8"] == pytest.approx(1979)
    assert {"m4-max", "strix-halo", "h100-pcie"} <= set(PRESETS)


def test_unknown_hardware_names_the_flag() -> None:
    with pytest.raises(ValueError, match="--hardware must be one of"):
        get_hardware("abacus")
    with pytest.raises(ValueError, match="--dtype"):
        probe_local("cpu", "int3")


def test_probe_measures_and_caches(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    """The real probe (a few seconds): positive figures, written to the cache, reused until forced."""
    monkeypatch.setenv("GLASSBOX_CACHE_DIR", str(tmp_path))
    spec = probe_local("cpu", "bfloat16")
    assert spec.measured and spec.name == "local"
    assert spec.bandwidth_gbs > 0 and spec.tflops["bf16"] > 0
    rec = json.loads((tmp_path / "probe-cpu.json").read_text())
    assert rec["bandwidth_gbs"] == spec.bandwidth_gbs == max(rec["read_gbs"], rec["copy_gbs"])
    mtime = (tmp_path / "probe-cpu.json").stat().st_mtime_ns
    again = probe_local("cpu", "bfloat16")
    assert again.bandwidth_gbs == spec.bandwidth_gbs  # from the cache: a new measurement would differ
    assert (tmp_path / "probe-cpu.json").stat().st_mtime_ns == mtime
    both = probe_local("cpu", "float32")  # a dtype not in the cache is measured and added
    assert set(both.tflops) == {"bf16", "fp32"} and both.bandwidth_gbs == spec.bandwidth_gbs
    assert get_hardware("local").peak_flops("fp8") == spec.tflops["bf16"] * 1e12  # falls back to bf16
    forced = probe_local("cpu", "bfloat16", force=True)
    assert forced.bandwidth_gbs != spec.bandwidth_gbs  # measured afresh


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
    assert out["tflops"] == cached["tflops"] and set(out["tflops"]) == {"bf16", "fp32"}
    assert out["bandwidth_gbs"] == cached["bandwidth_gbs"] > 0


def test_real_measurements_are_plausible() -> None:
    bw = hardware.measure_bandwidth("cpu", budget_s=0.05)
    read = hardware.measure_read_bandwidth("cpu", budget_s=0.05)
    assert 0.1 < read < 5000
    tflops = hardware.measure_matmul("cpu", "float32", budget_s=0.05)
    assert 0.1 < bw < 5000  # GB/s: any CPU memory system
    assert 1e-4 < tflops < 1000
