"""glassbox on this CPU against the planner: measured step times of three models, and the glassbox-cpu fit.

For the default model (SmolLM2-135M-Instruct Q4_1 GGUF), the demo model and a Qwen3-0.6B-shaped random
bf16 model, batch 1, the engine's own step records give: prefill of one whole prompt of 16, 64, 256 and
1,024 tokens (TTFT from the request's metrics too) and decode steps after a 128-token prompt. The models
run in turns, ``--rounds`` times, with the read-bandwidth/FLOP probe taken before each round and the load
average beside it. perf/cpu_fit.py fits glassbox-cpu's terms (efficiencies and per-layer, per-step and
per-request host times) on the medians, and reports plan vs measured per cell.

    PYTHONPATH=src python benchmarks/plan_vs_trace.py [--rounds 2] [--threads 2]
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

RESULTS = Path(__file__).resolve().parent / "results"
PROMPTS = (16, 38, 64, 256, 1024)
DECODE_PROMPT, DECODE_TOKENS = 128, 32


def load() -> str:
    return Path("/proc/loadavg").read_text().split()[0]


def measure(model: str, rounds: int) -> dict[str, Any]:
    """Median prefill step and TTFT per prompt length, and median decode time per token, of ``model``."""
    import torch

    from glassbox import LLM, SamplingParams

    llm = LLM(model, enable_prefix_caching=False, max_num_seqs=1, max_num_batched_tokens=2048)
    vocab = llm.engine.model_config.vocab_size
    g = torch.Generator().manual_seed(0)
    pre: dict[int, list[float]] = {n: [] for n in PROMPTS}
    ttft: dict[int, list[float]] = {n: [] for n in PROMPTS}
    dec: list[float] = []
    one = SamplingParams(temperature=0, max_tokens=1, ignore_eos=True)
    for rep in range(rounds + 1):  # round 0 warms up
        for n in PROMPTS:
            ids = torch.randint(3, vocab, (n,), generator=g).tolist()
            llm.engine.step_records.clear()
            out = llm.generate([ids], one)[0]
            steps = [r.duration_s for r in llm.engine.step_records if r.num_prefill_tokens == n]
            if rep and steps and out.metrics is not None:
                pre[n].append(steps[0])
                ttft[n].append(out.metrics.ttft_s)
        ids = torch.randint(3, vocab, (DECODE_PROMPT,), generator=g).tolist()
        llm.engine.step_records.clear()
        llm.generate([ids], SamplingParams(temperature=0, max_tokens=DECODE_TOKENS, ignore_eos=True))
        if rep:
            dec += [
                r.duration_s / r.num_decode_tokens
                for r in llm.engine.step_records
                if r.phase == "decode" and r.num_decode_tokens
            ]
    return {
        "prefill_step_s": {n: statistics.median(v) for n, v in pre.items() if v},
        "ttft_s": {n: statistics.median(v) for n, v in ttft.items() if v},
        "decode_token_s": statistics.median(dec),
        "decode_context": DECODE_PROMPT + DECODE_TOKENS // 2,
    }


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--out", default="")
    args = ap.parse_args()
    os.environ.setdefault("GLASSBOX_NUM_THREADS", str(args.threads))
    from glassbox.models.sources import DEMO_MODEL_DIR, default_gguf
    from glassbox.perf.hardware import spec_to_dict
    from glassbox.perf.probe import probe_local

    smol = default_gguf()
    models = {"demo": str(DEMO_MODEL_DIR), "qwen3-0.6b": str(qwen3_0_6b_random())}
    if smol is not None:
        models = {"smollm2-q4_1": str(smol), **models}
    probes, cells = [], {}
    for name, path in models.items():
        hw = probe_local("cpu", "bfloat16", force=True)
        probes.append(
            {"before": name, "load": load(), "bandwidth_gbs": hw.bandwidth_gbs, "tflops": hw.tflops}
        )
        t0 = time.time()
        cells[name] = {
            "path": path,
            "load_before": load(),
            **measure(path, args.rounds),
            "load_after": load(),
        }
        cells[name]["wall_s"] = round(time.time() - t0, 1)
        print(name, json.dumps(cells[name]), flush=True)
    hw = probe_local("cpu", "bfloat16", force=True)
    probes.append({"before": "end", "load": load(), "bandwidth_gbs": hw.bandwidth_gbs, "tflops": hw.tflops})
    result = {
        "date": time.strftime("%Y-%m-%d %H:%M"),
        "machine": hw.source,
        "threads": args.threads,
        "hardware": spec_to_dict(hw),
        "probes": probes,
        "cells": cells,
    }
    out = Path(args.out) if args.out else RESULTS / f"plan-vs-trace-{time.strftime('%Y-%m-%d')}.json"
    out.write_text(json.dumps(result, indent=2) + "\n")
    print(f"wrote {out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
