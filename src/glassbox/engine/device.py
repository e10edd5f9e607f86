"""Where the engine runs: device and dtype resolution, and the host facts the executor sizes itself by."""

from __future__ import annotations

import ctypes
import logging
import sys

import torch

from glassbox.engine.kv_plan import GiB
from glassbox.models.model_config import TORCH_DTYPES, ModelConfig

logger = logging.getLogger(__name__)


def triton_usable(device: torch.device) -> bool:
    """Whether the triton attention kernels can run on ``device`` (CUDA with triton installed)."""
    if device.type != "cuda":
        return False
    try:
        import triton  # noqa: F401
    except ImportError:
        logger.warning("triton is not installed: CUDA attention falls back to the torch SDPA reference")
        return False
    return True


def resolve_device(name: str) -> torch.device:
    if name == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    if name == "cuda" and not torch.cuda.is_available():
        raise ValueError("--device cuda was asked for, but torch sees no CUDA device")
    return torch.device(name)


def resolve_dtype(name: str, cfg: ModelConfig, device: torch.device) -> torch.dtype:
    if name != "auto":
        return TORCH_DTYPES[name]
    if cfg.torch_dtype == torch.float16 and device.type == "cpu":
        return torch.bfloat16  # fp16 matmuls are slow on most CPUs; bf16 keeps the range
    return cfg.torch_dtype


def keep_large_allocations_in_heap() -> bool:
    """glibc: serve large allocations from the heap and never trim it (Linux CPU only).

    Decode attention allocates tens of MB of temporaries per layer; by default glibc maps each one fresh
    from the kernel and unmaps it on free, so every step pays page faults on all of it (measured: a
    64-sequence decode step took 970 ms instead of 280 ms). Returns whether the setting was applied.
    """
    if not sys.platform.startswith("linux"):
        return False
    try:
        libc = ctypes.CDLL("libc.so.6")
        m_trim_threshold, m_mmap_threshold = -1, -3  # mallopt parameter ids from <malloc.h>
        return bool(libc.mallopt(m_mmap_threshold, 1 << 30)) and bool(
            libc.mallopt(m_trim_threshold, (1 << 31) - 1)
        )
    except (OSError, AttributeError):
        return False


def available_ram_bytes() -> int:
    try:
        with open("/proc/meminfo") as f:
            for line in f:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) * 1024
    except OSError:
        pass
    return 8 * GiB
