"""Batch-1 GEMV of every GGUF type glassbox keeps in its blocks, on this CPU: the 32-value types (Q4_0, Q4_1,
Q5_0, Q5_1, IQ4_NL, Q8_0) and the 256-value K-quants (Q2_K, Q3_K, IQ4_XS, Q4_K, Q5_K, Q6_K), each a
``BlockQuantLinear`` (one kernel call: the bf16 activation row to int8, then the GEMV), on a Qwen2.5-0.5B
MLP's shapes (gate/up 4864 x 896, rows of 896 values: no K-quant fits; down 896 x 4864). Random valid blocks
(the kernels' time does not depend on the values); ``cold``: each call reads another copy of the weight (256
MiB of copies: from DRAM, as in a decode step), ``hot``: one copy (in cache). Formats in turns for
``--rounds`` rounds; medians of the per-round medians, microseconds per call and the read rate implied.

    GLASSBOX_NUM_THREADS=1 .venv/bin/python benchmarks/gguf_types_gemv.py [--rounds 5] [--threads 1]
"""

from __future__ import annotations

import argparse
import copy
import json
import os
import statistics
import sys
import time
from pathlib import Path

import numpy as np
import torch
from gguf import GGML_QUANT_SIZES, GGMLQuantizationType

sys.path.insert(0, str(Path(__file__).resolve().parent))
from kquant_gemv import time_calls  # noqa: E402

from glassbox.perf.hardware import cpu_name  # noqa: E402
from glassbox.quant.blocks import gguf32, kquant  # noqa: E402
from glassbox.quant.blocks.linear import AnyBlocks, BlockQuantLinear  # noqa: E402

SHAPES = [(4864, 896), (896, 4864)]  # (N, K)
FORMATS = ["Q4_0", "Q4_1", "Q5_0", "Q5_1", "IQ4_NL", "Q8_0", "Q2_K", "Q3_K", "IQ4_XS", "Q4_K", "Q5_K", "Q6_K"]
# float16 scales (mins) inside a block, written small so that every value is finite
HALVES = {"Q4_0": (0,), "Q4_1": (0, 2), "Q5_0": (0,), "Q5_1": (0, 2), "IQ4_NL": (0,), "Q8_0": (0,),
          "Q2_K": (80, 82), "Q3_K": (108,), "IQ4_XS": (0,), "Q4_K": (0, 2), "Q5_K": (0, 2), "Q6_K": (208,)}  # fmt: skip
COLD_BYTES = 256 << 20


def weights(fmt: str, n: int, k: int, seed: int) -> AnyBlocks | None:
    """Random valid blocks of ``fmt`` (None where the type's blocks do not fit a row of k)."""
    block, size = GGML_QUANT_SIZES[GGMLQuantizationType[fmt]]
    if k % block:
        return None
    rng = np.random.default_rng(seed)
    raw = rng.integers(0, 256, size=(n * k // block, size), dtype=np.uint8)
    for off in HALVES[fmt]:
        raw[:, off : off + 2] = (
            rng.uniform(1e-4, 1e-3, len(raw)).astype(np.float16).view(np.uint8).reshape(-1, 2)
        )
    reader = kquant.from_gguf if fmt in kquant.KQUANT_TYPES else gguf32.from_gguf
    return reader(fmt, raw.reshape(n, -1), (n, k))


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0] if __doc__ else None)
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--calls", type=int, default=200)
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--formats", default=",".join(FORMATS))
    ap.add_argument("--out", type=Path, default=None)
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    formats = args.formats.split(",")
    results: dict[str, dict[str, dict[str, float]]] = {}
    loads = [os.getloadavg()[0]]
    for n, k in SHAPES:
        shape = f"{n}x{k}"
        layers: dict[str, list[BlockQuantLinear]] = {}
        for fmt in formats:
            first = weights(fmt, n, k, 0)
            if first is None:
                continue
            copies = max(1, COLD_BYTES // first.nbytes)
            layers[fmt] = [BlockQuantLinear(first)]
            while len(layers[fmt]) < copies:  # distinct memory: each call reads DRAM
                layers[fmt].append(BlockQuantLinear(copy.deepcopy(first)))
        x = torch.randn(1, k).bfloat16()
        rounds: dict[str, dict[str, list[float]]] = {f: {"cold": [], "hot": []} for f in layers}
        for _ in range(args.rounds):
            for fmt in layers:
                rounds[fmt]["cold"].append(time_calls(layers[fmt], x, args.calls))
                rounds[fmt]["hot"].append(time_calls(layers[fmt][:1], x, args.calls))
            loads.append(os.getloadavg()[0])
        results[shape] = {}
        for fmt in layers:
            nbytes = layers[fmt][0].w.nbytes
            cold, hot = statistics.median(rounds[fmt]["cold"]), statistics.median(rounds[fmt]["hot"])
            results[shape][fmt] = r = {
                "bits_per_weight": round(8 * nbytes / (n * k), 4), "cold_us": round(cold, 1),
                "hot_us": round(hot, 1), "cold_gb_s": round(nbytes / cold / 1e3, 2),
                "cold_rounds_us": [round(v, 1) for v in rounds[fmt]["cold"]],
            }  # fmt: skip
            print(f"{shape:>9} {fmt:6} {r['bits_per_weight']:6.3f} bpw  cold {cold:7.1f} us "
                  f"({r['cold_gb_s']:5.2f} GB/s)  hot {hot:7.1f} us")  # fmt: skip
    out = (
        args.out
        or Path(__file__).resolve().parent / "results" / f"gguf-types-gemv-{time.strftime('%Y-%m-%d')}.json"
    )
    meta = {"cpu": cpu_name(), "threads": args.threads, "rounds": args.rounds, "loadavg_1m": loads}
    out.write_text(json.dumps({**meta, "results": results}, indent=1))
    print(f"wrote {out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
