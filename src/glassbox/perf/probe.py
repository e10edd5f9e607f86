"""The probe: this machine's read bandwidth and matmul FLOP/s, measured and cached per figure.

Each figure keeps its own time, thread count and the machine's load while it was taken (machine_load.py),
so that adding a dtype's FLOP/s leaves the bandwidth's time alone. ``probe_local`` re-measures a figure
that is missing, older than a day, taken with other threads than the engine's, or taken on a busy machine
when the machine is quiet now; a figure it keeps although it was taken under load is named in the spec's
``extra["warnings"]``, which every report that uses the probe prints (trace, plan, hardware).

Bandwidth is measured the way decode reads weights (reads only; ``copy_bandwidth_reps`` stays for the
benchmarks): a reduction streaming a buffer far larger than the
last-level cache (16x, at least 512 MiB on a CPU, 1 GiB on a GPU) on the engine's threads, each of several
repetitions sustained over a fifth of the budget (many passes), the best repetition kept and every one
recorded. The cache is ``$GLASSBOX_CACHE_DIR/probe-<device>.json`` (default ``~/.cache/glassbox``).
"""

from __future__ import annotations

import contextlib
import json
import os
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

from glassbox.dtypes import canonical, long_name, parse_dtype
from glassbox.perf import machine_load
from glassbox.perf.hardware import GIB, HARDWARE_CHOICES, PRESETS, HardwareSpec, cpu_name

CACHE_VERSION = 2
MAX_AGE_S = 24 * 3600.0
REPS = 5
_MIB = 1 << 20


def cache_dir() -> Path:
    return Path(os.environ.get("GLASSBOX_CACHE_DIR") or Path.home() / ".cache" / "glassbox")


def cache_path(device: str) -> Path:
    return cache_dir() / f"probe-{device.replace(':', '-')}.json"


def engine_threads() -> int:
    """The threads the engine runs its steps on: GLASSBOX_NUM_THREADS, else torch's default."""
    import torch

    env = os.environ.get("GLASSBOX_NUM_THREADS")
    return int(env) if env else int(torch.get_num_threads())


@contextlib.contextmanager
def _threads(device: str, n: int) -> Iterator[None]:
    import torch

    before = torch.get_num_threads()
    if not device.startswith("cuda") and n != before:
        torch.set_num_threads(n)
    try:
        yield
    finally:
        if torch.get_num_threads() != before:
            torch.set_num_threads(before)


def _sync(device: str) -> None:
    import torch

    if device.startswith("cuda"):
        torch.cuda.synchronize()


def last_level_cache_bytes() -> int:
    """The largest CPU cache (Linux sysfs; 32 MiB where unknown)."""
    best = 0
    for d in Path("/sys/devices/system/cpu/cpu0/cache").glob("index*"):
        try:
            text = (d / "size").read_text().strip().upper()
        except OSError:
            continue
        scale = {"K": 1 << 10, "M": _MIB, "G": GIB}.get(text[-1:], 1)
        digits = text.rstrip("KMG")
        if digits.isdigit():
            best = max(best, int(digits) * scale)
    return best or 32 * _MIB


