"""Fitting ``glassbox-cpu`` on glassbox's own measured runs on this CPU (benchmarks/plan_vs_trace.py).

A run holds, per model, the median prefill step and TTFT of one whole prompt of several lengths and the
decode time per token, each in wall time and in the process's CPU time, and the probe taken before each
model and round in both clocks. A *cell* is one of those figures. The cost model predicts a cell on a
HardwareSpec made of the probe the same model's rounds took (its median read bandwidth and bf16 matmul
rate): in CPU time (``clock="cpu"``: the figures a quiet machine gives, which hold when the load changes)
or in wall time (``clock="wall"``: what the load let both the probe and the engine do).

The fit: every constant at once, by rounds of golden-section searches, each over one constant's range with
the others held, of the summed squared log error of the fitted cells (``FIT_RANGES``); the prompt-prep
bytes are the design's (perf/cpu_terms.py), not fitted. ``leave_one_model_out`` refits without a model's
cells and reports the errors on them.
"""

from __future__ import annotations

import functools
import math
import statistics
from collections.abc import Sequence
from dataclasses import dataclass, replace
from typing import Any

from glassbox.models.facts import ModelFacts
from glassbox.perf.calibrate import _golden
from glassbox.perf.cost_model import prefill_cost, step_cost
from glassbox.perf.cpu_clock import spec
from glassbox.perf.engine_profiles import PROFILES, EngineProfile
from glassbox.perf.hardware import HardwareSpec
from glassbox.perf.model_presets import load_model_facts
from glassbox.perf.quant import QuantScheme, resolve_scheme

# The fitted constants in the order they are fitted, each on the cells it dominates (see ``fit``), and
# the range searched (shares, seconds, bytes)
STAGES: tuple[tuple[str, tuple[float, float]], ...] = (
    ("eta_bw", (0.1, 4.0)),
    ("step_overhead_s", (0.0, 0.02)),
    ("block_gemv_factor", (0.05, 2.0)),
    ("prompt_layer_overhead_s", (0.0, 0.01)),
    ("tile_flops_share", (0.01, 2.0)),
    ("eta_flops", (0.02, 2.0)),
    ("eta_attn", (0.005, 2.0)),
    ("activation_passes", (0.0, 200.0)),
    ("dequant_tail_bytes_per_value", (0.0, 400.0)),
)
SWEEPS = 6  # alternations of eta_flops and eta_attn
PASSES = 2


@dataclass(frozen=True)
class Cell:
    """One measured figure: a prefill step of ``prompt`` tokens (``kind`` "prefill"), a TTFT ("ttft") or a
    decode step per token after ``context`` tokens ("decode"), in seconds."""

    model: str  # the run's name for it (smollm2, demo, qwen3)
    path: str
    kind: str
    prompt: int
    context: int
    measured: float

    @property
    def label(self) -> str:
        size = f"p{self.prompt}" if self.kind != "decode" else f"d{self.context}"
        return f"{self.model} {self.kind} {size}"


def cells(run: dict[str, Any], clock: str = "cpu") -> list[Cell]:
    """The run's cells in ``clock`` ("cpu" or "wall")."""
    suffix = "_cpu_s" if clock == "cpu" else "_s"
    out = []
    for name, c in run["cells"].items():
        for kind in ("prefill", "ttft"):
            key = ("step" if kind == "prefill" else "ttft") + suffix
            for n, t in c["prefill"][key].items():
                out.append(Cell(name, c["path"], kind, int(n), 0, float(t)))
        out.append(
            Cell(name, c["path"], "decode", 1, int(c["decode_context"]), float(c[f"decode_token{suffix}"]))
        )
    return out


def hardware(run: dict[str, Any], model: str, clock: str = "cpu") -> HardwareSpec:
    """The probes of ``model``'s rounds (their medians) as a HardwareSpec in ``clock``."""
    name = run["cells"][model]["path"].rstrip("/").rsplit("/", 1)[-1]
    return spec([p for p in run["probes"] if p["model"] == name], clock)


@functools.cache
def _model(path: str) -> tuple[ModelFacts, QuantScheme]:
    facts = load_model_facts(path)  # glassbox-cpu reads a file as stored (no GGUF-engine rewrites)
    return facts, resolve_scheme("native", facts.native_quant, facts.dtype, False, None)


def predict(cell: Cell, engine: EngineProfile, hw: HardwareSpec) -> float:
    """The cost model's seconds for ``cell`` (one step per prompt: the runs' chunk holds every prompt)."""
    facts, scheme = _model(cell.path)
    if cell.kind == "decode":
        return step_cost(facts, scheme, hw, engine, [(1, cell.context)]).seconds
    pre = prefill_cost(facts, scheme, hw, engine, cell.prompt).seconds
    return pre + (engine.request_overhead_s if cell.kind == "ttft" else 0.0)


def errors(
    run: dict[str, Any], engine: EngineProfile, clock: str = "cpu", only: Sequence[Cell] | None = None
) -> list[tuple[Cell, float, float]]:
    """(cell, predicted, predicted / measured - 1) for every cell (or ``only``)."""
    hws = {m: hardware(run, m, clock) for m in run["cells"]}
    return [
        (c, p, p / c.measured - 1.0)
        for c in (only or cells(run, clock))
        for p in [predict(c, engine, hws[c.model])]
    ]


