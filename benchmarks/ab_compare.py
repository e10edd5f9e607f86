"""Two glassbox checkouts side by side on this machine, in turns: did a change make the engine slower?

Each round runs checkout A, then B, each in a fresh process that imports that checkout's ``src/`` and
measures, through the public API only (so any two versions compare): a 1,024-token prefill, batch-1
decode of 64 tokens, and aggregate decode of 16 requests (128 in, 64 out), on the random bf16
Qwen3-0.6B-shaped model of benchmarks/bench_models.py, or ``--model`` (a GGUF file or HF directory) with
``--quantization``. The greedy tokens of every request are compared too (a structural change must keep them).
The A/B ratio of each figure is taken within each round (this machine's speed drifts by half within
minutes), and the medians are reported.

    .venv/bin/python benchmarks/ab_compare.py --a /path/to/old-checkout --b . [--rounds 5] [--model M]
        [--quantization int4] [--label NAME]
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))
from bench_models import qwen3_0_6b_random  # noqa: E402

RESULTS = Path(__file__).resolve().parent / "results"

# Run in the child process; only LLM, SamplingParams and RequestOutput.metrics, which every version has.
CHILD = r"""
import json, sys, time
import torch
from glassbox import LLM, SamplingParams

model, quantization = sys.argv[1], (sys.argv[2] or None)
g = torch.Generator().manual_seed(0)
t0 = time.perf_counter()
llm = LLM(model, num_kv_blocks=256, quantization=quantization)
vocab = min(llm.engine.facts.vocab_size, 150000)
def prompts(n, length):
    return [torch.randint(2, vocab, (length,), generator=g).tolist() for _ in range(n)]
load_s = time.perf_counter() - t0
one = SamplingParams(temperature=0, max_tokens=1, ignore_eos=True)
llm.generate(prompts(1, 64), SamplingParams(temperature=0, max_tokens=4, ignore_eos=True))  # warm-up
pre = llm.generate(prompts(1, 1024), one)[0].metrics
dec = llm.generate(prompts(1, 128), SamplingParams(temperature=0, max_tokens=64, ignore_eos=True))[0].metrics
t0 = time.perf_counter()
outs = llm.generate(prompts(16, 128), SamplingParams(temperature=0, max_tokens=64, ignore_eos=True))
agg = sum(len(o.token_ids) for o in outs) / (time.perf_counter() - t0)
print(json.dumps({"load_s": load_s, "prefill_1024_tok_s": pre.prefill_tok_s,
                  "decode_b1_tok_s": dec.decode_tok_s, "aggregate_16_tok_s": agg,
                  "tokens": [o.token_ids for o in outs]}))
"""


def run_one(checkout: Path, model: Path, quantization: str) -> dict[str, Any]:
    env = {**os.environ, "PYTHONPATH": str(checkout / "src")}
    out = subprocess.run(
        [sys.executable, "-c", CHILD, str(model), quantization],
        env=env,
        capture_output=True,
        text=True,
        check=True,
    )
    result: dict[str, Any] = json.loads(out.stdout.strip().splitlines()[-1])
    return result


def git_head(checkout: Path) -> str:
    try:
        return subprocess.run(
            ["git", "-C", str(checkout), "rev-parse", "--short", "HEAD"], capture_output=True, text=True
        ).stdout.strip()
    except OSError:
        return "?"


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0] if __doc__ else None)
    ap.add_argument("--a", type=Path, required=True, help="checkout A (its src/ is imported)")
    ap.add_argument("--b", type=Path, required=True, help="checkout B")
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--out", type=Path, default=None)
    ap.add_argument(
        "--model", type=Path, default=None, help="a GGUF file or HF directory (default: Qwen3-0.6B shape)"
    )
    ap.add_argument("--quantization", default="", help="--quantization for both (default: as stored)")
    ap.add_argument("--label", default="", help="a name for the results file")
    args = ap.parse_args()
    for c in (args.a, args.b):
        if not (c / "src" / "glassbox").is_dir():
            raise SystemExit(f"--a/--b: {c} holds no src/glassbox")
    model = args.model or qwen3_0_6b_random()
    rounds: list[dict[str, Any]] = []
    same_tokens = True
    for i in range(args.rounds):
        a, b = run_one(args.a, model, args.quantization), run_one(args.b, model, args.quantization)
        same_tokens &= a.pop("tokens") == b.pop("tokens")
        rounds.append({"a": a, "b": b})
        print(
            f"round {i}: " + ", ".join(f"{k} {a[k]:.1f}/{b[k]:.1f}" for k in a if k != "load_s"), flush=True
        )
    keys = [k for k in rounds[0]["a"] if k != "load_s"]
    summary = {
        k: {
            "a_median": statistics.median(r["a"][k] for r in rounds),
            "b_median": statistics.median(r["b"][k] for r in rounds),
            "b_over_a_per_round": [round(r["b"][k] / r["a"][k], 3) for r in rounds],
            "b_over_a_median": statistics.median(r["b"][k] / r["a"][k] for r in rounds),
        }
        for k in keys
    }
    result = {
        "date": time.strftime("%Y-%m-%d %H:%M"),
        "machine": {"cpu": platform.processor() or platform.machine(), "cores": os.cpu_count()},
        "a": {"path": str(args.a), "commit": git_head(args.a)},
        "b": {"path": str(args.b), "commit": git_head(args.b)},
        "model": str(args.model) if args.model else "Qwen3-0.6B shape, random bf16 weights",
        "quantization": args.quantization or "as stored",
        "load_average": Path("/proc/loadavg").read_text().split()[:3]
        if Path("/proc/loadavg").exists()
        else None,
        "same_tokens": same_tokens,
        "summary": summary,
        "rounds": rounds,
    }
    label = f"-{args.label}" if args.label else ""
    out = args.out or RESULTS / f"ab-{time.strftime('%Y-%m-%d')}{label}.json"
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(result, indent=2) + "\n")
    print(json.dumps(summary, indent=2))
    print(f"same greedy tokens in every round: {same_tokens}")
    print(f"wrote {out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
