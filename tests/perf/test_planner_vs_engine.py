"""The planner (glassbox-cpu) against the engine's own measured prefill, TTFT and decode of the demo model on
this machine, each round of measurements beside a probe taken in the same process just before it
(perf/cpu_clock.py).

Both sides are timed in CPU time on one thread: the engine's calls in this process's CPU time (its steps in
proportion to their wall time) and the probe per CPU-second of its thread. Even so a loaded machine moves
both (neighbours evict the caches and share the memory bus: the probe's bf16 rate per CPU-second ranged
0.34-1.03 TFLOP/s over one run at load 4-7, benchmarks/results/planner-cpu-fit-2026-11-28.md), so each
round's cells are planned on that round's probe and a cell's figure is the median over rounds of
plan / measured.

Why the bounds hold on any x86 CPU, loaded or not:
- STRUCTURE (the terms the plan says dominate, and where it says they switch) holds whatever the speed:
  TTFT is the prefill step (the engine adds ~1 ms of host work beside it: request_overhead_s; the step's
  record also holds ~1 ms of post-processing after the token, hence max(1 ms, 15%)); a 16-token prompt of
  the demo model is mostly the per-op forward's host work (plan: > 50% host) and costs at most 2x a
  32-token one, while 1,024 tokens cost > 4x 64 (plan: FLOPs, copies and activation passes dominate);
  prefill time rises with the prompt on both sides.
- NUMBERS: plan / measured within ``FIT x CPU x spread`` (and 1 / that):
  FIT = 1.5: the fitted profile's largest error on the demo model's prefill and TTFT cells, in the fit
  run (+-25%) and on a second run held out (+-45%) (planner-cpu-fit-2026-11-28.md);
  CPU = 1.4: what transfers to another x86 CPU is the probe (the efficiencies are shares of its read and
  bf16 matmul rates, the host terms scale with its small-op time) and the AMX switch (perf/cpu_terms.py
  for_this_cpu); the decode stream's share of the read probe was 0.78 on the 2-core AVX-512 EPYC without
  AMX of 2026-11-22 (benchmarks/results/plan-vs-measured-2026-11-22.json) and 1.07 on this Xeon: 1.37;
  spread: this process's own max / min of the cell's CPU time over the rounds (>= 1): the load's effect
  on the engine that the probe did not see.
  Decode of the demo model reads 11.5 MB of weights a step, resident in the last-level cache, where the
  plan charges the probe's DRAM rate (512 MiB read): its upper bound also carries this process's measured
  ratio of the read rate over a weight-sized tensor to the probe's (no cache term in the cost model).
  The issue this guards against was a planner off by 4.2-5.8x on this model (TTFT and TPOT with no host
  terms).
"""

from __future__ import annotations

import os
import statistics
import time
from collections.abc import Iterator
from typing import Any

import pytest

from glassbox.perf.cost_model import prefill_cost, step_cost
from glassbox.perf.cpu_clock import probe, rates, spec
from glassbox.perf.cpu_terms import for_this_cpu
from glassbox.perf.engine_profiles import PROFILES
from glassbox.perf.model_presets import load_model_facts
from glassbox.perf.quant import resolve_scheme

# Opt-in (GLASSBOX_TIMING_TESTS=1): timings, not behaviour. Fitted and passed on the Intel Xeon with AMX at load
# 4-10; under `make test-no-amx` (oneDNN held to AVX-512 BF16 while the CPU flags still say AMX, so the
# profile keeps its AMX terms) the plan came out 3.5-4.8x slow on 16- and 32-token prompts, and it has not run
# on the AMD EPYC the machines alternate with. benchmarks/plan_vs_trace.py is the measurement.
pytestmark = pytest.mark.skipif(
    os.environ.get("GLASSBOX_TIMING_TESTS") != "1", reason="a timing test: set GLASSBOX_TIMING_TESTS=1"
)

FIT, CPU = 1.5, 1.4  # see the module docstring
PROMPTS = (16, 32, 64, 256, 1024)
DECODE_PROMPT, DECODE_TOKENS = 64, 24
ROUNDS = 3


