"""Fitting engine profiles on published rows (perf/spark_rows.py), and their leave-one-model-out errors.

Each constant is one golden-section search over the summed squared log error of the rows that carry it,
in an order where each search sees only constants already fixed: eta_bw on batch-1 decode rows (a
memory-bound step), request_overhead_s on short-prompt TTFTs (< 1,000 tokens: the overhead is most of
them), eta_flops on dense prefill and long TTFT rows, moe_flops_factor on MoE prefill rows. An engine with
no dense prefill row takes eta_flops from ``EFFICIENCY_TIES`` (the same GEMM libraries). llama.cpp's
eta_attn moves with eta_flops (its f16 flash attention runs at its int8 GEMMs' FLOP/s; see
benchmarks/results/planner-long-context-2026-11-23.md).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace

from glassbox.perf.cost_model import prefill_cost, step_cost
from glassbox.perf.engine_profiles import PROFILES, EngineProfile
from glassbox.perf.hardware import PRESETS as HARDWARE
from glassbox.perf.model_presets import load_model_facts
from glassbox.perf.quant import resolve_scheme
from glassbox.perf.spark_rows import Row
from glassbox.perf.tensor_parallel import INTERCONNECTS, TensorParallel

SPARK = HARDWARE["dgx-spark"]
SHORT_PROMPT = 1000  # TTFT rows below it fit the request overhead
EFFICIENCY_TIES = {"vllm": "sglang", "trt-llm": "sglang"}  # eta_flops without a dense prefill row


def with_tp(engine: EngineProfile, size: int) -> EngineProfile:
    """``engine`` on ``size`` Sparks: over its own link if it has one, else 200gbe-roce."""
    link = (engine.tp.link or INTERCONNECTS["200gbe-roce"]) if size > 1 else None
    return replace(engine, tp=TensorParallel(size, link))


def predict(row: Row, engine: EngineProfile) -> float:
    """The cost model's value for a row (tok/s or seconds) under ``engine`` on the Spark."""
    facts = load_model_facts(row.model)
    scheme = resolve_scheme(row.quant, facts.native_quant, facts.dtype, engine.gguf, engine.mixed_rest_format)
    eng = with_tp(engine, row.tp)
    if row.kind == "tp_speedup":
        one = step_cost(facts, scheme, SPARK, with_tp(engine, 1), [(1, row.context)]).seconds
        return one / step_cost(facts, scheme, SPARK, eng, [(1, row.context)]).seconds
    if row.kind == "decode":
        return row.batch / step_cost(facts, scheme, SPARK, eng, [(1, row.context)] * row.batch).seconds
    phase = prefill_cost(facts, scheme, SPARK, eng, row.prompt, row.context)
    if row.kind == "prefill":
        return row.prompt / phase.seconds
    return phase.seconds + eng.request_overhead_s


def error(row: Row, engine: EngineProfile) -> float:
    """Signed relative error of the prediction, predicted / measured - 1."""
    return predict(row, engine) / row.measured - 1.0


def _golden(f: Callable[[float], float], lo: float, hi: float, tol: float = 1e-5) -> float:
    g = (math.sqrt(5) - 1) / 2
    a, b = lo, hi
    while b - a > tol * max(1.0, hi):
        c, d = b - g * (b - a), a + g * (b - a)
        if f(c) < f(d):
            b = d
        else:
            a = c
    return (a + b) / 2


def _attn_tie(engine: EngineProfile) -> float:
    return SPARK.peak_flops("int8") / SPARK.peak_flops("bf16") if engine.gguf and engine.eta_attn else 0.0


def fit_scalar(rows: Sequence[Row], engine: EngineProfile, field: str, lo: float, hi: float) -> float:
    """The value of ``field`` minimizing sum(log(predicted / measured)^2) over ``rows``."""
    tie = _attn_tie(engine) if field == "eta_flops" else 0.0

    def loss(x: float) -> float:
        eng = replace(engine, **{field: x})  # type: ignore[arg-type]
        if tie:
            eng = replace(eng, eta_attn=x * tie)
        return sum(math.log(predict(r, eng) / r.measured) ** 2 for r in rows)

    return _golden(loss, lo, hi)


