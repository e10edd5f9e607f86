"""Structured outputs end to end: decode steps of the default model with and without a JSON-schema mask.

SmolLM2-135M-Instruct (the default model; its 49,152-token vocabulary makes the mask as wide as real
models' small vocabularies), greedy, at batch 1 and at 64 sequences: each round runs the free and the
constrained batch in turns (same prompts, same ``max_tokens``); the constrained one follows a schema
whose one string field runs long (``minLength``), so that the JSON does not end before ``max_tokens``.
Reported: the median time per decode step (the batch's decode time over its decode steps) of each, and
the difference, which is the grammar's cost per step (fill the bitmask for every constrained row,
apply it, accept the sampled tokens) beside the step it rides on.

    GLASSBOX_NUM_THREADS=2 .venv/bin/python benchmarks/structured_decode.py [--rounds 3] [--out FILE.json]
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import time
from pathlib import Path
from typing import Any

import torch

from glassbox import LLM, SamplingParams
from glassbox.perf.hardware import cpu_name
from glassbox.structured_outputs import StructuredOutputs

RESULTS = Path(__file__).resolve().parent / "results"
SCHEMA = {
    "type": "object",
    "properties": {
        "title": {"type": "string", "minLength": 400, "maxLength": 800},
        "year": {"type": "integer"},
    },
    "required": ["title", "year"],
    "additionalProperties": False,
}
PROMPT = "Write a JSON object describing a book: its title and the year it was published."


def step_ms(llm: LLM, batch: int, tokens: int, constrained: bool) -> float:
    """Median over the batch's sequences of decode time per decode step, in ms."""
    so = StructuredOutputs(json=SCHEMA) if constrained else None
    params = SamplingParams(
        temperature=0.0, max_tokens=tokens, ignore_eos=not constrained, structured_outputs=so
    )
    outs = llm.generate([PROMPT] * batch, params)
    per_step = []
    for out in outs:
        m = out.metrics
        assert m is not None
        n = m.output_tokens - 1
        if n > 0:
            per_step.append(m.decode_s / n * 1e3)
    return statistics.median(per_step)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--tokens", type=int, default=64)
    ap.add_argument("--batches", default="1,64")
    ap.add_argument("--out", type=Path, default=None)
    args = ap.parse_args()
    llm = LLM(model=None, max_num_seqs=64)
    step_ms(llm, 2, 8, True)  # warm: compile, the grammar engine's tokenizer set-up
    rows: dict[str, Any] = {}
    for batch in (int(b) for b in args.batches.split(",")):
        free, masked = [], []
        for _ in range(args.rounds):
            free.append(step_ms(llm, batch, args.tokens, False))
            masked.append(step_ms(llm, batch, args.tokens, True))
        f, c = statistics.median(free), statistics.median(masked)
        rows[str(batch)] = {
            "free_step_ms": f,
            "constrained_step_ms": c,
            "grammar_ms_per_step": c - f,
            "free_runs": free,
            "constrained_runs": masked,
        }
        print(f"batch {batch}: free {f:.2f} ms/step, json_schema {c:.2f} ms/step (+{c - f:.2f})", flush=True)
    result = {
        "date": time.strftime("%Y-%m-%d %H:%M"),
        "command": "benchmarks/structured_decode.py " + " ".join(f"--{k} {v}" for k, v in vars(args).items()),
        "machine": {"cpu": cpu_name(), "cores": os.cpu_count(), "python": platform.python_version()},
        "threads": torch.get_num_threads(),
        "model": "SmolLM2-135M-Instruct (default model, Q4_1 GGUF)",
        "tokens": args.tokens,
        "batches": rows,
    }
    out = args.out or RESULTS / f"structured-decode-{time.strftime('%Y-%m-%d')}.json"
    out.write_text(json.dumps(result, indent=2) + "\n")
    print(f"wrote {out}")


if __name__ == "__main__":
    main()
