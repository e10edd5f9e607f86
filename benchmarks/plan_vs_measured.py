"""The planner against glassbox itself on this machine: predicted vs measured prefill and decode.

For the demo model and a Qwen3-0.6B-shaped model, batch 1 and 8, it measures glassbox's engine steps
(prefill of 128-token prompts; decode at ~160 tokens of context) and predicts them with the cost model on
`--hardware local` (this machine's probe). Two profiles are reported: the shipped `glassbox` profile and
`glassbox-cpu` (memory and arithmetic not overlapped, a per-layer host overhead), fitted here on three
batch-1 cells (Qwen3 decode and prefill, demo decode); every batch-8 cell and the demo prefill are held out.

    .venv/bin/python benchmarks/plan_vs_measured.py     # writes benchmarks/results/plan-vs-measured-<date>.json
"""

from __future__ import annotations

import functools
import json
import statistics
import sys
import time
from dataclasses import replace
from pathlib import Path
from typing import Any

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
from bench_models import qwen3_0_6b_random  # noqa: E402

from glassbox import LLM, SamplingParams  # noqa: E402
from glassbox.engine.llm_engine import DEMO_MODEL_DIR  # noqa: E402
from glassbox.models.facts import ModelFacts
from glassbox.perf.cost_model import step_cost  # noqa: E402
from glassbox.perf.engine_profiles import EngineProfile, get_engine  # noqa: E402
from glassbox.perf.hardware import HardwareSpec  # noqa: E402
from glassbox.perf.model_presets import load_model_facts  # noqa: E402
from glassbox.perf.probe import probe_local  # noqa: E402
from glassbox.perf.quant import QuantScheme, resolve_scheme  # noqa: E402

PROMPT, DECODE = 128, 48
BATCHES = (1, 8)
RESULTS = Path(__file__).resolve().parent / "results"


def measure(model_dir: Path, batch: int) -> dict[str, float]:
    """Median engine-step times: the prefill step of ``batch`` prompts, and decode steps of ``batch``."""
    llm = LLM(
        str(model_dir),
        dtype="bfloat16",
        enable_prefix_caching=False,
        max_num_seqs=batch,
        max_num_batched_tokens=max(2048, batch * PROMPT),
    )
    g = torch.Generator().manual_seed(batch)
    vocab = llm.engine.model_config.vocab_size
    sp = SamplingParams(temperature=0, max_tokens=DECODE, ignore_eos=True)
    prefill, decode = [], []
    for rep in range(3):  # the first round warms up; its steps are dropped
        prompts = [torch.randint(2, vocab, (PROMPT,), generator=g).tolist() for _ in range(batch)]
        llm.engine.step_records.clear()
        llm.generate(prompts, sp)
        if rep == 0:
            continue
        recs = list(llm.engine.step_records)
        prefill += [
            r.duration_s for r in recs if r.phase == "prefill" and r.num_prefill_tokens == batch * PROMPT
        ]
        decode += [r.duration_s for r in recs if r.phase == "decode" and r.batch_size == batch]
    return {
        "prefill_step_s": statistics.median(prefill),
        "decode_step_s": statistics.median(decode),
        "prefill_tok_s": batch * PROMPT / statistics.median(prefill),
        "decode_tok_s": batch / statistics.median(decode),
    }


@functools.cache
def _facts(model_dir: Path) -> tuple[ModelFacts, QuantScheme]:
    facts = load_model_facts(str(model_dir))
    return facts, resolve_scheme("native", facts.native_quant, facts.dtype, False, None)


