"""The tensor-parallel group this process belongs to (torch.distributed), and the collectives the model's
parallel layers call (models/tensor_parallel.py). Set up by engine/tp_runtime.py; absent (None) without
tensor parallelism.

Besides the default group (start-up, its timeout GLASSBOX_TP_START_TIMEOUT), two groups over the same
ranks: ``compute`` (the all-reduces and all-gathers inside a forward) with a short
timeout, so that a rank that dies or hangs fails the step within seconds instead of hanging it; ``control``
(rank 0's broadcast of each step's inputs, and start/stop) with a long one, since workers wait on it while
the server is idle.
"""

from __future__ import annotations

import dataclasses
import os
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch
import torch.distributed as dist


@dataclass
class TPState:
    rank: int
    world: int
    compute: Any  # dist.ProcessGroup
    control: Any  # dist.ProcessGroup
    timeout_s: float


class TensorParallelError(RuntimeError):
    """A collective failed: a rank died, hung past the timeout, or the group broke before. Fatal to the
    engine (engine/async_engine.py stops on it: health goes bad, every request gets this error)."""

    fatal = True


@dataclass
class CollectiveTime:
    """This rank's time inside collectives since it joined (wall clock, waiting for the other ranks
    included: on the CPU gloo's collectives return when done): the forward's all-reduces and all-gathers,
    and the step broadcasts."""

    seconds: float = 0.0
    count: int = 0
    broadcast_s: float = 0.0
    broadcasts: int = 0


_STATE: TPState | None = None
_TIME = CollectiveTime()
_BROKEN: str | None = None  # why the group failed; every later collective raises at once


def compute_backend(cuda: bool) -> str:
    """The forward's collectives: NCCL between GPUs (a GPU a rank), gloo on the CPU;
    ``GLASSBOX_TP_BACKEND=gloo`` keeps gloo on CUDA too (slow, no CUDA graphs; ranks may then share a GPU)."""
    return os.environ.get("GLASSBOX_TP_BACKEND", "nccl" if cuda else "gloo")


def cpu_lists(spec: str) -> list[set[int]]:
    """``GLASSBOX_TP_CPU_BIND``'s value, a Linux CPU list a local rank separated by ``|`` ("0-15|16-31",
    vLLM's VLLM_CPU_OMP_THREADS_BIND form), as sets of CPU numbers; ValueError naming the variable."""
    out = []
    for part in spec.split("|"):
        cpus: set[int] = set()
        try:
            for item in part.split(","):
                a, _, b = item.strip().partition("-")
                cpus.update(range(int(a), int(b or a) + 1))
        except ValueError:
            raise ValueError(f"GLASSBOX_TP_CPU_BIND={spec!r}: {part!r} is not a CPU list (0-3,8)") from None
        if not cpus:
            raise ValueError(f"GLASSBOX_TP_CPU_BIND={spec!r}: an empty CPU list")
        out.append(cpus)
    return out


def state() -> TPState | None:
    """This process's tensor-parallel group, or None."""
    return _STATE


def set_state(s: TPState | None) -> None:
    """Join (``s``) or leave (None: the default group is destroyed, a failure forgotten)."""
    global _STATE, _BROKEN
    if s is None and dist.is_initialized():
        dist.destroy_process_group()
    _STATE, _BROKEN = s, None


def collective_time() -> CollectiveTime:
    """A copy of this rank's running totals (engine/trace: the share of a step spent in collectives)."""
    return dataclasses.replace(_TIME)


def failed() -> bool:
    """Whether a collective of this group has failed."""
    return _BROKEN is not None


def _require() -> TPState:
    if _STATE is None:
        raise RuntimeError("a tensor-parallel layer ran outside a tensor-parallel group")
    if _BROKEN is not None:
        raise TensorParallelError(f"the tensor-parallel group has failed: {_BROKEN}")
    return _STATE


def _collective(fn: Callable[[], Any], what: str) -> Any:
    """Run one collective; a failure (a rank gone, or none answering within the timeout) breaks the group
    for good and raises TensorParallelError."""
    global _BROKEN
    s = _require()
    t0 = time.perf_counter()
    try:
        return fn()
    except RuntimeError as e:
        _BROKEN = (
            f"{what} on rank {s.rank} of {s.world} failed (a rank died, or hung past the "
            f"{s.timeout_s:g} s timeout, GLASSBOX_TP_TIMEOUT): {type(e).__name__}: {str(e).splitlines()[0]}"
        )
        raise TensorParallelError(_BROKEN) from e
    finally:
        dt = time.perf_counter() - t0
        if what == "step broadcast":
            _TIME.broadcast_s, _TIME.broadcasts = _TIME.broadcast_s + dt, _TIME.broadcasts + 1
        else:
            _TIME.seconds, _TIME.count = _TIME.seconds + dt, _TIME.count + 1


def all_reduce(x: torch.Tensor) -> torch.Tensor:
    """Sum ``x`` over the ranks, in place."""
    s = _require()
    _collective(lambda: dist.all_reduce(x, group=s.compute), "all-reduce")
    return x


def all_gather_last(x: torch.Tensor) -> torch.Tensor:
    """Concatenate every rank's ``x`` (equal shapes) along the last dimension, in rank order."""
    s = _require()
    parts = [torch.empty_like(x) for _ in range(s.world)]
    _collective(lambda: dist.all_gather(parts, x.contiguous(), group=s.compute), "all-gather")
    return torch.cat(parts, dim=-1)


def broadcast_object(obj: Any) -> Any:
    """Rank 0's ``obj`` on every rank (pickled; the control group)."""
    s = _require()
    box = [obj if s.rank == 0 else None]
    _collective(lambda: dist.broadcast_object_list(box, src=0, group=s.control), "step broadcast")
    return box[0]


def load_max(x: torch.Tensor) -> torch.Tensor:
    """The elementwise largest ``x`` over the ranks, in place: a scale computed over a whole tensor that the
    ranks hold parts of (load-time quantization). At start-up, so on the default group (its timeout is the
    start-up one)."""
    _require()
    host = x.cpu()  # the default group is gloo's (CPU tensors), whatever the device
    _collective(lambda: dist.all_reduce(host, op=dist.ReduceOp.MAX), "start-up all-reduce")
    return x.copy_(host)


def gather_ints(value: int) -> list[int]:
    """Every rank's ``value``, in rank order (on every rank); at start-up, so on the default group (its
    timeout is the start-up one: ranks finish loading at different times)."""
    s = _require()
    parts = [torch.zeros(1, dtype=torch.long) for _ in range(s.world)]
    mine = torch.tensor([value], dtype=torch.long)
    _collective(lambda: dist.all_gather(parts, mine), "start-up all-gather")
    return [int(p.item()) for p in parts]
