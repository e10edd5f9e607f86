"""The sampler's draw on this CPU: inverse transform (one uniform a row, engine/sampler.draw) against the
exponential race it replaced (argmax p / E over the whole vocabulary, E ~ Exp(1): V draws a row), in turns.

1. ``sample_on_device`` alone on random logits, temperature 0.8 (and top-k 50 + top-p 0.9), batches 1, 16 and
   256, vocabularies 49,152 (SmolLM2) and 151,936 (Qwen3): milliseconds per call, median of the rounds.
2. The default model (SmolLM2-135M, its Q4_1 GGUF) decoding 128 tokens at temperature 0.8, one request and
   16 at once: output tok/s under each draw; and with top_p 0.9 alone, the top-p candidates first
   (sampler.TOP_P_CANDIDATES) against a full-vocabulary sort of every row.
Writes benchmarks/results/sampler-draw-<date>.json.

    PYTHONPATH=src .venv/bin/python benchmarks/sampler_draw.py [--rounds 5] [--threads 2]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch

from glassbox import LLM, SamplingParams
from glassbox.engine import sampler
from glassbox.engine.sequence import Sequence
from glassbox.perf.hardware import cpu_name

RESULTS = Path(__file__).resolve().parent / "results"
INVERSE = sampler.draw


def exponential_race(probs: torch.Tensor, u: torch.Tensor) -> torch.Tensor:
    """The previous draw: argmax p / E with E ~ Exp(1) per token (``u`` unused; its draw stands for the
    one uniform the new draw takes)."""
    return (probs / torch.empty_like(probs).exponential_()).argmax(dim=-1)


DRAWS: dict[str, Callable[[torch.Tensor, torch.Tensor], torch.Tensor]] = {
    "inverse_transform": INVERSE,
    "exponential_race": exponential_race,
}


def use(name: str) -> None:
    sampler.draw = DRAWS[name]  # sample_on_device calls the module's ``draw``


def timed_ms(fn: Callable[[], Any], repeat: int) -> float:
    fn()
    t = time.perf_counter()
    for _ in range(repeat):
        fn()
    return 1e3 * (time.perf_counter() - t) / repeat


def alone(rounds: int) -> dict[str, Any]:
    out: dict[str, Any] = {}
    gen = torch.Generator().manual_seed(0)
    for vocab in (49152, 151936):
        for batch in (1, 16, 256):
            logits = torch.randn(batch, vocab, generator=gen) * 3
            for label, sp in (
                ("temperature", SamplingParams(temperature=0.8)),
                ("top_k_top_p", SamplingParams(temperature=0.8, top_k=50, top_p=0.9)),
            ):
                seqs = [Sequence(i, f"r{i}", [1, 2, 3], sp) for i in range(batch)]
                runs: dict[str, list[float]] = {n: [] for n in DRAWS}
                for _ in range(rounds):
                    for name in DRAWS:
                        use(name)
                        call = lambda x=logits, s=seqs: sampler.sample_on_device(x.clone(), s, set(), gen)  # noqa: E731
                        runs[name].append(timed_ms(call, 3))
                use("inverse_transform")
                key = f"v{vocab}_b{batch}_{label}"
                out[key] = {n: round(statistics.median(v), 3) for n, v in runs.items()}
                print(key, out[key], flush=True)
    return out


def end_to_end(rounds: int) -> dict[str, Any]:
    """SmolLM2 decoding 128 tokens at temperature 0.8, in turns: the two draws; then with top_p 0.9 (no
    top_k), its candidates first (sampler.TOP_P_CANDIDATES) against a full sort of every row."""
    llm = LLM(None, enable_prefix_caching=False)
    prompts = [f"Write a short story about a {w}." for w in ("cat", "ship", "tree", "robot")] * 4
    plain = SamplingParams(temperature=0.8, max_tokens=128, ignore_eos=True)
    top_p = SamplingParams(temperature=0.8, top_p=0.9, max_tokens=128, ignore_eos=True)
    candidates = sampler.TOP_P_CANDIDATES

    def variant(draw: str, cands: int) -> None:
        use(draw)
        sampler.TOP_P_CANDIDATES = cands

    cases = {  # label: (params, {variant: setup})
        "temperature": (plain, {"inverse_transform": ("inverse_transform", candidates),
                                "exponential_race": ("exponential_race", candidates)}),
        "top_p": (top_p, {"candidates": ("inverse_transform", candidates),
                          "full_sort": ("inverse_transform", 1 << 30)}),
    }  # fmt: skip
    out: dict[str, Any] = {}
    for label, (params, variants) in cases.items():
        for batch in (1, 16):
            llm.generate(prompts[:batch], SamplingParams(temperature=0.8, max_tokens=8, ignore_eos=True))
            runs: dict[str, list[float]] = {n: [] for n in variants}
            for _ in range(rounds):
                for name, setup in variants.items():
                    variant(*setup)
                    t = time.perf_counter()
                    res = llm.generate(prompts[:batch], params)
                    runs[name].append(
                        sum(len(r.outputs[0].token_ids) for r in res) / (time.perf_counter() - t)
                    )
            variant("inverse_transform", candidates)
            new, old = list(variants)
            key = f"smollm2_{label}_b{batch}"
            out[key] = {
                "tok_s": {n: round(statistics.median(v), 1) for n, v in runs.items()},
                "ratio_per_round": [round(a / b, 3) for a, b in zip(runs[new], runs[old], strict=True)],
            }
            print(key, out[key], flush=True)
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0] if __doc__ else None)
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--out", type=Path, default=None)
    ap.add_argument("--skip-alone", action="store_true", help="only the end-to-end decode")
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    result = {
        "date": time.strftime("%Y-%m-%d %H:%M"),
        "machine": {"cpu": cpu_name(), "cores": os.cpu_count(), "threads": args.threads},
        "load_avg_start": os.getloadavg(),
        "sample_on_device_ms": {} if args.skip_alone else alone(args.rounds),
        "decode": end_to_end(args.rounds),
        "load_avg_end": os.getloadavg(),
    }
    out = args.out or RESULTS / f"sampler-draw-{time.strftime('%Y-%m-%d')}.json"
    out.write_text(json.dumps(result, indent=2) + "\n")
    print(f"wrote {out}")


if __name__ == "__main__":
    main()