def predict(model_dir: Path, hw: HardwareSpec, eng: EngineProfile, batch: int) -> dict[str, Any]:
    facts, scheme = _facts(model_dir)
    pre = step_cost(facts, scheme, hw, eng, [(PROMPT, 0)] * batch)
    dec = step_cost(facts, scheme, hw, eng, [(1, PROMPT + DECODE // 2)] * batch)
    return {
        "prefill_step_s": pre.seconds,
        "decode_step_s": dec.seconds,
        "prefill_bound": pre.bound,
        "decode_bound": dec.bound,
        "prefill_tok_s": batch * PROMPT / pre.seconds,
        "decode_tok_s": batch / dec.seconds,
    }


def fit(cells: dict[str, dict[str, Any]], models: dict[str, Path], hw: HardwareSpec) -> EngineProfile:
    """glassbox-cpu: no memory/compute overlap, a per-layer host overhead and two efficiencies, fitted by
    grid search on three cells (Qwen3 and demo decode at batch 1, Qwen3 prefill at batch 1); every batch-8
    cell and the demo prefill are held out."""
    base = replace(get_engine("glassbox"), name="glassbox-cpu", step_overhead_s=0.0, overlap=False)
    fit_cells = [("qwen3-0.6b", 1, "decode"), ("demo", 1, "decode"), ("qwen3-0.6b", 1, "prefill")]

    def err(eng: EngineProfile) -> float:
        total = 0.0
        for m, b, ph in fit_cells:
            measured = cells[f"{m} b{b}"]["measured"][f"{ph}_step_s"]
            total += (predict(models[m], hw, eng, b)[f"{ph}_step_s"] / measured - 1) ** 2
        return total

    grid = [
        replace(base, eta_bw=bw / 100, eta_flops=fl / 100, layer_overhead_s=lo / 1e5)
        for bw in range(40, 101, 2)
        for fl in range(20, 101, 4)
        for lo in range(0, 80, 2)
    ]
    return min(grid, key=err)


def main() -> int:
    qwen = qwen3_0_6b_random()
    hw = probe_local("cpu", "bfloat16")
    models = {"demo": DEMO_MODEL_DIR, "qwen3-0.6b": qwen}
    cells: dict[str, dict[str, Any]] = {}
    for name, d in models.items():
        for b in BATCHES:
            cells[f"{name} b{b}"] = {"model": name, "batch": b, "measured": measure(d, b)}
    shipped = get_engine("glassbox")
    fitted = fit(cells, models, hw)
    # the fit used Qwen3 decode and prefill and demo decode at batch 1: everything else is held out
    held_out = {
        "demo b1": ("prefill",),
        "demo b8": ("prefill", "decode"),
        "qwen3-0.6b b8": ("prefill", "decode"),
    }
    for key, cell in cells.items():
        d = models[cell["model"]]
        for label, eng in (("glassbox", shipped), ("glassbox-cpu", fitted)):
            pred = predict(d, hw, eng, cell["batch"])
            cell[label] = pred
            for ph in ("prefill", "decode"):
                cell[f"{label}_{ph}_error"] = pred[f"{ph}_tok_s"] / cell["measured"][f"{ph}_tok_s"] - 1
        cell["held_out"] = list(held_out.get(key, ()))
    result = {
        "date": time.strftime("%Y-%m-%d"),
        "machine": hw.source,
        "hardware": {"bandwidth_gbs": hw.bandwidth_gbs, "bf16_tflops": hw.peak_flops("bf16") / 1e12},
        "workload": {"prompt_tokens": PROMPT, "decode_tokens": DECODE},
        "fitted_profile": {
            "eta_bw": fitted.eta_bw,
            "eta_flops": fitted.eta_flops,
            "layer_overhead_s": fitted.layer_overhead_s,
            "overlap": fitted.overlap,
        },
        "cells": cells,
    }
    out = RESULTS / f"plan-vs-measured-{result['date']}.json"
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(result, indent=2) + "\n")
    print(
        f"fitted glassbox-cpu: eta_bw {fitted.eta_bw:.2f}, eta_flops {fitted.eta_flops:.2f}, "
        f"host overhead {fitted.layer_overhead_s * 1e6:.0f} us per layer per step, no memory/compute overlap"
    )
    print(
        f"{'cell':16s} {'phase':8s} {'measured':>10s} {'glassbox':>10s} {'err':>7s} {'-cpu':>10s} {'err':>7s}  held out"
    )
    for key, cell in cells.items():
        for ph in ("prefill", "decode"):
            m = cell["measured"][f"{ph}_tok_s"]
            a, b = cell["glassbox"][f"{ph}_tok_s"], cell["glassbox-cpu"][f"{ph}_tok_s"]
            print(
                f"{key:16s} {ph:8s} {m:10.1f} {a:10.1f} {a / m - 1:+7.0%} {b:10.1f} {b / m - 1:+7.0%}  "
                f"{'yes' if ph in cell['held_out'] else ''}"
            )
    print(f"wrote {out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
