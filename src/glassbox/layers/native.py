"""glassbox's CPU kernels (cpu_kernels.c): built with the system C compiler on first use, called via ctypes.

A decode step on CPU spends as much time in the dozens of small PyTorch ops around the GEMVs (norms,
rotary, cache writes, the gathered-copy attention) as in the GEMVs themselves; these kernels do that
work in four calls per layer. The PyTorch path stays as the reference and the fallback: set
``GLASSBOX_CPU_KERNELS=torch`` to use it, and it is used wherever no C compiler is found.
"""

from __future__ import annotations

import ctypes
import hashlib
import logging
import os
import shutil
import subprocess
import tempfile
from functools import cache
from pathlib import Path

import torch

logger = logging.getLogger(__name__)

SOURCE = Path(__file__).with_name("cpu_kernels.c")
FLAGS = ["-O3", "-march=native", "-fopenmp", "-ffp-contract=off", "-fno-math-errno", "-shared", "-fPIC"]
DTYPE_CODES = {torch.float32: 0, torch.bfloat16: 1}
MAX_ROW = 1 << 16  # the kernels keep a row per thread on the stack

_P = ctypes.c_void_p
_I = ctypes.c_int64
_F = ctypes.c_float
_SIGNATURES: dict[str, list[type]] = {
    "gb_add_rms_norm": [_P, _P, _P, _P, _I, _I, _F, ctypes.c_int],
    "gb_silu_mul": [_P, _P, _I, _I, ctypes.c_int],
    "gb_qkv_rope_store": [_P, _I, _I, _I, _I, _I, _P, _P, _F, _P, _P, _I, _P, _P, _P, _P, ctypes.c_int],
    "gb_decode_attention": [_P, _I, _P, _P, _P, _I, _P, _I, _I, _I, _I, _I, _F, _I, _P, ctypes.c_int, _I],
}


def _cpu_signature() -> str:
    """What -march=native depends on: the CPU's model and feature flags."""
    try:
        text = Path("/proc/cpuinfo").read_text()
    except OSError:
        return os.uname().machine
    keep = [ln for ln in text.splitlines() if ln.startswith(("model name", "flags"))][:2]
    return "\n".join(keep)


def _cache_dir() -> Path:
    root = os.environ.get("GLASSBOX_CACHE_DIR") or os.path.join(Path.home(), ".cache", "glassbox")
    return Path(root) / "native"


def _build(cc: str) -> Path:
    source = SOURCE.read_bytes()
    key = hashlib.sha256(source + " ".join([cc, *FLAGS, _cpu_signature()]).encode()).hexdigest()[:16]
    out = _cache_dir() / f"cpu_kernels-{key}.so"
    if out.exists():
        return out
    out.parent.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(dir=out.parent) as tmp:
        tmp_so = Path(tmp) / out.name
        subprocess.run([cc, *FLAGS, str(SOURCE), "-o", str(tmp_so), "-lm"], check=True, capture_output=True)
        os.replace(tmp_so, out)  # atomic: concurrent builders leave one complete file
    return out


def compiler() -> str | None:
    return os.environ.get("CC") or shutil.which("cc") or shutil.which("gcc")


@cache
def library() -> ctypes.CDLL | None:
    """The compiled kernels, or None (no C compiler, or the build failed)."""
    cc = compiler()
    if cc is None:
        logger.info("no C compiler found: CPU kernels fall back to PyTorch ops")
        return None
    try:
        path = _build(cc)
    except (OSError, subprocess.CalledProcessError) as e:
        detail = getattr(e, "stderr", b"") or b""
        logger.warning("building %s failed, using PyTorch ops: %s %s", SOURCE.name, e, detail.decode()[-500:])
        return None
    lib = ctypes.CDLL(str(path))  # torch is loaded first, so OpenMP resolves to torch's own runtime
    for name, args in _SIGNATURES.items():
        fn = getattr(lib, name)
        fn.argtypes = args
        fn.restype = None
    return lib


def usable(dtype: torch.dtype, kv_dtype: torch.dtype) -> bool:
    """Whether the CPU kernels run a model of ``dtype`` with a KV cache of ``kv_dtype`` (not where
    GLASSBOX_CPU_KERNELS=torch asks for the PyTorch reference path)."""
    choice = os.environ.get("GLASSBOX_CPU_KERNELS", "native")
    if choice not in ("native", "torch"):
        raise ValueError(f"GLASSBOX_CPU_KERNELS must be 'native' or 'torch', got {choice!r}")
    return choice == "native" and dtype == kv_dtype and dtype in DTYPE_CODES and library() is not None


def _lib() -> ctypes.CDLL:
    lib = library()
    assert lib is not None, "glassbox CPU kernels are not built"
    return lib


def _check(*tensors: torch.Tensor) -> int:
    dt = tensors[0].dtype
    for t in tensors:
        assert t.device.type == "cpu" and t.is_contiguous() and t.dtype == dt, (t.device, t.dtype, t.shape)
    return DTYPE_CODES[dt]


def add_rms_norm(
    x: torch.Tensor, residual: torch.Tensor | None, weight: torch.Tensor, out: torch.Tensor, eps: float
) -> None:
    """If ``residual``: x += residual (in place, rounded as the reference). Then out = RMSNorm(x) * weight."""
    dim = x.shape[-1]
    assert dim <= MAX_ROW and weight.shape == (dim,) and out.shape == x.shape
    parts = [x, weight, out] + ([] if residual is None else [residual])
    dt = _check(*parts)
    if residual is not None:
        assert residual.shape == x.shape
    res = None if residual is None else residual.data_ptr()
    _lib().gb_add_rms_norm(
        x.data_ptr(), res, weight.data_ptr(), out.data_ptr(), x.numel() // dim, dim, eps, dt
    )


