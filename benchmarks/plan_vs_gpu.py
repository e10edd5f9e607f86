"""The planner against glassbox's own GPU measurements (benchmarks/gpu_bench.py results): fit the ``glassbox``
engine profile and check it on cells the fit did not see.

Cells, all from one gpu-<date>.json (the Llama-3.1-8B and Qwen3-0.6B shapes, dummy bf16 weights):
decode at batch 1 (tokens/s of a 256-token greedy run after a 128-token prompt) and at batch 16 (median step),
the time to first token of 1K, 4K and 8K-token prompts (one request, alone), and the 256-request throughput
run replayed through the planner's simulator (the engine's own scheduler; the same lengths, all at t=0).
The fit (grid search: eta_bw and step_overhead_s on decode at batch 1 and 16; eta_flops, eta_attn and
request_overhead_s on the 1K and 8K TTFTs, where a fixed cost, the linears and attention's quadratic term
weigh differently) uses those four cells; the host's
time per sequence per step (seq_overhead_s) is read off benchmarks/gpu_profile.py's batch-256 case (wall
less device-busy time per step, less the fitted fixed step overhead, over the batch). Held out: the 4K TTFT
and the throughput run. The hardware is the preset (datasheet) named by --hardware, so that the fitted
efficiencies are what `glassbox plan --hardware h100-sxm` applies.

    .venv/bin/python benchmarks/plan_vs_gpu.py benchmarks/results/gpu-2026-11-26.json \
        --profile benchmarks/results/gpu-profile-2026-11-26.json --hardware h100-sxm
"""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Callable, Sequence
from dataclasses import replace
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))
from gpu_bench import QWEN3_06B, workload  # noqa: E402

from glassbox.perf.cost_model import prefill_cost, step_cost  # noqa: E402
from glassbox.perf.engine_profiles import EngineProfile, get_engine  # noqa: E402
from glassbox.perf.hardware import HardwareSpec
from glassbox.perf.model_presets import load_model_facts  # noqa: E402
from glassbox.perf.probe import get_hardware  # noqa: E402
from glassbox.perf.quant import resolve_scheme  # noqa: E402
from glassbox.perf.simulator import SimRequestSpec, SimSettings, run_requests  # noqa: E402
from glassbox.sampling_params import SamplingParams  # noqa: E402

PARAMS = ("eta_bw", "eta_flops", "eta_attn", "step_overhead_s", "seq_overhead_s", "request_overhead_s")
FIT = ("decode_b1", "decode_b16", "ttft_1024", "ttft_8192")


def _setup(model: str) -> tuple[Any, Any]:
    facts = load_model_facts(model)
    return facts, resolve_scheme("bf16", facts.native_quant, facts.dtype, False, None)


def cells(run: dict[str, Any]) -> dict[str, dict[str, Any]]:
    """Measured seconds per cell, and how to predict each from (hardware, profile)."""
    dec, tp = run["parts"]["gb_decode"], run["parts"].get("gb_throughput", {})
    llama, qwen = _setup("llama-3.1-8b"), _setup("qwen3-0.6b")
    out: dict[str, dict[str, Any]] = {}

    def step(setup: tuple[Any, Any], batch: Sequence[tuple[int, int]]) -> Callable[..., float]:
        return lambda hw, eng: step_cost(*setup, hw, eng, batch).seconds

    ctx = dec["prompt_len"] + dec["decode_tokens"] // 2
    out["decode_b1"] = {"measured_s": 1 / dec["tok_s"], "what": "8B decode step, batch 1 (1 / tok/s)",
                        "predict": step(llama, [(1, ctx)])}  # fmt: skip
    if dec.get("decode_b16_step_ms_median"):
        out["decode_b16"] = {"measured_s": dec["decode_b16_step_ms_median"] / 1e3,
                             "what": "8B decode step, batch 16 (median)",
                             "predict": step(llama, [(1, dec["prompt_len"] + 32)] * 16)}  # fmt: skip
    for n in (1024, 4096, 8192):
        key = "ttft_8k_s" if n == 8192 else f"ttft_{n}_s"
        # results without ttft_cached_tokens (2026-11-26): each 4K prompt began with a 1K prompt's tokens,
        # so the prefix cache held its first 1024 (64 whole blocks): 3072 new tokens after 1024 cached
        cached = 1024 if n == 4096 and "ttft_cached_tokens" not in dec else 0
        if dec.get(key):
            out[f"ttft_{n}"] = {
                "measured_s": dec[key], "what": f"8B time to first token, {n}-token prompt, {cached} cached",
                "predict": lambda hw, eng, n=n, c=cached: (
                    eng.request_overhead_s + prefill_cost(*llama, hw, eng, n - c, c).seconds
                ),
            }  # fmt: skip
    if tp.get("wall_s"):
        reqs = workload(tp["requests"], QWEN3_06B["vocab_size"])
        specs = [SimRequestSpec(p, SamplingParams(max_tokens=o, ignore_eos=True)) for p, o in reqs]

        def sim(hw: HardwareSpec, eng: EngineProfile) -> float:
            settings = SimSettings(num_kv_blocks=1 << 20, max_num_seqs=256, max_num_batched_tokens=8192)
            return run_requests(specs, lambda b: step_cost(*qwen, hw, eng, b).seconds, settings).duration_s

        out["throughput_256"] = {"measured_s": tp["wall_s"], "what": "0.6B, 256 requests (simulated wall)",
                                 "predict": sim}  # fmt: skip
    return out


