"""Batch-1 GEMV of GGUF K-quants (Q4_K, Q6_K) against the 32-value block formats (Q4_0, Q8_0) on this CPU.

Each format's ``BlockQuantLinear`` (one kernel call: the bf16 activation row to int8, then the GEMV) on an
(N, K) weight, one thread. Q4_0 and Q8_0 are quantized by the gguf package; the K-quants are random valid
super-blocks (the kernels' time does not depend on the values). ``cold``: each call reads a different copy
of the weight, the copies together over 256 MiB, so the weights come from DRAM as in a model's decode step;
``hot``: one copy, called again and again (in cache). The formats take turns for ``--rounds`` rounds (this
machine's speed drifts); medians of the per-round medians are reported, in microseconds per call, with the
weight's bytes and the read rate they imply.

    GLASSBOX_NUM_THREADS=1 .venv/bin/python benchmarks/kquant_gemv.py [--rounds 5]
"""

from __future__ import annotations

import argparse
import copy
import json
import statistics
import time
from pathlib import Path

import numpy as np
import torch
from gguf import GGML_QUANT_SIZES, GGMLQuantizationType
from gguf.quants import quantize as gguf_quantize

from glassbox.perf.hardware import cpu_name
from glassbox.quant.blocks import kquant
from glassbox.quant.blocks.linear import AnyBlocks, BlockQuantLinear
from glassbox.quant.blocks.weights import from_gguf

SHAPES = [(2048, 2048), (576, 1536)]  # (N, K); 576 x 1536: SmolLM2-135M's down_proj
FORMATS = ["Q4_0", "Q8_0", "Q4_K", "Q6_K"]
COLD_BYTES = 256 << 20
D_OFFSETS = {"Q4_K": (0, 2), "Q5_K": (0, 2), "Q6_K": (208,)}  # float16 scales inside a super-block


def weights(fmt: str, n: int, k: int, seed: int) -> AnyBlocks:
    rng = np.random.default_rng(seed)
    qtype = GGMLQuantizationType[fmt]
    if fmt in kquant.KQUANT_TYPES:
        size = GGML_QUANT_SIZES[qtype][1]
        raw = rng.integers(0, 256, size=(n * k // 256, size), dtype=np.uint8)
        for off in D_OFFSETS[fmt]:
            d = rng.uniform(1e-4, 1e-3, len(raw)).astype(np.float16)
            raw[:, off : off + 2] = d.view(np.uint8).reshape(-1, 2)
        return kquant.from_gguf(fmt, raw.reshape(n, -1), (n, k))
    w = (rng.standard_normal((n, k)) * 0.02).astype(np.float32)
    return from_gguf(fmt, gguf_quantize(w, qtype), (n, k))


def time_calls(layers: list[BlockQuantLinear], x: torch.Tensor, calls: int) -> float:
    """Median microseconds per call over ``calls`` calls cycling through ``layers``."""
    times = []
    for i in range(calls):
        lin = layers[i % len(layers)]
        t0 = time.perf_counter()
        lin(x)
        times.append(time.perf_counter() - t0)
    return statistics.median(times) * 1e6


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0] if __doc__ else None)
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--calls", type=int, default=200)
    ap.add_argument("--out", type=Path, default=None)
    args = ap.parse_args()
    torch.set_num_threads(1)
    results: dict[str, dict[str, dict[str, float]]] = {}
    for n, k in SHAPES:
        shape = f"{n}x{k}"
        layers: dict[str, list[BlockQuantLinear]] = {}
        for fmt in FORMATS:
            first = weights(fmt, n, k, 0)
            copies = max(1, COLD_BYTES // first.nbytes)
            layers[fmt] = [BlockQuantLinear(first)] + [
                BlockQuantLinear(weights(fmt, n, k, s)) for s in range(1, min(copies, 8))
            ]
            # the rest: the same bytes copied (distinct memory, so each call still reads DRAM)
            while len(layers[fmt]) < copies:
                layers[fmt].append(BlockQuantLinear(copy.deepcopy(layers[fmt][len(layers[fmt]) % 8].w)))
        x = torch.randn(1, k).bfloat16()
        per_round: dict[str, dict[str, list[float]]] = {f: {"cold": [], "hot": []} for f in FORMATS}
        for _ in range(args.rounds):
            for fmt in FORMATS:
                per_round[fmt]["cold"].append(time_calls(layers[fmt], x, args.calls))
                per_round[fmt]["hot"].append(time_calls(layers[fmt][:1], x, args.calls))
        results[shape] = {}
        for fmt in FORMATS:
            nbytes = layers[fmt][0].w.nbytes
            cold = statistics.median(per_round[fmt]["cold"])
            hot = statistics.median(per_round[fmt]["hot"])
            results[shape][fmt] = {
                "bytes": nbytes,
                "bits_per_weight": round(8 * nbytes / (n * k), 4),
                "cold_us": round(cold, 1),
                "hot_us": round(hot, 1),
                "cold_rounds_us": [round(v, 1) for v in per_round[fmt]["cold"]],
                "hot_rounds_us": [round(v, 1) for v in per_round[fmt]["hot"]],
                "cold_gb_s": round(nbytes / cold / 1e3, 2),
            }
            r = results[shape][fmt]
            print(
                f"{shape:>10} {fmt:5} {r['bits_per_weight']:6.3f} bpw  cold {cold:8.1f} us ({r['cold_gb_s']:5.2f} GB/s)"
                f"  hot {hot:8.1f} us   rounds cold {r['cold_rounds_us']}"
            )
    out = (
        args.out
        or Path(__file__).resolve().parent / "results" / f"kquant-gemv-{time.strftime('%Y-%m-%d')}.json"
    )
    out.write_text(
        json.dumps({"cpu": cpu_name(), "threads": 1, "rounds": args.rounds, "results": results}, indent=1)
    )
    print(f"wrote {out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
