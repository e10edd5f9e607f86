"""The one-call native decode step (kernels/cpu_step.c) against the per-op kernel forward it replaces.

The default model (SmolLM2-135M-Instruct, Q4_1 GGUF: every linear in blocks, so the step applies), batch 1,
greedy, ``--tokens`` decode tokens after a short prompt; each round runs the engine with the step and then
with it unbound (``NativeForward.step = None``: the per-op forward for every step), in turns. Reported: the
median tok/s of each (end to end over the request, prefill included) and the per-round ratios.

    GLASSBOX_NUM_THREADS=2 .venv/bin/python benchmarks/native_step.py [--rounds 6] [--out FILE.json]
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import time
from pathlib import Path

import torch

from glassbox import LLM, SamplingParams
from glassbox.models.llama_native import NativeForward
from glassbox.perf.hardware import cpu_name

RESULTS = Path(__file__).resolve().parent / "results"
PROMPT = "The history of the city of Paris begins"


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--rounds", type=int, default=6)
    ap.add_argument("--tokens", type=int, default=128)
    ap.add_argument("--out", type=Path, default=None)
    args = ap.parse_args()
    llm = LLM(model=None)
    forward = llm.engine.executor.forward
    assert isinstance(forward, NativeForward) and forward.step is not None, "the step is not bound"
    step = forward.step
    params = SamplingParams(temperature=0.0, max_tokens=args.tokens, ignore_eos=True)
    llm.generate([PROMPT], SamplingParams(max_tokens=8))
    runs: dict[str, list[float]] = {"native_step": [], "per_op": []}
    same = True
    for _ in range(args.rounds):
        outs = []
        for name, bound in (("native_step", step), ("per_op", None)):
            forward.step = bound
            t = time.perf_counter()
            out = llm.generate([PROMPT], params)[0]
            runs[name].append(args.tokens / (time.perf_counter() - t))
            outs.append(out.token_ids)
        same &= outs[0] == outs[1]
    forward.step = step
    ratios = [a / b for a, b in zip(runs["native_step"], runs["per_op"], strict=True)]
    result = {
        "date": time.strftime("%Y-%m-%d %H:%M"),
        "command": "benchmarks/native_step.py " + " ".join(f"--{k} {v}" for k, v in vars(args).items()),
        "machine": {"cpu": cpu_name(), "cores": os.cpu_count(), "python": platform.python_version()},
        "load_avg_1m": os.getloadavg()[0],
        "threads": torch.get_num_threads(),
        "model": "SmolLM2-135M-Instruct Q4_1 (default model)",
        "tok_s_median": {k: statistics.median(v) for k, v in runs.items()},
        "runs": runs,
        "ratio_per_round": ratios,
        "ratio_median": statistics.median(ratios),
        "same_tokens": same,
    }
    print(json.dumps({k: result[k] for k in ("threads", "tok_s_median", "ratio_median", "same_tokens")}))
    out = args.out or RESULTS / f"native-step-{time.strftime('%Y-%m-%d')}.json"
    out.write_text(json.dumps(result, indent=2) + "\n")
    print(f"wrote {out}")


if __name__ == "__main__":
    main()