def fit(
    cs: dict[str, dict[str, Any]], hw: HardwareSpec, base: EngineProfile, per_seq: Callable[[float], float]
) -> EngineProfile:
    """The grid search; ``per_seq(step_overhead_s)`` gives the host time per sequence that goes with each
    candidate fixed step overhead (the profile's idle time less it)."""

    def err(eng: EngineProfile, keys: tuple[str, ...] = FIT) -> float:
        return sum((cs[k]["predict"](hw, eng) / cs[k]["measured_s"] - 1) ** 2 for k in keys if k in cs)

    # decode (batch 1 and 16) is memory-bound and prefill compute-bound at these sizes: two smaller searches
    decode = min(
        (
            replace(base, eta_bw=bw / 100, step_overhead_s=so / 1e5, seq_overhead_s=per_seq(so / 1e5))
            for bw in range(40, 101)
            for so in range(0, 150, 5)
        ),
        key=lambda e: err(e, FIT[:2]),
    )
    grid = [
        replace(decode, eta_flops=fl / 100, eta_attn=at / 100, request_overhead_s=ro / 1e3)
        for fl in range(30, 101, 2)
        for at in range(10, 101, 2)
        for ro in range(0, 41, 2)
    ]
    return min(grid, key=err)


def seq_overhead(profile: dict[str, Any], step_overhead_s: float) -> float:
    """Host seconds per sequence per step: gpu_profile's batch-256 case, its wall less device-busy time per
    step, less the fixed step overhead, over its sequences."""
    case = profile["cases"].get("decode_b256_qwen06b", {})
    if "wall_ms_per_step" not in case:
        return 0.0
    idle = (case["wall_ms_per_step"] - case["busy_ms_per_step"]) / 1e3
    return max(0.0, idle - step_overhead_s) / case["batch"]


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("result", help="a benchmarks/gpu_bench.py gpu-<date>.json")
    ap.add_argument(
        "--profile", help="a benchmarks/gpu_profile.py gpu-profile-<date>.json (host time per sequence)"
    )
    ap.add_argument("--hardware", default="h100-sxm")
    ap.add_argument("--out", help="where to write the comparison (default: beside the result)")
    args = ap.parse_args()
    run = json.loads(Path(args.result).read_text())
    hw = get_hardware(args.hardware)
    shipped = get_engine("glassbox")
    cs = cells(run)
    profile = json.loads(Path(args.profile).read_text()) if args.profile else {"cases": {}}
    fitted = fit(cs, hw, shipped, lambda step_s: round(seq_overhead(profile, step_s), 7))
    rows: dict[str, Any] = {}
    print(f"{run['device']} vs --hardware {args.hardware}; fitted on {', '.join(FIT)}")
    print(
        f"{'cell':16s} {'measured':>10s} {'shipped':>10s} {'err':>7s} {'fitted':>10s} {'err':>7s}  held out"
    )
    for key, c in cs.items():
        m, a, b = c["measured_s"], c["predict"](hw, shipped), c["predict"](hw, fitted)
        rows[key] = {"what": c["what"], "measured_s": m, "shipped_s": a, "fitted_s": b,
                     "fitted_error": b / m - 1, "held_out": key not in FIT}  # fmt: skip
        print(f"{key:16s} {m:10.4f} {a:10.4f} {a / m - 1:+7.0%} {b:10.4f} {b / m - 1:+7.0%}  "
              f"{'yes' if key not in FIT else ''}")  # fmt: skip
    print(f"fitted: eta_bw {fitted.eta_bw:.2f}, eta_flops {fitted.eta_flops:.2f}, eta_attn {fitted.eta_attn:.2f}, "
          f"step overhead {fitted.step_overhead_s * 1e3:.2f} ms, {fitted.seq_overhead_s * 1e6:.1f} us per sequence, "
          f"request overhead {fitted.request_overhead_s * 1e3:.0f} ms")  # fmt: skip
    result = {
        "source": args.result,
        "device": run["device"],
        "hardware": args.hardware,
        "fit_cells": list(FIT),
        "fitted": {k: getattr(fitted, k) for k in PARAMS},
        "shipped": {k: getattr(shipped, k) for k in PARAMS},
        "cells": rows,
    }
    out = Path(args.out) if args.out else Path(args.result).with_name(f"plan-vs-{Path(args.result).name}")
    out.write_text(json.dumps(result, indent=2) + "\n")
    print(f"wrote {out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
