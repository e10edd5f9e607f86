"""CPU prefill attention alone: glassbox's bf16 tiled-GEMM attention vs PyTorch's SDPA on the same inputs.

One layer of a Qwen3-0.6B shape (16 query heads, 8 KV heads, head size 128), bf16, causal, prompts of
128 to 4,096 tokens; also a chunk after a cached prefix and a sliding window. Each case reports the median
milliseconds of both and their largest error against float32 SDPA on the same bf16 inputs.

    .venv/bin/python benchmarks/cpu_attention.py     # writes benchmarks/results/cpu-attention-<date>.json
"""

from __future__ import annotations

import datetime
import json
import platform
import statistics
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch

from glassbox.kernels.cpu_prefill import prefill_attention_bf16
from glassbox.layers.attention import PrefillSeq, prefill_attention
from glassbox.perf.hardware import cpu_name

HQ, HK, D, BS = 16, 8, 128, 16
CASES = [  # (new tokens, cached prefix, window)
    (128, 0, None), (1024, 0, None), (2048, 0, None), (4096, 0, None), (512, 1536, None), (2048, 0, 512),
]  # fmt: skip


def median_ms(fn: Callable[[], None], reps: int) -> float:
    fn()
    times = []
    for _ in range(reps):
        t = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t)
    return 1e3 * statistics.median(times)


def case(n: int, start: int, window: int | None) -> dict[str, Any]:
    g = torch.Generator().manual_seed(n + start)
    total = start + n
    blocks = (total + BS - 1) // BS
    cache = torch.randn(2, blocks + 4, BS, HK, D, generator=g).to(torch.bfloat16)
    table = torch.randperm(blocks + 4, generator=g)[:blocks]
    slots = (table[:, None] * BS + torch.arange(BS)).reshape(-1)[start:total]
    flat = cache.view(2, -1, HK, D)
    k, v = flat[0, slots], flat[1, slots]
    q = torch.randn(n, HQ, D, generator=g).to(torch.bfloat16)
    seqs = [PrefillSeq(0, n, start, table)]
    scale = D**-0.5
    ref = torch.empty(n, HQ, D)
    prefill_attention(q.float(), k.float(), v.float(), cache.float(), seqs, scale, window, ref)
    sdpa, ours = torch.empty_like(q), torch.empty_like(q)
    reps = 3 if total >= 4096 else 7
    sdpa_ms = median_ms(lambda: prefill_attention(q, k, v, cache, seqs, scale, window, sdpa), reps)
    ours_ms = median_ms(lambda: prefill_attention_bf16(q, k, v, cache, seqs, scale, window, ours), reps)
    causal_pairs = sum(min(start + i + 1, window or total) for i in range(n))
    flops = 4 * causal_pairs * D * HQ
    return {
        "new_tokens": n, "cached_prefix": start, "window": window,
        "sdpa_ms": sdpa_ms, "glassbox_ms": ours_ms, "speedup": sdpa_ms / ours_ms,
        "sdpa_gflops": flops / sdpa_ms / 1e6, "glassbox_gflops": flops / ours_ms / 1e6,
        "sdpa_max_err": (sdpa.float() - ref).abs().max().item(),
        "glassbox_max_err": (ours.float() - ref).abs().max().item(),
    }  # fmt: skip


def main() -> None:
    rows = [case(*c) for c in CASES]
    for r in rows:
        print(
            f"{r['new_tokens']:>5} new + {r['cached_prefix']:>4} cached, window {r['window']}: "
            f"SDPA {r['sdpa_ms']:7.1f} ms ({r['sdpa_gflops']:4.0f} GFLOP/s, err {r['sdpa_max_err']:.4f})  "
            f"glassbox {r['glassbox_ms']:7.1f} ms ({r['glassbox_gflops']:4.0f} GFLOP/s, err "
            f"{r['glassbox_max_err']:.4f})  x{r['speedup']:.2f}"
        )
    out = {
        "date": datetime.date.today().isoformat(),
        "machine": {
            "platform": platform.platform(),
            "cpu": cpu_name(),
            "threads": torch.get_num_threads(),
            "torch": torch.__version__,
        },  # fmt: skip
        "shape": {"q_heads": HQ, "kv_heads": HK, "head_dim": D, "dtype": "bfloat16"},
        "cases": rows,
    }
    dest = Path(__file__).resolve().parent / "results" / f"cpu-attention-{out['date']}.json"
    dest.write_text(json.dumps(out, indent=2) + "\n")
    print(f"wrote {dest}", file=sys.stderr)


if __name__ == "__main__":
    main()