def _cache_ratio(weight_bytes: float, budget_s: float = 0.3) -> float:
    """Read rate over a tensor of ``weight_bytes`` (re-read: cache-resident where it fits) over the rate
    over 512 MiB, both per CPU-second of this thread (>= 1)."""
    import torch

    from glassbox.perf.cpu_clock import READ_BYTES

    small = torch.ones(int(weight_bytes) // 4, dtype=torch.float32)
    big = torch.ones(READ_BYTES // 4, dtype=torch.float32)
    near = rates(small.sum, small.numel() * 4.0, budget_s)[1]
    far = rates(big.sum, READ_BYTES, budget_s)[1]
    return max(1.0, near / far)


@pytest.fixture(scope="module")
def measured() -> Iterator[dict[str, Any]]:
    torch = pytest.importorskip("torch")
    from glassbox import LLM, SamplingParams
    from glassbox.models.sources import DEMO_MODEL_DIR

    mp = pytest.MonkeyPatch()
    mp.setenv("GLASSBOX_NUM_THREADS", "1")
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        llm = LLM(
            str(DEMO_MODEL_DIR), enable_prefix_caching=False, max_num_seqs=1, max_num_batched_tokens=2048
        )
        g = torch.Generator().manual_seed(0)
        vocab = llm.engine.model_config.vocab_size

        def timed(n: int, max_tokens: int) -> tuple[Any, float, list[Any]]:
            ids = torch.randint(3, vocab, (n,), generator=g).tolist()
            llm.engine.step_records.clear()
            w0, c0 = time.perf_counter(), time.process_time()
            res = llm.generate([ids], SamplingParams(temperature=0, max_tokens=max_tokens, ignore_eos=True))[
                0
            ]
            share = (time.process_time() - c0) / (time.perf_counter() - w0)
            return res, share, list(llm.engine.step_records)

        timed(16, 2)  # warm-up: kernels built, buffers allocated
        rounds = []
        for _ in range(ROUNDS):
            r: dict[str, Any] = {"hw": spec([probe(0.6)], "cpu"), "prefill": {}, "ttft": {}}
            for n in PROMPTS:
                res, share, records = timed(n, 1)
                step = next(rec.duration_s for rec in records if rec.num_prefill_tokens == n)
                r["prefill"][n] = step * share
                r["ttft"][n] = res.metrics.ttft_s * share
            _, share, records = timed(DECODE_PROMPT, DECODE_TOKENS + 1)
            r["decode"] = statistics.median(
                rec.duration_s / rec.num_decode_tokens * share for rec in records if rec.phase == "decode"
            )
            rounds.append(r)
        facts = load_model_facts(str(DEMO_MODEL_DIR))
        yield {"rounds": rounds, "cache_ratio": _cache_ratio(facts.total_params * 2.0)}
    finally:
        torch.set_num_threads(threads)
        mp.undo()


def _plan(hw: Any) -> dict[str, Any]:
    from glassbox.models.sources import DEMO_MODEL_DIR

    eng = for_this_cpu(PROFILES["glassbox-cpu"])
    facts = load_model_facts(str(DEMO_MODEL_DIR))
    scheme = resolve_scheme("native", facts.native_quant, facts.dtype, False, None)
    prefill = {n: prefill_cost(facts, scheme, hw, eng, n).seconds for n in PROMPTS}
    terms = {n: step_cost(facts, scheme, hw, eng, [(n, 0)]).terms for n in PROMPTS}
    ctx = DECODE_PROMPT + DECODE_TOKENS // 2
    return {
        "prefill": prefill,
        "ttft": {n: t + eng.request_overhead_s for n, t in prefill.items()},
        "decode": step_cost(facts, scheme, hw, eng, [(1, ctx)]).seconds,
        "host": {n: t["step_overhead_s"] + t["layer_overhead_s"] for n, t in terms.items()},
    }


def _cells(rounds: list[dict[str, Any]]) -> dict[str, list[tuple[float, float]]]:
    """Per cell name, each round's (plan on that round's probe, measured)."""
    out: dict[str, list[tuple[float, float]]] = {}
    for r in rounds:
        plan = _plan(r["hw"])
        for key in ("prefill", "ttft"):
            for n in PROMPTS:
                out.setdefault(f"{key} {n}", []).append((plan[key][n], r[key][n]))
        out.setdefault("decode", []).append((plan["decode"], r["decode"]))
    return out


def test_structure_matches(measured: dict[str, Any]) -> None:
    rounds = measured["rounds"]
    m = {n: min(r["prefill"][n] for r in rounds) for n in PROMPTS}  # the least disturbed round
    # TTFT - step of the same call, in its least disturbed round (a preemption between the request's arrival
    # and its step adds wall time to TTFT alone)
    gap = {n: min(abs(r["ttft"][n] - r["prefill"][n]) for r in rounds) for n in PROMPTS}
    plan = _plan(rounds[0]["hw"])
    p = plan["prefill"]
    eng = PROFILES["glassbox-cpu"]
    for n in PROMPTS:  # TTFT is the prefill step on both sides: the step's record also holds its
        # post-processing after the first token (detokenizing, stop checks: ~1 ms of CPU on this machine)
        assert gap[n] <= max(1e-3, 0.15 * m[n])
        assert plan["ttft"][n] == pytest.approx(p[n] + eng.request_overhead_s, abs=1e-9)
    assert plan["host"][16] > 0.5 * p[16]  # the plan: a short prompt is mostly host work ...
    # ... so doubling it costs far less than double (the plan's side only: the engine's 16- and 32-token steps
    # are 2-4 ms of CPU each, and one preemption on a loaded machine moved their ratio past 2 in one run of five)
    assert p[32] < 2 * p[16]
    assert p[1024] > 4 * p[64] and m[1024] > 4 * m[64]  # a long prompt is arithmetic: it grows with n
    for a, b in ((16, 256), (64, 1024)):
        assert p[a] < p[b] and m[a] < m[b]


def test_numbers_within_the_derived_factor(measured: dict[str, Any]) -> None:
    bad, seen = [], []
    for name, pairs in _cells(measured["rounds"]).items():
        ratio = statistics.median(p / m for p, m in pairs)
        spread = max(m for _, m in pairs) / min(m for _, m in pairs)
        lo = 1 / (FIT * CPU * spread)
        hi = FIT * CPU * spread * (measured["cache_ratio"] if name == "decode" else 1.0)
        seen.append((name, round(ratio, 2), round(lo, 2), round(hi, 2)))
        if not lo <= ratio <= hi:
            bad.append(seen[-1])
    assert not bad, f"plan / measured (median over rounds) outside [lo, hi]: {bad}; all: {seen}"
