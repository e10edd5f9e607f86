"""Hybrid models' decode recurrence per layer: glassbox's C kernel (kernels/cpu_recurrent.c, in place on the
state rows) against the PyTorch ops (gather the slots' rows, the step, scatter back), at real widths:
Qwen3-Next / Qwen3.5's Gated DeltaNet (32 v heads of 128 x 128) and Nemotron 3 Super's Mamba-2 (128 heads
of 64 x 128), for 1 and 8 sequences. The two run in turns, the median of each kept.

    PYTHONPATH=src python benchmarks/hybrid_decode_recurrence.py [--reps 30] [--out FILE]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import time
from collections.abc import Callable
from pathlib import Path

import torch

from glassbox.kernels import cpu_recurrent
from glassbox.layers.gated_delta_rule import delta_step, l2_normalize
from glassbox.layers.ssd_scan import ssd_step


def timed(fn: Callable[[], object]) -> float:
    t0 = time.perf_counter()
    fn()
    return (time.perf_counter() - t0) * 1e3


def case(kind: str, n: int, reps: int) -> dict[str, object]:
    torch.manual_seed(0)
    slots = torch.arange(n) + 1
    if kind == "gated_deltanet":
        h, r, c = 32, 128, 128
        q, k = l2_normalize(torch.randn(n, h, r)) * r**-0.5, l2_normalize(torch.randn(n, h, r))
        v, g, beta = torch.randn(n, h, c), -torch.rand(n, h), torch.rand(n, h)
    else:
        h, r, c = 128, 64, 128
        x, dt, a, d = torch.randn(n, h, r), torch.rand(n, h), -torch.rand(h), torch.randn(h)
        b, cc = torch.randn(n, h, c), torch.randn(n, h, c)
    rows = torch.zeros(n + 2, 100 + h * r * c)
    mats = rows[:, 100:].view(n + 2, h, r, c)
    mats.normal_(0.0, 0.1)

    def torch_ops() -> None:
        if kind == "gated_deltanet":
            _, s = delta_step(q, k, v, g, beta, mats[slots])
        else:
            _, s = ssd_step(x, dt, a, b, cc, d, mats[slots])
        mats.index_copy_(0, slots, s)

    def c_kernel() -> None:
        if kind == "gated_deltanet":
            cpu_recurrent.delta_step(q, k, v, g, beta, mats, slots)
        else:
            cpu_recurrent.ssd_step(x, dt, a, b, cc, d, mats, slots)

    times: dict[str, list[float]] = {"torch": [], "c": []}
    torch_ops(), c_kernel()  # warm
    for _ in range(reps):  # in turns
        times["torch"].append(timed(torch_ops))
        times["c"].append(timed(c_kernel))
    med = {key: statistics.median(v) for key, v in times.items()}
    return {
        "kind": kind,
        "sequences": n,
        "state_mib_per_seq": round(h * r * c * 4 / 2**20, 2),
        "torch_ms": round(med["torch"], 3),
        "c_ms": round(med["c"], 3),
        "speedup": round(med["torch"] / med["c"], 2),
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--reps", type=int, default=30)
    ap.add_argument("--out", type=Path, default=None)
    args = ap.parse_args()
    load_before = os.getloadavg()
    rows = [case(kind, n, args.reps) for kind in ("gated_deltanet", "mamba2") for n in (1, 8)]
    result = {
        "threads": torch.get_num_threads(),
        "cpu": next((ln.split(":", 1)[1].strip() for ln in Path("/proc/cpuinfo").read_text().splitlines()
                     if ln.startswith("model name")), "?"),
        "loadavg_before": load_before,
        "loadavg_after": os.getloadavg(),
        "rows": rows,
    }  # fmt: skip
    print(json.dumps(result, indent=1))
    if args.out:
        args.out.write_text(json.dumps(result, indent=1) + "\n")


if __name__ == "__main__":
    main()
