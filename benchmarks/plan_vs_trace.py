"""glassbox on this CPU, measured for the planner: step times of three models in CPU time and wall time,
each beside a probe taken in the same run.

For the default model (SmolLM2-135M-Instruct Q4_1 GGUF), the demo model and a Qwen3-0.6B-shaped random
bf16 model, batch 1 on one thread, the engine's own step records give the prefill step of one whole prompt
of 16-1,024 tokens, the request's TTFT and the decode steps after a 128-token prompt. On a shared machine
the wall clock measures the neighbours as much as the engine, so each call is also timed in this process's
CPU time, and its steps' CPU time is the call's in proportion to their wall time (the share of a core the
process got is the same through one call). The probe (perf/cpu_clock.py) runs before every model and
round in both clocks: read bandwidth over 512 MiB (``read_gbs``, as ``glassbox hardware --probe`` measures
it) and a bf16 matmul (``tflops``), each per second of wall time and per CPU-second of its thread
(``*_cpu``). perf/cpu_fit.py fits and checks glassbox-cpu on the CPU-time figures (they hold when the load
changes) and reports the wall-clock ones beside them (benchmarks/planner_cpu_fit.py).

    PYTHONPATH=src python benchmarks/plan_vs_trace.py [--rounds 2] [--models smollm2,demo,qwen3]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))
from bench_models import qwen3_0_6b_random  # noqa: E402

from glassbox.perf.cpu_clock import loadavg as load  # noqa: E402
from glassbox.perf.cpu_clock import probe  # noqa: E402

RESULTS = Path(__file__).resolve().parent / "results"
PROMPTS = (16, 32, 38, 64, 128, 256, 1024)
DECODE_PROMPT, DECODE_TOKENS = 128, 32


def _timed(llm: Any, ids: list[int], max_tokens: int) -> tuple[Any, float, float, list[Any]]:
    from glassbox import SamplingParams

    llm.engine.step_records.clear()
    w0, c0 = time.perf_counter(), time.process_time()
    out = llm.generate([ids], SamplingParams(temperature=0, max_tokens=max_tokens, ignore_eos=True))[0]
    wall, cpu = time.perf_counter() - w0, time.process_time() - c0
    return out, wall, cpu, list(llm.engine.step_records)


def measure(model: str, rounds: int, probes: list[dict[str, Any]]) -> dict[str, Any]:
    """Per prompt length the median prefill step and TTFT (wall and CPU), and the decode step per token."""
    import torch

    from glassbox import LLM

    llm = LLM(model, enable_prefix_caching=False, max_num_seqs=1, max_num_batched_tokens=2048)
    vocab = llm.engine.model_config.vocab_size
    g = torch.Generator().manual_seed(0)
    cells: dict[str, dict[int, list[float]]] = {
        k: {n: [] for n in PROMPTS} for k in ("step_s", "step_cpu_s", "ttft_s", "ttft_cpu_s", "share")
    }
    dec: dict[str, list[float]] = {"step_s": [], "step_cpu_s": [], "share": []}
    for rep in range(rounds + 1):  # round 0 warms up
        if rep:
            probes.append({"model": Path(model).name, "round": rep, **probe()})
        for n in PROMPTS:
            ids = torch.randint(3, vocab, (n,), generator=g).tolist()
            out, wall, cpu, records = _timed(llm, ids, 1)
            steps = [r.duration_s for r in records if r.num_prefill_tokens == n]
            if rep and steps and out.metrics is not None:
                share = cpu / wall
                for key, value in (
                    ("step_s", steps[0]),
                    ("step_cpu_s", steps[0] * share),
                    ("ttft_s", out.metrics.ttft_s),
                    ("ttft_cpu_s", out.metrics.ttft_s * share),
                    ("share", share),
                ):
                    cells[key][n].append(value)
        ids = torch.randint(3, vocab, (DECODE_PROMPT,), generator=g).tolist()
        _, wall, cpu, records = _timed(llm, ids, DECODE_TOKENS + 1)
        if rep:
            share = cpu / wall
            per_token = [
                r.duration_s / r.num_decode_tokens
                for r in records
                if r.phase == "decode" and r.num_decode_tokens
            ]
            dec["step_s"] += per_token
            dec["step_cpu_s"] += [t * share for t in per_token]
            dec["share"].append(share)
    med = {k: {n: statistics.median(v) for n, v in d.items() if v} for k, d in cells.items()}
    return {
        "prefill": med,
        "decode_token_s": statistics.median(dec["step_s"]),
        "decode_token_cpu_s": statistics.median(dec["step_cpu_s"]),
        "decode_share": statistics.median(dec["share"]),
        "decode_context": DECODE_PROMPT + DECODE_TOKENS // 2,
    }


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--models", default="smollm2,demo,qwen3")
    ap.add_argument("--out", default="")
    args = ap.parse_args()
    os.environ["GLASSBOX_NUM_THREADS"] = "1"
    import torch

    torch.set_num_threads(1)
    from glassbox.models.sources import DEMO_MODEL_DIR, default_gguf
    from glassbox.perf.hardware import cpu_name

    paths = {"smollm2": default_gguf(), "demo": DEMO_MODEL_DIR, "qwen3": None}
    probes: list[dict[str, Any]] = []
    cells = {}
    for name in args.models.split(","):
        path = paths[name] if name != "qwen3" else qwen3_0_6b_random()
        if path is None:
            continue
        t0 = time.time()
        cells[name] = {"path": str(path), "load_before": load(), **measure(str(path), args.rounds, probes)}
        cells[name]["load_after"], cells[name]["wall_s"] = load(), round(time.time() - t0, 1)
        print(name, json.dumps(cells[name]), flush=True)
    result = {
        "date": time.strftime("%Y-%m-%d %H:%M"),
        "machine": f"{cpu_name()}, {os.cpu_count()} CPUs shared with other jobs; 1 engine thread",
        "torch": torch.__version__,
        "probes": probes,
        "cells": cells,
    }
    out = Path(args.out) if args.out else RESULTS / f"plan-vs-trace-{time.strftime('%Y-%m-%d')}.json"
    out.write_text(json.dumps(result, indent=2) + "\n")
    print(f"wrote {out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
