"""How busy the machine is while a figure is measured: the load average, and the CPU time other processes
took meanwhile (all CPUs' busy time from /proc/stat less this process's own), in cores.

The load average counts this process too (a probe's own threads, an engine that just loaded a model) and
lags by a minute; the other processes' CPU during the measurement is the figure that says whether a
neighbour competed for the cores and memory bus. Linux only; elsewhere ``other_cores`` is None.
"""

from __future__ import annotations

import os
import time
from dataclasses import dataclass
from typing import Any

BUSY_SHARE = 0.5  # a machine whose other processes use more than half of its cores is busy


@dataclass(frozen=True)
class CpuSample:
    wall_s: float
    busy_s: float | None  # busy CPU seconds of all CPUs since boot (None: no /proc/stat)
    own_s: float  # CPU seconds of this process (all its threads)


def cores() -> int:
    return os.cpu_count() or 1


def loadavg_1m() -> float | None:
    try:
        return os.getloadavg()[0]
    except (OSError, AttributeError):
        return None


def _busy_seconds() -> float | None:
    """user + nice + system + irq + softirq + steal jiffies of the 'cpu' line, in seconds (steal: the
    hypervisor gave our virtual CPU to someone else, as good as a neighbour's load)."""
    try:
        with open("/proc/stat") as f:
            fields = f.readline().split()
    except OSError:
        return None
    if not fields or fields[0] != "cpu" or len(fields) < 9:
        return None
    user, nice, system, _idle, _iowait, irq, softirq, steal = (int(v) for v in fields[1:9])
    return (user + nice + system + irq + softirq + steal) / os.sysconf("SC_CLK_TCK")


def sample() -> CpuSample:
    return CpuSample(time.perf_counter(), _busy_seconds(), time.process_time())


def other_cores(start: CpuSample, end: CpuSample) -> float | None:
    """Cores' worth of CPU that other processes used between two samples (None without /proc/stat)."""
    wall = end.wall_s - start.wall_s
    if start.busy_s is None or end.busy_s is None or wall <= 0:
        return None
    others = (end.busy_s - start.busy_s) - (end.own_s - start.own_s)
    return max(0.0, others / wall)


def load_record(start: CpuSample, end: CpuSample, loadavg_before: float | None) -> dict[str, Any]:
    """What a measured figure keeps about the machine's load while it was taken."""
    n = cores()
    others = other_cores(start, end)
    return {
        "loadavg_1m": None if loadavg_before is None else round(loadavg_before, 2),
        "other_cores": None if others is None else round(others, 3),
        "cores": n,
        "busy": is_busy(others, loadavg_before, n),
    }


def is_busy(others: float | None, loadavg: float | None, n: int) -> bool:
    """Other processes used more than half the cores; without /proc/stat, the load average (which also
    counts us) is above half the cores."""
    if others is not None:
        return others > BUSY_SHARE * n
    return loadavg is not None and loadavg > BUSY_SHARE * n


def busy_now(window_s: float = 0.2) -> bool:
    """Whether other processes keep the machine busy right now (sampled over ``window_s``, sleeping)."""
    start, load = sample(), loadavg_1m()
    time.sleep(window_s)
    return is_busy(other_cores(start, sample()), load, cores())


def describe(load: dict[str, Any]) -> str:
    """'load avg 1.18, others 1.00 / 2 cores' for a figure's load record."""
    parts = []
    if load.get("loadavg_1m") is not None:
        parts.append(f"load avg {load['loadavg_1m']:.2f}")
    if load.get("other_cores") is not None:
        parts.append(f"others {load['other_cores']:.2f}")
    return (", ".join(parts) + f" / {load.get('cores', '?')} cores") if parts else "load unknown"
