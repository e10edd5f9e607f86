"""Batch-1 GEMV on this CPU: the MXFP4 / NVFP4 kernel (kernels/cpu_fp4.c) against the Q4_0 block kernel
(kernels/cpu_quant.c) on the same shapes, each call quantizing its bf16 activation row to int8 blocks
and writing bf16 (what a decode step's linear does), plus the bf16 oneDNN-packed GEMV for scale.

The kernels run in turns (one timed batch of calls each, ``--rounds`` times: this machine's speed drifts),
single-threaded by default; the median per call (wall clock, and this thread's CPU time, which leaves out
time the OS gave other processes on a shared machine), the least disturbed round's CPU time, the effective
weight bandwidth (bytes stored / wall time) and the speed ratios to Q4_0 (per-round medians; best rounds)
are reported, and written to benchmarks/results/fp4-gemv-<date>.json.

    .venv/bin/python benchmarks/fp4_gemv.py [--threads 1] [--rounds 7]
"""

from __future__ import annotations

import argparse
import json
import statistics
import time
from collections.abc import Callable
from pathlib import Path

import torch

from glassbox.kernels.native import library
from glassbox.quant.blocks.quantize import quantize as quantize_blocks
from glassbox.quant.dense.onednn import packed_matrix
from glassbox.quant.fp4.quantize import quantize as quantize_fp4

RESULTS = Path(__file__).resolve().parent / "results"
SHAPES = [
    (2048, 2048),
    (5760, 2880),
    (2880, 2880),
]  # (N, K): a 2B-class projection; gpt-oss-20b's gate_up, down


def kernels(n: int, k: int, threads: int) -> dict[str, tuple[Callable[[], None], int]]:
    """name -> (one call, weight bytes)."""
    lib = library()
    assert lib is not None, "no C compiler: the kernels are not built"
    w = torch.randn(n, k) * 0.05
    x = torch.randn(1, k).bfloat16()
    out = torch.empty(1, n, dtype=torch.bfloat16)
    q4 = quantize_blocks(w, 4)
    found: dict[str, tuple[Callable[[], None], int]] = {
        "q4_0": (
            lambda: lib.gb_linear_blocks(
                x.data_ptr(), 1, k, *q4.pointers(), None, n, q4.padded, q4.bits, out.data_ptr(), 1, threads
            ),
            q4.nbytes,
        )
    }
    for kind in ("mxfp4", "nvfp4"):
        f = quantize_fp4(w, kind)

        def call(f: object = f) -> None:
            assert hasattr(f, "pointers")
            lib.gb_fp4_linear(
                x.data_ptr(), 1, k, *f.pointers(), None, n, f.padded, out.data_ptr(), 1, threads
            )

        found[kind] = (call, f.nbytes)
    bf16 = packed_matrix(w.bfloat16())
    found["bf16 (oneDNN)"] = (lambda: bf16(x), n * k * 2)
    return found


def time_call(fn: Callable[[], None], budget_s: float = 0.25) -> tuple[float, float]:
    """(wall, CPU) seconds per call: the medians of 5 batches, each about a fifth of the budget. With one
    thread the CPU time (this thread's) leaves out the time the OS ran other processes instead."""
    fn()
    t0 = time.perf_counter()
    fn()
    once = max(time.perf_counter() - t0, 1e-7)
    reps = max(1, int(budget_s / 5 / once))
    wall, cpu = [], []
    for _ in range(5):
        t0, c0 = time.perf_counter(), time.thread_time()
        for _ in range(reps):
            fn()
        wall.append((time.perf_counter() - t0) / reps)
        cpu.append((time.thread_time() - c0) / reps)
    return statistics.median(wall), statistics.median(cpu)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0] if __doc__ else None)
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--rounds", type=int, default=7)
    ap.add_argument("--out", type=Path, default=None)
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    rows = []
    for n, k in SHAPES:
        calls = kernels(n, k, args.threads)
        wall: dict[str, list[float]] = {name: [] for name in calls}
        cpu: dict[str, list[float]] = {name: [] for name in calls}
        for _ in range(args.rounds):  # in turns
            for name, (fn, _) in calls.items():
                w, c = time_call(fn)
                wall[name].append(w)
                cpu[name].append(c)
        for name, (_, nbytes) in calls.items():
            us, cpu_us = statistics.median(wall[name]) * 1e6, statistics.median(cpu[name]) * 1e6
            ratio = statistics.median(q / t for q, t in zip(wall["q4_0"], wall[name], strict=True))
            cpu_ratio = statistics.median(q / t for q, t in zip(cpu["q4_0"], cpu[name], strict=True))
            best_cpu_us = min(cpu[name]) * 1e6  # contention only slows a call down: the least disturbed round
            row = {"shape": f"{n}x{k}", "kernel": name, "us": round(us, 1), "cpu_us": round(cpu_us, 1),
                   "best_cpu_us": round(best_cpu_us, 1),
                   "speed vs q4_0 (best rounds, CPU time)": round(min(cpu["q4_0"]) * 1e6 / best_cpu_us, 3),
                   "GB/s": round(nbytes / us / 1e3, 1), "bits/weight": round(8 * nbytes / (n * k), 3),
                   "speed vs q4_0 (per-round median, wall)": round(ratio, 3),
                   "speed vs q4_0 (per-round median, CPU time)": round(cpu_ratio, 3)}  # fmt: skip
            rows.append(row)
            print(row, flush=True)
    out = args.out or RESULTS / f"fp4-gemv-{time.strftime('%Y-%m-%d')}.json"
    out.write_text(json.dumps({"threads": args.threads, "rounds": args.rounds, "rows": rows}, indent=1))
    print(f"wrote {out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
