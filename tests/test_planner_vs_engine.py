"""The planner (glassbox-cpu) against the engine's own measured prefill, TTFT and decode of the demo model on
this machine, with the probe taken in the same test (perf/cpu_clock.py).

Both sides are timed in CPU time on one thread: the engine's calls in this process's CPU time (its steps in
proportion to their wall time) and the probe per CPU-second of its thread, so a loaded machine (load 5-12
on 2 cores where this was written) slows neither side's figures by its time-slicing.

Why the bounds hold on any x86 CPU, loaded or not:
- STRUCTURE (the terms the plan says dominate, and where it says they switch) holds whatever the speed:
  TTFT is the prefill step (the engine adds no per-request host work before it: request_overhead_s ~0;
  the step's record also holds ~1 ms of post-processing after the token, hence max(1 ms, 15%));
  a 16-token prompt of the demo model is mostly the per-op forward's host work (plan: > 50% host) and
  costs at most 2x a 32-token one, while 1,024 tokens cost > 4x 64 (plan: FLOPs and activation passes
  dominate); prefill time rises with the prompt on both sides.
- NUMBERS within a factor of ``FACTOR`` = 2.25 of measured: run-to-run, the engine's own CPU time for the
  same cells varied up to 1.5x on this machine under load (benchmarks/results/planner-cpu-fit-2026-11-28.md:
  the largest held-out cell error, 50%), and the profile's efficiencies are shares of the probe's rates,
  which differ by CPU: the decode stream's share of the read probe was 0.78 on the 2-core EPYC of
  2026-11-22 and 1.14 on this Xeon (1.46x). 1.5 x 1.5 = 2.25. The issue this guards against was a
  planner off by 4.2-5.8x on this model (TTFT and TPOT with no host terms).
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from typing import Any

import pytest

from glassbox.perf.cost_model import prefill_cost, step_cost
from glassbox.perf.cpu_clock import probe, spec
from glassbox.perf.cpu_terms import for_this_cpu
from glassbox.perf.engine_profiles import PROFILES
from glassbox.perf.model_presets import load_model_facts
from glassbox.perf.quant import resolve_scheme

FACTOR = 2.25  # see the module docstring
PROMPTS = (16, 32, 64, 256, 1024)
DECODE_PROMPT, DECODE_TOKENS = 64, 24
ROUNDS = 3  # the least CPU time of each cell over the rounds: the least disturbed


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
        out: dict[str, Any] = {"prefill": {}, "ttft": {}, "decode": [], "probes": []}

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
        for _ in range(ROUNDS):
            out["probes"].append(probe(0.6))
            for n in PROMPTS:
                res, share, records = timed(n, 1)
                step = next(r.duration_s for r in records if r.num_prefill_tokens == n)
                out["prefill"].setdefault(n, []).append(step * share)
                out["ttft"].setdefault(n, []).append(res.metrics.ttft_s * share)
            _, share, records = timed(DECODE_PROMPT, DECODE_TOKENS + 1)
            out["decode"] += [
                r.duration_s / r.num_decode_tokens * share for r in records if r.phase == "decode"
            ]
        yield {
            "prefill": {n: min(v) for n, v in out["prefill"].items()},
            "ttft": {n: min(v) for n, v in out["ttft"].items()},
            "decode": sorted(out["decode"])[len(out["decode"]) // 2],
            "hw": spec(out["probes"], "cpu"),
        }
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


def test_structure_matches(measured: dict[str, Any]) -> None:
    plan = _plan(measured["hw"])
    m, p = measured["prefill"], plan["prefill"]
    for n in PROMPTS:  # TTFT is the prefill step on both sides: the step's record also holds its
        # post-processing after the first token (detokenizing, stop checks: ~1 ms of CPU on this machine)
        assert abs(measured["ttft"][n] - m[n]) <= max(1e-3, 0.15 * m[n])
        assert plan["ttft"][n] == pytest.approx(p[n], abs=1e-4)
    assert plan["host"][16] > 0.5 * p[16]  # the plan: a short prompt is mostly host work ...
    assert p[32] < 2 * p[16] and m[32] < 2 * m[16]  # ... so doubling it costs far less than double
    assert p[1024] > 4 * p[64] and m[1024] > 4 * m[64]  # a long prompt is arithmetic: it grows with n
    for a, b in ((16, 256), (64, 1024)):
        assert p[a] < p[b] and m[a] < m[b]


def test_numbers_within_the_derived_factor(measured: dict[str, Any]) -> None:
    plan = _plan(measured["hw"])
    report = []
    for key in ("prefill", "ttft"):
        for n in PROMPTS:
            report.append((f"{key} {n}", plan[key][n], measured[key][n]))
    report.append(("decode / token", plan["decode"], measured["decode"]))
    bad = [(k, p, m) for k, p, m in report if not 1 / FACTOR <= p / m <= FACTOR]
    assert not bad, f"plan / measured outside x{FACTOR} (seconds of CPU time): {bad}; probe {measured['hw']}"
