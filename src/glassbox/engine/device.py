"""Where the engine runs: device and dtype resolution, and the host facts the executor sizes itself by."""

from __future__ import annotations

import ctypes
import logging
import os
import platform
import sys
from dataclasses import dataclass
from typing import Any

import torch

from glassbox.config import EngineConfig
from glassbox.engine.kv_caches import TRITON_MAX_HEAD_DIM, widest_head
from glassbox.engine.kv_plan import GiB
from glassbox.layers.kv_quant import row_width
from glassbox.models.model_config import KV_TORCH_DTYPES, TORCH_DTYPES, ModelConfig
from glassbox.quant.formats import WeightFormat

logger = logging.getLogger(__name__)


def triton_usable(device: torch.device) -> bool:
    """Whether the triton attention kernels can run on ``device`` (CUDA with triton installed)."""
    if device.type != "cuda":
        return False
    try:
        import triton  # noqa: F401
    except ImportError:
        logger.warning(
            "triton is not installed (%s %s): CUDA attention falls back to the torch SDPA reference and "
            "decode steps run without CUDA graphs, several times slower; pip install 'triton>=3.5' (Linux "
            "x86_64 and aarch64 wheels)",
            platform.system(),
            platform.machine(),
        )
        return False
    return True


def keeps_blocks(
    quantization: str | None,
    at_load: WeightFormat | None,
    device: torch.device,
    attn_backend: str,
    dtype: torch.dtype,
    on_triton: bool,
) -> bool:
    """Whether a GGUF file's Q4_0/Q4_1/Q8_0 and K-quant tensors stay in their blocks: where kernels run them,
    the CPU's C kernels (bf16 activations; MoE experts too) or the Triton kernels (CUDA, any dtype;
    quant/blocks/linear.to_triton), and not under ``--quantization``. ValueError for a ``--quantization``
    (``at_load``: its format) that no kernel on ``device`` runs: integer blocks and 4-bit floats on CUDA
    without triton (fp8 runs anywhere: quant/fp8/linear.py)."""
    runs_here = at_load is not None and (at_load.family == "fp8" or on_triton)
    if at_load is not None and device.type != "cpu" and not runs_here:
        raise ValueError(f"--quantization {quantization} needs triton on CUDA (not on {device.type})")
    native_bf16 = attn_backend == "native" and dtype == torch.bfloat16
    return quantization is None and (native_bf16 or on_triton)


def is_unified_memory(props: Any) -> bool:
    """Whether a CUDA device (its ``torch.cuda.get_device_properties``) shares the host's memory: an
    integrated GPU, such as a DGX Spark's GB10 (compute capability 12.1) or a Jetson."""
    return bool(getattr(props, "is_integrated", False)) or (props.major, props.minor) == (12, 1)


@dataclass(frozen=True)
class DeviceMemory:
    """A CUDA device's memory as the KV budget sees it, after the weights and the profile run."""

    total: int  # torch.cuda.mem_get_info
    free: int
    reserved: int  # torch's caching allocator: this process
    allocated: int
    unified: bool
    mem_available: int | None = None  # /proc/meminfo MemAvailable (unified memory only)


def describe_cuda(device: torch.device, attn_backend: str, graphs: bool) -> str:
    """The start log's line on a CUDA device: its name and architecture, memory, attention and decode path."""
    props = torch.cuda.get_device_properties(device)
    unified = ", unified memory: KV budget from the host's MemAvailable" if is_unified_memory(props) else ""
    attention = "triton kernels" if attn_backend == "triton" else "the torch SDPA reference"
    return (
        f"CUDA device {props.name} (sm_{props.major}{props.minor}{unified}): attention on {attention}, "
        f"decode {'in CUDA graphs' if graphs else 'eager'}"
    )


def read_device_memory(device: torch.device) -> DeviceMemory:
    free, total = torch.cuda.mem_get_info(device)
    unified = is_unified_memory(torch.cuda.get_device_properties(device))
    return DeviceMemory(
        total,
        free,
        torch.cuda.memory_reserved(device),
        torch.cuda.memory_allocated(device),
        unified,
        available_ram_bytes() if unified else None,
    )