def working_set_bytes(device: str) -> int:
    """The buffer a bandwidth figure streams: far beyond the caches, within an eighth of free memory."""
    if device.startswith("cuda"):
        return GIB
    want = max(512 * _MIB, 16 * last_level_cache_bytes())
    try:
        free = os.sysconf("SC_AVPHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")
        want = min(want, max(64 * _MIB, free // 8))
    except (OSError, ValueError):
        pass
    return want - want % 64


def _sustained_reps(device: str, run: Callable[[], object], nbytes: int, budget_s: float) -> list[float]:
    """GB/s of each of REPS repetitions, each running ``run`` (``nbytes`` moved) for budget_s / REPS."""
    run()  # first touch and warm-up
    _sync(device)
    rep_s = budget_s / REPS
    rates = []
    for _ in range(REPS):
        calls, t0 = 0, time.perf_counter()
        while True:
            run()
            calls += 1
            _sync(device)
            elapsed = time.perf_counter() - t0
            if elapsed >= rep_s:
                break
        rates.append(calls * nbytes / elapsed / 1e9)
    return rates


def read_bandwidth_reps(device: str = "cpu", budget_s: float = 1.0, nbytes: int | None = None) -> list[float]:
    """Read bandwidth (GB/s) of each sustained repetition of a float32 reduction over ``nbytes``."""
    import torch

    n = nbytes or working_set_bytes(device)
    src = torch.ones(n // 4, dtype=torch.float32, device=device)
    return _sustained_reps(device, src.sum, n, budget_s)


def copy_bandwidth_reps(device: str = "cpu", budget_s: float = 1.0, nbytes: int | None = None) -> list[float]:
    """Copy bandwidth (GB/s, bytes read + written) of each sustained repetition of ``dst.copy_(src)``."""
    import torch

    n = nbytes or working_set_bytes(device)
    src = torch.ones(n // 4, dtype=torch.float32, device=device)
    dst = torch.empty_like(src)
    return _sustained_reps(device, lambda: dst.copy_(src), 2 * n, budget_s)


def measure_read_bandwidth(device: str = "cpu", budget_s: float = 1.0) -> float:
    """Read bandwidth in GB/s: the best sustained repetition (see read_bandwidth_reps)."""
    return max(read_bandwidth_reps(device, budget_s))


def measure_bandwidth(device: str = "cpu", budget_s: float = 1.0) -> float:
    """Copy bandwidth in GB/s (bytes read + written): the best sustained repetition."""
    return max(copy_bandwidth_reps(device, budget_s))


def measure_matmul(device: str = "cpu", dtype: str = "bf16", budget_s: float = 1.5) -> float:
    """Dense matmul TFLOP/s (2 n^3 per n x n product); n grows until one product takes >= 20 ms."""
    import torch

    tdtype = getattr(torch, long_name(canonical(dtype)))
    n_max = 8192 if device.startswith("cuda") else 2048
    n, elapsed = 256, 0.0
    while True:
        a = torch.randn(n, n, device=device).to(tdtype)
        b = torch.randn(n, n, device=device).to(tdtype)
        torch.matmul(a, b)
        _sync(device)
        t0 = time.perf_counter()
        torch.matmul(a, b)
        _sync(device)
        elapsed = time.perf_counter() - t0
        if elapsed >= 0.02 or n >= n_max:
            break
        n *= 2
    best, deadline = elapsed, time.perf_counter() + budget_s
    for _ in range(20):
        if time.perf_counter() > deadline:
            break
        t0 = time.perf_counter()
        torch.matmul(a, b)
        _sync(device)
        best = min(best, time.perf_counter() - t0)
    return 2.0 * n**3 / best / 1e12


def measure_op_us(budget_s: float = 0.2) -> float:
    """Microseconds of wall time per small op (an in-place add on 256 floats) dispatched from Python: what
    the engine's host work costs here (the profiles' host terms scale by it: perf/cpu_clock.py)."""
    import torch

    from glassbox.perf.cpu_clock import rates

    small = torch.zeros(256)
    return 1e6 / rates(lambda: small.add_(1.0), 1.0, budget_s)[0]


def measure_figure(
    name: str, device: str, threads: int, budget_s: float = 1.0, working_set: int | None = None
) -> dict[str, Any]:
    """One figure (``read_gbs`` or ``tflops_<dtype>``) with its time, threads and load;
    bandwidth streams ``working_set`` bytes (default working_set_bytes)."""
    loadavg, start = machine_load.loadavg_1m(), machine_load.sample()
    reps: list[float] = []
    nbytes = working_set or working_set_bytes(device)
    with _threads(device, threads):
        if name == "read_gbs":
            reps = read_bandwidth_reps(device, budget_s, nbytes)
            value = max(reps)
        elif name.startswith("tflops_"):
            value = measure_matmul(device, name.removeprefix("tflops_"), 1.5 * budget_s)
        elif name == "op_us":  # one small op dispatched from Python: the host's speed (perf/cpu_clock.py)
            value = measure_op_us(0.2 * budget_s)
        else:
            raise ValueError(f"unknown probe figure {name!r}")
    load = machine_load.load_record(start, machine_load.sample(), loadavg)
    if device.startswith("cuda"):  # the host's load is kept, but a GPU's own neighbours are not seen
        load["busy"] = False
    figure: dict[str, Any] = {
        "value": value,
        "measured_at": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
        "unix_time": time.time(),
        "threads": threads,
        "load": load,
    }
    if reps:
        figure["reps"] = [round(r, 3) for r in reps]
        figure["working_set_mib"] = nbytes // _MIB
    return figure


def remeasure_reason(
    fig: dict[str, Any] | None, now: float, threads: int, max_age_s: float = MAX_AGE_S
) -> str | None:
    """Why a cached figure should be measured again ('busy': only if the machine is quiet now)."""
    if fig is None:
        return "missing"
    if now - float(fig.get("unix_time", 0.0)) > max_age_s:
        return "stale"
    if int(fig.get("threads", threads)) != threads:
        return "threads"
    if fig.get("load", {}).get("busy", True):
        return "busy"
    return None


def _read_cache(path: Path, device: str) -> dict[str, Any] | None:
    try:
        rec = json.loads(path.read_text())
    except (OSError, json.JSONDecodeError):
        return None
    if not isinstance(rec, dict) or rec.get("version") != CACHE_VERSION or rec.get("device") != device:
        return None  # an older layout (one time stamp for every figure): measured afresh
    return rec


def probe_local(
    device: str = "cpu",
    dtype: str = "bfloat16",
    force: bool = False,
    max_age_s: float = MAX_AGE_S,
    budget_s: float = 1.0,
    working_set: int | None = None,
) -> HardwareSpec:
    """This machine's read bandwidth and ``dtype`` matmul rate on ``device``, from the cache where a
    figure is fresh (see the module's docstring), measured where not; the cache is rewritten if any
    figure was measured. ``budget_s`` and ``working_set`` (bytes) shrink the measurement (tests)."""
    key = parse_dtype(dtype, "--dtype", ("bf16", "fp16", "fp32"))
    if device not in ("cpu", "cuda") and not device.startswith("cuda:"):
        raise ValueError(f"--device must be cpu or cuda[:N], got {device!r}")
    path = cache_path(device)
    rec = None if force else _read_cache(path, device)
    if rec is None:
        import torch

        rec = {
            "version": CACHE_VERSION,
            "device": device,
            "device_name": _device_name(device),
            "memory_gib": _memory_gib(device),
            "torch": torch.__version__,
            "figures": {},
        }
    threads = engine_threads() if device == "cpu" else 0
    figures: dict[str, Any] = rec["figures"]
    quiet: bool | None = None
    changed = False
    for name in ("read_gbs", f"tflops_{key}", *(("op_us",) if device == "cpu" else ())):
        reason = remeasure_reason(figures.get(name), time.time(), threads, max_age_s)
        if reason == "busy":
            if quiet is None:
                quiet = not machine_load.busy_now()
            if not quiet:
                continue  # kept and flagged: measuring again now would be as disturbed
        if reason is not None:
            fresh = measure_figure(name, device, threads, budget_s, working_set)
            old = figures.get(name)
            if (
                reason == "busy"
                and old is not None
                and fresh["load"]["busy"]
                and old["value"] > fresh["value"]
            ):
                continue  # busy again: a neighbour only ever lowers a figure, so the higher one stays
            figures[name] = fresh
            changed = True
    if changed:
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.with_suffix(f".{os.getpid()}.tmp")
        tmp.write_text(json.dumps(rec, indent=2))
        os.replace(tmp, path)
    return spec_from_record(rec, max_age_s)


def cached_probe(device: str, dtype: str) -> HardwareSpec | None:
    """The cached probe with a bandwidth and a ``dtype`` FLOP/s figure, measuring nothing (None if
    absent); its spec's warnings name old or busy figures."""
    rec = _read_cache(cache_path(device), device)
    key = canonical(dtype)
    if rec is None or "read_gbs" not in rec["figures"] or f"tflops_{key}" not in rec["figures"]:
        return None
    return spec_from_record(rec)


def _memory_gib(device: str) -> float:
    import torch

    if device.startswith("cuda"):
        return float(torch.cuda.get_device_properties(device).total_memory / GIB)
    return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES") / GIB


def _device_name(device: str) -> str:
    import torch

    if device.startswith("cuda"):
        return str(torch.cuda.get_device_name(device))
    return f"{cpu_name()} CPU ({os.cpu_count()} threads)"


def figure_warnings(name: str, fig: dict[str, Any], now: float, max_age_s: float = MAX_AGE_S) -> list[str]:
    """What a report must say about a figure it uses: taken on a busy machine, or older than max_age_s."""
    out = []
    label = "read bandwidth" if name == "read_gbs" else name.replace("_", " ")
    when = fig.get("measured_at", "?")
    if fig.get("load", {}).get("busy", True):
        out.append(
            f"{label} was measured on a busy machine ({machine_load.describe(fig.get('load', {}))}) at "
            f"{when}: it may be low; re-run `glassbox hardware --probe --force` on a quiet machine"
        )
    age_h = (now - float(fig.get("unix_time", 0.0))) / 3600
    if age_h * 3600 > max_age_s:
        out.append(f"{label} is {age_h:.0f} hours old (measured at {when})")
    return out


def spec_from_record(rec: dict[str, Any], max_age_s: float = MAX_AGE_S) -> HardwareSpec:
    """The HardwareSpec of a probe record: bandwidth = the read figure (decode reads weights, and a copy
    figure would count writes and their allocation too), every
    cached dtype's FLOP/s; ``extra`` keeps each figure (time, threads, load, repetitions) and the
    warnings a report prints."""
    figures = {
        n: f for n, f in rec["figures"].items() if n in ("read_gbs", "op_us") or n.startswith("tflops_")
    }
    now = time.time()
    warnings = [w for name, fig in figures.items() for w in figure_warnings(name, fig, now, max_age_s)]
    tflops = {
        n.removeprefix("tflops_"): float(f["value"]) for n, f in figures.items() if n.startswith("tflops_")
    }
    op = {"op_s": float(figures["op_us"]["value"]) * 1e-6} if "op_us" in figures else {}
    read = figures["read_gbs"]
    timing = ", ".join(
        f"{'bandwidth' if n == 'read_gbs' else n.removeprefix('tflops_')} at {f['measured_at']}"
        for n, f in figures.items()
    )
    return HardwareSpec(
        name="local",
        memory_gib=float(rec["memory_gib"]),
        bandwidth_gbs=float(read["value"]),
        tflops=tflops,
        unified_memory=not str(rec["device"]).startswith("cuda"),
        source=f"measured on {rec['device_name']} ({rec['device']}): {timing}",
        measured=True,
        extra={
            "device": rec["device"],
            "cache": str(cache_path(rec["device"])),
            "read_gbs": read["value"],
            "figures": figures,
            "warnings": warnings,
            **op,
        },
    )


def get_hardware(name: str) -> HardwareSpec:
    """A preset by name, or ``local`` (the cached probe of this machine, measured if missing)."""
    key = name.lower()
    if key == "local":
        import torch

        return probe_local("cuda" if torch.cuda.is_available() else "cpu")
    if key not in PRESETS:
        raise ValueError(f"--hardware must be one of {', '.join(HARDWARE_CHOICES)}, got {name!r}")
    return PRESETS[key]