def _moe(row: Row) -> bool:
    return load_model_facts(row.model).is_moe


@dataclass(frozen=True)
class Fit:
    """Fitted constants of one engine and the profile they make."""

    values: dict[str, float]
    profile: EngineProfile


def fit_engine(name: str, fit_rows: Sequence[Row], base: EngineProfile | None = None) -> Fit:
    """Refit ``name``'s constants on ``fit_rows`` (TP=1 rows only); constants no row carries keep ``base``'s."""
    eng = base or PROFILES[name]
    one = [r for r in fit_rows if r.tp == 1]
    values: dict[str, float] = {}
    decode = [r for r in one if r.kind == "decode" and r.batch == 1 and r.context <= 2048]
    if decode:
        values["eta_bw"] = fit_scalar(decode, eng, "eta_bw", 0.2, 1.0)
        eng = replace(eng, eta_bw=values["eta_bw"])
    short = [r for r in one if r.kind == "ttft" and r.prompt < SHORT_PROMPT]
    if short:
        values["request_overhead_s"] = fit_scalar(short, eng, "request_overhead_s", 0.0, 0.5)
        eng = replace(eng, request_overhead_s=values["request_overhead_s"])
    long = [r for r in one if r.kind == "prefill" or (r.kind == "ttft" and r.prompt >= SHORT_PROMPT)]
    dense = [r for r in long if not _moe(r) and r.context == 0]
    if dense:
        values["eta_flops"] = fit_scalar(dense, eng, "eta_flops", 0.02, 1.0)
    elif name in EFFICIENCY_TIES:
        values["eta_flops"] = PROFILES[EFFICIENCY_TIES[name]].eta_flops
    if "eta_flops" in values:
        eng = replace(eng, eta_flops=values["eta_flops"])
        if _attn_tie(eng):
            values["eta_attn"] = values["eta_flops"] * _attn_tie(eng)
            eng = replace(eng, eta_attn=values["eta_attn"])
    moe = [r for r in long if _moe(r) and r.context == 0]
    if moe:
        values["moe_flops_factor"] = fit_scalar(moe, eng, "moe_flops_factor", 0.05, 1.0)
        eng = replace(eng, moe_flops_factor=values["moe_flops_factor"])
    return Fit(values, eng)


def leave_one_model_out(name: str, fit_rows: Sequence[Row]) -> dict[str, list[tuple[Row, float]]]:
    """For each model among ``fit_rows``: refit without its rows and the errors on them."""
    out: dict[str, list[tuple[Row, float]]] = {}
    for model in sorted({r.model for r in fit_rows}):
        rest = [r for r in fit_rows if r.model != model]
        profile = fit_engine(name, rest).profile
        out[model] = [(r, error(r, profile)) for r in fit_rows if r.model == model]
    return out


def mape(errors: Sequence[float]) -> float:
    """Mean absolute relative error (0.1 = 10%)."""
    return sum(abs(e) for e in errors) / len(errors) if errors else math.nan


def fit_step_sync(fit_rows: Sequence[Row], engine: EngineProfile) -> float:
    """The 200gbe-roce link's per-step sync (s) fitted on the TP speed-up rows under ``engine``."""
    ratios = [r for r in fit_rows if r.kind == "tp_speedup"]
    link = INTERCONNECTS["200gbe-roce"]

    def loss(x: float) -> float:
        eng = replace(engine, tp=TensorParallel(1, replace(link, step_sync_s=x)))
        return sum(math.log(predict(r, eng) / r.measured) ** 2 for r in ratios)

    return _golden(loss, 0.0, 0.05, 1e-4)
