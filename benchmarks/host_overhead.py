"""Host work per engine step, on the CPU: what a GPU would sit idle for between its steps.

A batch of decode steps of the bundled demo model (with ``--batch`` sequences, 256 by default) in two
sampling modes: greedy, and random with top-k/top-p (and one seeded request). Each step's StepRecord gives
its duration and its execute time (launch to sampled tokens); the step's host phases are timed by
wrapping the engine's methods: scheduling, the executor's inputs, the model forward, the LM head,
sampling (the sampler and the ``.tolist()`` of its draws) and the text work (detokenize, stop strings,
outputs). ``host_ms`` is the step less the forward, the LM head and the sampler: on a GPU those are
device work, the rest is what the device waits for (less what async output overlaps). Then
the sampler alone on (batch, vocab) logits of a real vocabulary (151,936, Qwen3).

    PYTHONPATH=src python benchmarks/host_overhead.py [--batch 256] [--steps 40] [--out FILE.json]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import time
from collections import defaultdict
from collections.abc import Callable
from typing import Any

import torch

from glassbox import LLM, SamplingParams
from glassbox.engine import sampler as sampler_mod
from glassbox.engine.sequence import Sequence


def _timed(obj: Any, name: str, bucket: list[float]) -> None:
    """Wrap ``obj.name`` so that each call's seconds are appended to ``bucket``."""
    fn = getattr(obj, name)

    def wrapper(*args: Any, **kwargs: Any) -> Any:
        t = time.perf_counter()
        try:
            return fn(*args, **kwargs)
        finally:
            bucket.append(time.perf_counter() - t)

    setattr(obj, name, wrapper)


def engine_steps(batch: int, steps: int, params: SamplingParams, warm: int) -> dict[str, float]:
    """Median milliseconds per decode step, after ``warm`` tokens per sequence: the whole step, execute,
    and each host phase."""
    llm = LLM("glassbox-demo", dtype="float32", device="cpu", max_num_seqs=batch, max_model_len=1024)
    eng = llm.engine
    times: dict[str, list[float]] = defaultdict(list)
    ex = eng.executor
    _timed(eng.scheduler, "schedule", times["schedule"])
    _timed(ex, "_flatten", times["inputs"])
    _timed(ex, "_metadata", times["inputs"])
    _timed(ex, "forward", times["forward"])
    _timed(ex.model, "compute_logits", times["lm_head"])
    _timed(eng, "_flush", times["text work"])
    import glassbox.engine.step_sampling as te  # where the step's sampling calls the sampler

    sample = te.sample_on_device
    te.sample_on_device = lambda *a, **k: _sample_timed(sample, times["sampling"], *a, **k)  # type: ignore
    vocab = eng.model_config.vocab_size
    seeded = SamplingParams(**{**_fields(params), "seed": 7}) if not params.greedy else params
    for i in range(batch):
        prompt = [(31 * i + 7 * j) % (vocab - 10) + 10 for j in range(16)]
        eng.add_request(f"r{i}", prompt, seeded if i == 0 else params)
    while eng.scheduler.waiting or any(s.num_output_tokens < warm for s in eng.scheduler.running):
        eng.step()
    eng.step_records.clear()
    for v in times.values():
        v.clear()
    for _ in range(steps):
        eng.step()
    te.sample_on_device = sample
    recs = [r for r in eng.step_records if r.phase == "decode"]
    assert len(recs) == steps and all(r.batch_size == batch for r in recs), "every step a full decode"
    res = {
        "step_ms": 1e3 * statistics.median(r.duration_s for r in recs),
        "execute_ms": 1e3 * statistics.median(r.execute_s for r in recs),
        "outside_execute_ms": 1e3 * statistics.median(r.duration_s - r.execute_s for r in recs),
    }
    for name, vals in times.items():
        per_step = [sum(vals[i::steps]) for i in range(steps)] if len(vals) % steps == 0 else vals
        res[f"{name}_ms"] = 1e3 * statistics.median(per_step)
    # what a GPU would wait for: all but the forward, the LM head and the sampler (device work there)
    res["host_ms"] = res["step_ms"] - res["forward_ms"] - res["lm_head_ms"] - res["sampling_ms"]
    return res


def _fields(sp: SamplingParams) -> dict[str, Any]:
    import dataclasses

    return {f.name: getattr(sp, f.name) for f in dataclasses.fields(sp)}


def _sample_timed(fn: Callable[..., Any], bucket: list[float], *args: Any, **kwargs: Any) -> Any:
    t = time.perf_counter()
    out = fn(*args, **kwargs)
    out.results()  # the .tolist() that waits for the draws (on CUDA); done again by the engine, cheaply
    bucket.append(time.perf_counter() - t)
    return out


def sampler_alone(batch: int, vocab: int, params: SamplingParams, reps: int = 3) -> float:
    """Median milliseconds of one sampler call on random (batch, vocab) float32 logits."""
    seqs = [Sequence(i, f"r{i}", [1, 2, 3], params) for i in range(batch)]
    gen = torch.Generator().manual_seed(0)
    logits = torch.randn(batch, vocab, generator=gen)
    times = []
    for _ in range(reps + 1):
        x = logits.clone()
        t = time.perf_counter()
        sampler_mod.sample_on_device(x, seqs, {1}, gen).results()
        times.append(time.perf_counter() - t)
    return 1e3 * statistics.median(times[1:])


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--batch", type=int, default=256)
    ap.add_argument("--steps", type=int, default=40)
    ap.add_argument("--vocab", type=int, default=151936)
    ap.add_argument("--warm", type=int, default=300, help="tokens per sequence before the timed steps")
    ap.add_argument("--threads", type=int, default=1, help="torch threads (1: steadier on a shared host)")
    ap.add_argument("--out", help="write the results here as JSON")
    args = ap.parse_args()
    os.environ["GLASSBOX_NUM_THREADS"] = str(args.threads)  # the executor sets it at start
    torch.set_num_threads(args.threads)
    modes = {
        "greedy": SamplingParams(temperature=0, max_tokens=700, ignore_eos=True),
        "top_k_top_p": SamplingParams(temperature=0.8, top_k=50, top_p=0.9, max_tokens=700, ignore_eos=True),
        "temperature_only": SamplingParams(temperature=0.8, max_tokens=700, ignore_eos=True),
    }
    res: dict[str, Any] = {
        "batch": args.batch,
        "steps": args.steps,
        "warm": args.warm,
        "threads": args.threads,
    }
    for name, sp in modes.items():
        res[f"engine_{name}"] = engine_steps(args.batch, args.steps, sp, args.warm)
        res[f"sampler_{name}_vocab{args.vocab}_ms"] = sampler_alone(args.batch, args.vocab, sp)
        print(name, json.dumps(res[f"engine_{name}"]), f"sampler alone {res[f'sampler_{name}_vocab{args.vocab}_ms']:.1f} ms", flush=True)  # fmt: skip
    if args.out:
        with open(args.out, "w") as f:
            json.dump(res, f, indent=2)


if __name__ == "__main__":
    main()