def silu_mul(gate_up: torch.Tensor) -> torch.Tensor:
    """(T, 2I) [gate | up] -> (T, I) silu(gate) * up."""
    t, two_i = gate_up.shape
    inter = two_i // 2
    assert inter <= MAX_ROW
    out = torch.empty(t, inter, dtype=gate_up.dtype)
    dt = _check(gate_up, out)
    _lib().gb_silu_mul(gate_up.data_ptr(), out.data_ptr(), t, inter, dt)
    return out


def qkv_rope_store(
    qkv: torch.Tensor,  # (T, (hq + 2 hk) d), rotated in place
    num_heads: int,
    num_kv_heads: int,
    head_dim: int,
    q_norm: torch.Tensor | None,
    k_norm: torch.Tensor | None,
    eps: float,
    cos: torch.Tensor,  # (max_positions, rd) in qkv's dtype
    sin: torch.Tensor,
    positions: torch.Tensor,  # (T,) int64
    kv_cache: torch.Tensor,  # (2, num_blocks, block_size, hk, d)
    slots: torch.Tensor,  # (T,) int64
) -> None:
    """Positions must be inside the tables and slots inside the cache (check_step, once per step)."""
    t = qkv.shape[0]
    assert qkv.shape[1] == (num_heads + 2 * num_kv_heads) * head_dim and head_dim <= MAX_ROW
    assert kv_cache.shape[-2:] == (num_kv_heads, head_dim) and kv_cache.is_contiguous()
    assert positions.shape == (t,) == slots.shape and positions.dtype == slots.dtype == torch.int64
    assert positions.is_contiguous() and slots.is_contiguous()
    assert cos.shape == sin.shape and cos.shape[1] <= head_dim
    norms = [w for w in (q_norm, k_norm) if w is not None]
    assert len(norms) in (0, 2) and all(w.shape == (head_dim,) for w in norms)
    dt = _check(qkv, kv_cache, cos, sin, *norms)
    _lib().gb_qkv_rope_store(
        qkv.data_ptr(), t, qkv.shape[1], num_heads, num_kv_heads, head_dim,
        None if q_norm is None else q_norm.data_ptr(), None if k_norm is None else k_norm.data_ptr(),
        eps, cos.data_ptr(), sin.data_ptr(), cos.shape[1], positions.data_ptr(),
        kv_cache[0].data_ptr(), kv_cache[1].data_ptr(), slots.data_ptr(), dt,
    )  # fmt: skip


def decode_attention(
    qkv: torch.Tensor,  # (>= nd, stride): row s starts with sequence s's query heads
    num_heads: int,
    kv_cache: torch.Tensor,  # (2, num_blocks, block_size, hk, d)
    block_tables: torch.Tensor,  # (nd, max_blocks) int64
    context_lens: torch.Tensor,  # (nd,) int64
    scale: float,
    sliding_window: int | None,
    out: torch.Tensor,  # (>= nd, hq * d), rows [0, nd) written
) -> None:
    """Values are the caller's to check once per step (check_decode_tables): this runs once per layer."""
    nd, max_blocks = block_tables.shape
    _, num_blocks, bs, hk, d = kv_cache.shape
    assert num_heads % hk == 0 and d <= MAX_ROW and bs <= MAX_ROW
    assert qkv.shape[0] >= nd and out.shape[0] >= nd and out.shape[1] == num_heads * d
    assert block_tables.dtype == context_lens.dtype == torch.int64 and context_lens.shape == (nd,)
    assert block_tables.is_contiguous() and context_lens.is_contiguous()
    if nd == 0:
        return
    dt = _check(qkv, kv_cache, out)
    _lib().gb_decode_attention(
        qkv.data_ptr(), qkv.shape[1], kv_cache[0].data_ptr(), kv_cache[1].data_ptr(),
        block_tables.data_ptr(), max_blocks, context_lens.data_ptr(), nd, num_heads, hk, d, bs, scale,
        sliding_window or 0, out.data_ptr(), dt, torch.get_num_threads(),
    )  # fmt: skip


def check_step(
    positions: torch.Tensor,
    slots: torch.Tensor,
    table_len: int,
    cache_slots: int,
    block_tables: torch.Tensor | None,
    context_lens: torch.Tensor | None,
    num_blocks: int,
    block_size: int,
) -> None:
    """The index values the kernels trust, checked once per forward: a bad one would read out of bounds."""
    if positions.numel():
        if int(positions.min()) < 0 or int(positions.max()) >= table_len:
            raise ValueError(f"positions outside the rotary table of {table_len}")
        if int(slots.min()) < 0 or int(slots.max()) >= cache_slots:
            raise ValueError(f"KV slots outside the cache of {cache_slots}")
    if block_tables is not None and context_lens is not None and block_tables.numel():
        if int(block_tables.min()) < 0 or int(block_tables.max()) >= num_blocks:
            raise ValueError(f"block table entries outside the cache of {num_blocks} blocks")
        if int(context_lens.min()) < 1 or int(context_lens.max()) > block_tables.shape[1] * block_size:
            raise ValueError("decode context lengths outside their block tables")
