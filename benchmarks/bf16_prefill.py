"""bf16 linears on the CPU at prompt sizes: glassbox's tiles (``linear_tiled``, what every row count ran
before) against what ``TiledBf16Linear`` runs past 16 rows in a step with prompt rows (oneDNN's GEMM on the
matrix untiled into a temporary, the copy included), and oneDNN's packed layout for reference, in turns.

    PYTHONPATH=src GLASSBOX_NUM_THREADS=1 python benchmarks/bf16_prefill.py [--out results/....json]
"""

from __future__ import annotations

import argparse
import json
import os
import time
from pathlib import Path

import torch


def _ms(fn: object, reps: int) -> float:
    for _ in range(2):
        fn()  # type: ignore[operator]
    t0 = time.perf_counter()
    for _ in range(reps):
        fn()  # type: ignore[operator]
    return (time.perf_counter() - t0) / reps * 1e3


def main() -> None:
    from glassbox.quant.dense.bf16_tiles import TiledBf16Linear, linear_tiled, untiled
    from glassbox.quant.dense.onednn import packed_matrix

    ap = argparse.ArgumentParser()
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--out", type=Path, default=None)
    a = ap.parse_args()
    if "GLASSBOX_NUM_THREADS" in os.environ:
        torch.set_num_threads(int(os.environ["GLASSBOX_NUM_THREADS"]))
    rows_out = []
    for n, k in ((3072, 1024), (1024, 3072)):  # a 1024-wide model's gate/up and down
        w = torch.randn(n, k).to(torch.bfloat16)
        lin, packed = TiledBf16Linear(w), packed_matrix(w)
        for m in (16, 32, 64, 128, 256, 512):
            x = torch.randn(m, k).to(torch.bfloat16)
            runs: dict[str, list[float]] = {
                "tiles": [],
                "untiled_gemm": [],
                "onednn_packed": [],
                "untile": [],
            }
            fns = {
                "tiles": lambda x=x, lin=lin, n=n: linear_tiled(x, lin.tiles, n, None),
                "untiled_gemm": lambda x=x, lin=lin: lin(x),
                "onednn_packed": lambda x=x, packed=packed: packed(x),
                "untile": lambda lin=lin, n=n: untiled(lin.tiles, n),
            }
            for _ in range(a.rounds):  # in turns
                for key, fn in fns.items():
                    runs[key].append(_ms(fn, 10))
            best = {key: min(v) for key, v in runs.items()}
            row = {"n": n, "k": k, "rows": m, **{f"{key}_ms": round(v, 3) for key, v in best.items()},
                   "speedup": round(best["tiles"] / best["untiled_gemm"], 2)}  # fmt: skip
            rows_out.append(row)
            print(row)
    if a.out is not None:
        a.out.write_text(json.dumps({"threads": torch.get_num_threads(), "cpus": os.cpu_count(),
                                     "load_avg_after": os.getloadavg(), "rows": rows_out}, indent=1) + "\n")  # fmt: skip


if __name__ == "__main__":
    main()