def _uses(c: Cell, name: str) -> bool:
    """Whether cell ``c`` is among those that fit constant ``name`` (the cells it dominates)."""
    facts, scheme = _model(c.path)
    blocks, decode = scheme.main.family == "blocks", c.kind == "decode"
    dense16 = scheme.main.is_16bit
    if name == "eta_bw":  # weights streamed from memory: a bf16 decode step of a model far past the LLC
        return decode and dense16 and facts.total_params * 2 > 2**30
    if name == "step_overhead_s":  # the engine's host work per step: a thin model's decode step
        return decode and dense16 and facts.total_params * 2 < 2**26
    if name == "block_gemv_factor":
        return decode and blocks
    if decode or c.kind != "prefill":
        return False
    if name == "prompt_layer_overhead_s":  # a thin model's short prompts: Python per layer, little else
        return dense16 and facts.total_params * 2 < 2**26 and c.prompt <= 32
    if name == "tile_flops_share":  # short prompts of a wide model: the tiles' arithmetic
        return dense16 and facts.total_params * 2 > 2**30 and c.prompt <= 32
    if name in ("eta_flops", "eta_attn", "activation_passes"):  # prompts on oneDNN's GEMMs
        return dense16 and c.prompt > 32
    return blocks  # dequant_tail_bytes_per_value: every prompt of block weights


def fit(run: dict[str, Any], fit_cells: Sequence[Cell], base: EngineProfile | None = None) -> EngineProfile:
    """``glassbox-cpu`` with STAGES' constants fitted in turn on the CPU-time cells each dominates (a
    golden-section search of the summed squared log error; eta_flops and eta_attn, which share their
    cells, in alternation); a constant with no such cell among ``fit_cells`` keeps ``base``'s value. The
    TTFT cells then fit ``request_overhead_s``."""
    eng = base or PROFILES["glassbox-cpu"]
    hws = {m: hardware(run, m, "cpu") for m in run["cells"]}
    ops = sorted(p["op_us_cpu"] * 1e-6 for p in run["probes"] if "op_us_cpu" in p)
    if ops:  # the host terms are fitted at this run's op speed (perf/cpu_clock.py)
        eng = replace(eng, host_op_s=ops[len(ops) // 2])

    def loss(e: EngineProfile, which: Sequence[Cell]) -> float:
        return sum(math.log(predict(c, e, hws[c.model]) / c.measured) ** 2 for c in which)

    def stage(e: EngineProfile, name: str, lo: float, hi: float) -> EngineProfile:
        which = [c for c in fit_cells if _uses(c, name)]
        if not which:
            return e
        best = _golden(lambda x: loss(replace(e, **{name: x}), which), lo, hi)  # type: ignore[arg-type]
        return replace(e, **{name: best})  # type: ignore[arg-type]

    ranges = dict(STAGES)
    for _ in range(PASSES):  # again, so that each constant sees the later ones' values too
        for name, (lo, hi) in STAGES:
            if name == "eta_attn":
                continue
            eng = stage(eng, name, lo, hi)
            if name == "eta_flops":
                for _ in range(SWEEPS):
                    eng = stage(eng, "eta_attn", *ranges["eta_attn"])
                    eng = stage(eng, "eta_flops", lo, hi)
    ttft = [c for c in fit_cells if c.kind == "ttft"]
    if ttft:
        best = _golden(lambda x: loss(replace(eng, request_overhead_s=x), ttft), 0.0, 0.05)
        eng = replace(eng, request_overhead_s=best)
    return eng


def merge(runs: Sequence[dict[str, Any]]) -> dict[str, Any]:
    """Several runs as one: each model's figures the median over the runs that measured it, every probe."""
    if len(runs) == 1:
        return dict(runs[0])
    models: dict[str, list[dict[str, Any]]] = {}
    for r in runs:
        for name, c in r["cells"].items():
            models.setdefault(name, []).append(c)
    cells_out: dict[str, Any] = {}
    for name, cs in models.items():
        pre = {k: {n: statistics.median(c["prefill"][k][n] for c in cs if n in c["prefill"][k])
                   for n in cs[0]["prefill"][k]} for k in cs[0]["prefill"]}  # fmt: skip
        cells_out[name] = {
            "path": cs[0]["path"],
            "prefill": pre,
            "decode_context": cs[0]["decode_context"],
            **{k: statistics.median(c[k] for c in cs) for k in ("decode_token_s", "decode_token_cpu_s")},
        }
    return {
        "date": " + ".join(r["date"] for r in runs),
        "machine": runs[0]["machine"],
        "torch": runs[0]["torch"],
        "probes": [p for r in runs for p in r["probes"]],
        "cells": cells_out,
    }


def leave_one_model_out(
    run: dict[str, Any], base: EngineProfile | None = None
) -> dict[str, list[tuple[Cell, float, float]]]:
    """For each model: the profile fitted on the other models' cells, and its errors on this one's."""
    every = cells(run, "cpu")
    out = {}
    for model in run["cells"]:
        eng = fit(run, [c for c in every if c.model != model], base)
        out[model] = errors(run, eng, "cpu", [c for c in every if c.model == model])
    return out


def mape(errs: Sequence[float]) -> float:
    return sum(abs(e) for e in errs) / len(errs) if errs else math.nan
