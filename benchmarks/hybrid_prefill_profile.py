"""Where a hybrid model's prompt time goes in glassbox: one GGUF (benchmarks/qwen3next_gguf.py or
nemotron_h_gguf.py writes them), batch 1, a 512-token prompt of random ids.

Prints JSON: the warm prefill rate (``--rounds`` fresh prompts after one warm-up prompt of the same length;
the first prompt of a length pays one-time costs, reported as ``cold_tok_s``), the wall time per module
(forward hooks: each decoder layer, its mixer and MLP / MoE, their projections) and, with ``--ops``, the
top PyTorch ops of one prefill (torch.profiler, self CPU time). Run it with another ``PYTHONPATH`` to
profile another glassbox tree on the same file.

    PYTHONPATH=src .venv/bin/python benchmarks/hybrid_prefill_profile.py FILE.gguf [--threads 2] [--ops]
"""

from __future__ import annotations

import argparse
import json
import statistics
import time
from collections import defaultdict
from pathlib import Path
from typing import Any

import numpy as np
import torch
from torch import nn

from glassbox import LLM, SamplingParams


def _prefill(llm: LLM, prompt: list[int]) -> float:
    """tok/s of one prompt's prefill (the engine's own metric: the step that made the first token)."""
    m = llm.generate([prompt], SamplingParams(temperature=0, max_tokens=1, ignore_eos=True))[0].metrics
    assert m is not None
    return float(m.prefill_tok_s)


def _module_times(model: nn.Module, run: Any) -> dict[str, float]:
    """ms per module (names up to 3 levels below a layer) over ``run()``."""
    times: dict[str, float] = defaultdict(float)
    start: dict[str, float] = {}
    hooks = []
    for name, m in model.named_modules():
        if not name or name.count(".") > 5:
            continue
        key = name.split("layers.", 1)[-1]

        def pre(_m: nn.Module, _a: Any, key: str = key) -> None:
            start[key] = time.perf_counter()

        def post(_m: nn.Module, _a: Any, _o: Any, key: str = key) -> None:
            times[key] += 1000 * (time.perf_counter() - start[key])

        hooks += [m.register_forward_pre_hook(pre), m.register_forward_hook(post)]
    run()
    for h in hooks:
        h.remove()
    return {k: round(v, 1) for k, v in sorted(times.items(), key=lambda kv: -kv[1])}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0] if __doc__ else None)
    ap.add_argument("gguf", type=Path)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--prompt-tokens", type=int, default=512)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--ops", action="store_true", help="also torch.profiler's op table of one prefill")
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    llm = LLM(str(args.gguf), enable_prefix_caching=False, max_model_len=4096)
    vocab = llm.engine.facts.vocab_size
    rng = np.random.default_rng(7)

    def prompt() -> list[int]:
        return rng.integers(5, vocab, size=args.prompt_tokens).tolist()

    cold = _prefill(llm, prompt())
    warm = [_prefill(llm, prompt()) for _ in range(args.rounds)]
    model = llm.engine.executor.model
    p = prompt()
    out: dict[str, Any] = {
        "file": args.gguf.name,
        "threads": args.threads,
        "loadavg": open("/proc/loadavg").read().split()[:3],
        "cold_tok_s": round(cold, 1),
        "warm_tok_s": [round(w, 1) for w in warm],
        "warm_median_tok_s": round(statistics.median(warm), 1),
        "module_ms": _module_times(model, lambda: _prefill(llm, p)),
    }
    if args.ops:
        from torch.profiler import ProfilerActivity, profile

        with profile(activities=[ProfilerActivity.CPU]) as prof:
            _prefill(llm, p)
        ops = sorted(prof.key_averages(), key=lambda e: -e.self_cpu_time_total)[:15]
        out["ops_ms"] = {e.key: [round(e.self_cpu_time_total / 1000, 1), e.count] for e in ops}
    print(json.dumps(out, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