def kv_budget(mem: DeviceMemory, utilization: float, peak: int, reserve: int) -> tuple[int, str]:
    """Bytes for the KV cache, and how they were reckoned (for the log).

    A discrete GPU: ``utilization`` of its memory, less what this process holds (the weights), what
    other processes hold, the activation ``peak`` and a ``reserve`` (the CUDA graphs). Unified memory
    (host RAM): ``torch.cuda.mem_get_info`` there leaves out the page cache the kernel would reclaim and
    counts the whole RAM as the device's, so the budget is ``utilization`` of /proc/meminfo's MemAvailable
    (which the weights have already left), less the peak and the reserve: the OS keeps the rest."""
    g = GiB
    if mem.unified and mem.mem_available is not None:
        budget = int(mem.mem_available * utilization) - peak - reserve
        how = (
            f"unified memory (integrated GPU): MemAvailable {mem.mem_available / g:.1f} GiB x {utilization} "
            f"- activations {peak / g:.2f} GiB - graphs {reserve / g:.2f} GiB = {budget / g:.2f} GiB "
            f"(mem_get_info says {mem.free / g:.1f} of {mem.total / g:.1f} GiB free, page cache excluded)"
        )
        return budget, how
    others = max(0, mem.total - mem.free - mem.reserved)  # other processes, the CUDA context
    budget = int(mem.total * utilization) - mem.allocated - peak - others - reserve
    how = (
        f"{mem.total / g:.1f} GiB x {utilization} - weights and buffers {mem.allocated / g:.2f} GiB - "
        f"activations {peak / g:.2f} GiB - other processes {others / g:.2f} GiB - graphs {reserve / g:.2f} "
        f"GiB = {budget / g:.2f} GiB"
    )
    return budget, how


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


@dataclass(frozen=True)
class Backends:
    """Where and how a model runs: its device, weight and KV dtypes, a KV cache row's width, whether the
    Triton kernels run here, the attention backend ("triton", "torch", or "native": the CPU's C kernels)
    and whether decode steps replay CUDA graphs."""

    device: torch.device
    dtype: torch.dtype
    kv_dtype: torch.dtype
    kv_width: int  # a cache row: head_dim, or head_dim + 4 for an 8-bit cache (layers/kv_quant.py)
    on_triton: bool
    attn_backend: str
    use_graphs: bool


def choose_backends(config: EngineConfig, model_config: ModelConfig) -> Backends:
    """The backends for ``config`` on this machine; on the CPU also its threads (GLASSBOX_NUM_THREADS)
    and the allocator's large-allocation rule."""
    device = resolve_device(config.device)
    dtype = resolve_dtype(config.dtype, model_config, device)
    kv_dtype = dtype if config.kv_cache_dtype == "auto" else KV_TORCH_DTYPES[config.kv_cache_dtype]
    on_triton = triton_usable(device)
    attn_backend = "triton" if on_triton else "torch"
    if attn_backend == "triton" and kv_dtype.itemsize == 1 and model_config.head_dim % 4:
        logger.warning("the triton kernels read an 8-bit KV cache for head dims divisible by 4: torch path")
        attn_backend = "torch"
    if attn_backend == "triton" and (widest := widest_head(model_config)) > TRITON_MAX_HEAD_DIM:
        logger.warning("head dim %d: past the triton attention kernels' %d: torch path", widest, TRITON_MAX_HEAD_DIM)  # fmt: skip
        attn_backend = "torch"
    # hybrid models (recurrent states) run eager: no decode graphs for them yet
    use_graphs = attn_backend == "triton" and not (config.enforce_eager or model_config.hybrid)
    if device.type == "cuda":
        logger.info("%s", describe_cuda(device, attn_backend, use_graphs))
    if device.type == "cpu":
        from glassbox.kernels import native

        if native.usable(dtype, kv_dtype):
            attn_backend = "native"  # glassbox's C kernels around oneDNN's GEMMs
        if "GLASSBOX_NUM_THREADS" in os.environ:
            torch.set_num_threads(int(os.environ["GLASSBOX_NUM_THREADS"]))
        keep_large_allocations_in_heap()
    kv_width = row_width(model_config.head_dim, kv_dtype)
    return Backends(device, dtype, kv_dtype, kv_width, on_triton, attn_backend, use_graphs)
