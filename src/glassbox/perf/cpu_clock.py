"""This machine's probe in both clocks: per second of wall time (what ``glassbox hardware --probe`` reports)
and per second of the probing thread's CPU time.

On a shared machine the wall clock measures the neighbours as much as the hardware: a thread that gets a
quarter of a core reads a quarter of the bytes a second. Per CPU-second of its own thread, the same probe
reads what the core does while it runs (still lowered by neighbours that share the memory bus and caches,
far less than by the time-slicing). glassbox-cpu is fitted and checked on CPU-time figures of both the
probe and the engine (perf/cpu_fit.py, benchmarks/plan_vs_trace.py, tests/perf/test_planner_vs_engine.py), so a
fit holds when the load changes; the wall-clock figures are kept beside them.

Host work (Python dispatching small kernels) slows with the machine too, and not as bandwidth does: the
probe also times one small op, and a profile's host terms fitted where that op took ``host_op_s`` scale by
this machine's op time over it (perf/cost_model.py; ``extra["op_s"]`` of the HardwareSpec).
"""

from __future__ import annotations

import os
import statistics
import time
from collections.abc import Callable
from typing import Any

from glassbox.perf.hardware import HardwareSpec

READ_BYTES = 512 << 20  # the read probe's working set (perf/probe.py reads at least 512 MiB on a CPU)
MATMUL_N = 1024  # the matmul probe's square bf16 product


def loadavg() -> float:
    try:
        return os.getloadavg()[0]
    except (OSError, AttributeError):
        return float("nan")


def rates(
    fn: Callable[[], object], units: float, budget_s: float, reps: int = 3
) -> tuple[float, float, float]:
    """(units per wall second, units per CPU-second of this thread, CPU share) of repeated ``fn`` calls
    (``units`` each): the best of ``reps`` repetitions of ``budget_s / reps`` each, the median share."""
    fn()
    best_wall = best_cpu = 0.0
    shares = []
    for _ in range(reps):
        w0, c0, calls = time.perf_counter(), time.thread_time(), 0
        while time.perf_counter() - w0 < budget_s / reps:
            fn()
            calls += 1
        wall, cpu = time.perf_counter() - w0, max(time.thread_time() - c0, 1e-9)
        best_wall, best_cpu = max(best_wall, calls * units / wall), max(best_cpu, calls * units / cpu)
        shares.append(cpu / wall)
    return best_wall, best_cpu, statistics.median(shares)


def probe(budget_s: float = 1.5) -> dict[str, Any]:
    """Read bandwidth (a float32 sum over READ_BYTES), bf16 matmul rate and the host's time for one small
    op (an in-place add on 256 floats, dispatched from Python: ``op_us``) on the calling thread, in both
    clocks, with the load average and the CPU share the probe got."""
    import torch

    big = torch.ones(READ_BYTES // 4, dtype=torch.float32)
    a, b = torch.randn(MATMUL_N, MATMUL_N).bfloat16(), torch.randn(MATMUL_N, MATMUL_N).bfloat16()
    small = torch.zeros(256)
    rd = rates(big.sum, READ_BYTES, budget_s * 0.6)
    mm = rates(lambda: a @ b, 2.0 * MATMUL_N**3, budget_s * 0.3)
    op = rates(lambda: small.add_(1.0), 1.0, budget_s * 0.1)
    return {
        "load": loadavg(),
        "read_gbs": rd[0] / 1e9,
        "read_gbs_cpu": rd[1] / 1e9,
        "tflops": mm[0] / 1e12,
        "tflops_cpu": mm[1] / 1e12,
        "op_us": 1e6 / op[0],
        "op_us_cpu": 1e6 / op[1],
        "cpu_share": rd[2],
    }


def spec(probes: list[dict[str, Any]], clock: str = "cpu") -> HardwareSpec:
    """A HardwareSpec of the probes' medians in ``clock`` ("cpu" or "wall")."""
    suffix = "_cpu" if clock == "cpu" else ""
    bw = statistics.median(p[f"read_gbs{suffix}"] for p in probes)
    tflops = statistics.median(p[f"tflops{suffix}"] for p in probes)
    ops = [p[f"op_us{suffix}"] for p in probes if f"op_us{suffix}" in p]
    extra = {"op_s": statistics.median(ops) * 1e-6} if ops else {}
    return HardwareSpec(f"local ({clock} time)", 64.0, bw, {"bf16": tflops}, True, measured=True, extra=extra)
