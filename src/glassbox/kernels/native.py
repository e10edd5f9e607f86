"""glassbox's CPU kernels (cpu_kernels.c): built with the system C compiler on first use, called via ctypes.

A decode step on CPU spends as much time in the dozens of small PyTorch ops around the GEMVs (norms,
rotary, cache writes, the gathered-copy attention) as in the GEMVs themselves; these kernels do that
work in five calls per layer. The PyTorch path stays as the reference and the fallback: set
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

_C_FILES = (
    "cpu_kernels.c",
    "cpu_softmax.c",
    "cpu_kv8.c",
    "cpu_quant.c",
    "cpu_quant_gemm.c",  # prompt rows on block weights (quant/blocks/prompt_gemm.py)
    "cpu_dequant.c",
    "cpu_quantize.c",  # --quantization int4|int8 at load
    "cpu_step.c",
    "cpu_fp8.c",
    "cpu_fp4.c",  # 4-bit float weights: MXFP4, NVFP4
    "cpu_fp4_dequant.c",
    "cpu_kquant.c",  # GGUF K-quants
    "cpu_kquant_dequant.c",
    "cpu_bf16.c",  # bf16 weights in tiles of 16 rows (quant/dense/bf16_tiles.py)
    "cpu_bf16_amx.c",  # the same tiles on AMX, where the CPU has it (GLASSBOX_BF16_AMX)
    "cpu_recurrent.c",  # hybrid models' decode recurrences (kernels/cpu_recurrent.py)
)
SOURCES = [Path(__file__).with_name(name) for name in _C_FILES]
HEADERS = [
    Path(__file__).with_name(name)
    for name in ("cpu_common.h", "cpu_kv8.h", "cpu_quant.h", "cpu_fp4.h", "cpu_kquant.h")
]
FLAGS = ["-O3", "-march=native", "-fopenmp", "-ffp-contract=off", "-fno-math-errno", "-shared", "-fPIC"]
DTYPE_CODES = {torch.float32: 0, torch.bfloat16: 1}
KV8_CODES = {torch.int8: 1, torch.float8_e4m3fn: 2}  # an 8-bit KV cache (cpu_kv8.c); 0: the dtype's own
MAX_ROW = 1 << 16  # the kernels keep a few rows per thread on the stack

_P = ctypes.c_void_p
_I = ctypes.c_int64
_F = ctypes.c_float
_C = ctypes.c_int
_SIGNATURES: dict[str, list[type]] = {
    # the last argument of each: how many threads its parallel loops may use (torch's intra-op count)
    "gb_add_rms_norm": [_P, _P, _P, _P, _I, _I, _F, _C, _C],
    "gb_silu_mul": [_P, _P, _I, _I, _C, _C],
    "gb_qkv_rope_store": [_P, _I, _I, _I, _I, _I, _P, _P, _F, _P, _P, _I, _P, _P, _P, _P, _C, _C, _C],
    "gb_decode_attention": [_P, _I, _P, _P, _P, _I, _P, _I, _I, _I, _I, _I, _F, _I, _P, _P, _C, _C, _C],
    "gb_prefill_softmax_bf16": [_P, _I, _I, _I, _I, _I, _F, _P, _P, _I, _C],
    "gb_prefill_row_offsets_bf16": [_P, _I, _I, _I, _I, _I, _P, _I, _C],
    # cpu_quant.c: weights in 32-value blocks of 4 or 8 bits
    "gb_quantize_rows_q8": [_P, _I, _I, _I, _P, _P, _P, _C, _C],
    # cpu_quantize.c: a float weight into blocks (w, dt, N, K, mode, codes, scales, mins or NULL)
    "gb_quantize_blocks": [_P, _C, _I, _I, _C, _P, _P, _P, _C],
    # weight arguments: codes, scales, offsets (or NULL), zero codes (or NULL), offset factor
    "gb_gemv_blocks": [_P, _P, _P, _P, _F, _P, _I, _I, _C, _P, _P, _P, _I, _P, _I, _C, _C],
    "gb_gemv_blocks_generic": [_P, _P, _P, _P, _F, _P, _I, _I, _C, _P, _P, _P, _I, _P, _I, _C, _C],
    "gb_dequant_blocks": [_P, _P, _P, _P, _F, _I, _I, _I, _C, _P, _C, _C],
    "gb_linear_blocks": [_P, _I, _I, _P, _P, _P, _P, _F, _P, _I, _I, _C, _P, _C, _C],
    # cpu_quant_gemm.c: the same arguments, prompt rows in 4 x 4 register tiles
    "gb_gemm_blocks": [_P, _I, _I, _P, _P, _P, _P, _F, _P, _I, _I, _C, _P, _C, _C],
    # cpu_step.c: a decode step of a block-weight layer stack (structures built by models/llama_step.py)
    "gb_decode_step": [_P, _P, _P, _P, _I, _P, _P, _P, _I, _P, _P, _C],
    # greedy decode bursts (models/llama_burst.py): model, layers, head, embedding, tokens, T, steps, positions,
    # slots, block tables, max blocks, context lengths, x, h, logits, scratch
    "gb_decode_burst": [_P, _P, _P, _P, _P, _I, _I, _P, _P, _P, _I, _P, _P, _P, _P, _P, _C],
    "gb_dequant_block_rows": [_P, _P, _P, _P, _F, _I, _I, _I, _C, _P, _I, _P, _C],
    # cpu_fp8.c: FP8 (E4M3) weights with float32 block scales
    "gb_fp8_gemv": [_P, _I, _I, _P, _P, _I, _I, _I, _P, _I, _P, _C, _C],
    "gb_fp8_gemv_generic": [_P, _I, _I, _P, _P, _I, _I, _I, _P, _I, _P, _C, _C],
    "gb_fp8_dequant": [_P, _P, _I, _I, _I, _I, _I, _I, _P, _C, _C],
    # cpu_fp4.c: MXFP4 / NVFP4 (weight arguments: codes, scales, row scales (or NULL), kind)
    "gb_fp4_quantize_rows": [_P, _I, _I, _I, _P, _P, _P, _C, _C, _C],
    "gb_fp4_gemv": [_P, _P, _P, _C, _P, _I, _I, _P, _P, _P, _I, _P, _I, _C, _C, _C],
    "gb_fp4_linear": [_P, _I, _I, _P, _P, _P, _C, _P, _I, _I, _P, _C, _C],
    "gb_fp4_dequant": [_P, _P, _P, _C, _I, _I, _I, _P, _C, _C],
    # cpu_kquant.c: GGUF K-quants (weight arguments: codes, meta, kind)
    "gb_quantize_rows_kq": [_P, _I, _I, _P, _P, _P, _P, _C, _C],
    "gb_gemv_kquant": [_P, _P, _C, _P, _I, _I, _P, _P, _P, _P, _I, _P, _I, _C, _C, _C],
    "gb_linear_kquant": [_P, _I, _I, _P, _P, _C, _P, _I, _P, _C, _C],
    "gb_dequant_kquant": [_P, _P, _C, _I, _I, _P, _C, _C, _C],
    # cpu_bf16.c: bf16 weights in tiles of 16 rows (x, M, K, x stride, tiles, bias, N, out, out stride, dt)
    "gb_linear_bf16t": [_P, _I, _I, _I, _P, _P, _I, _P, _I, _C, _C],
    "gb_linear_bf16t_generic": [_P, _I, _I, _I, _P, _P, _I, _P, _I, _C, _C],
    # cpu_recurrent.c: (state base, row stride, slots, inputs..., out, sequences, heads, rows, cols, threads)
    "gb_delta_step": [_P, _I, _P, _P, _P, _P, _P, _P, _P, _I, _I, _I, _I, _C],
    "gb_ssd_step": [_P, _I, _P, _P, _P, _P, _P, _P, _P, _P, _I, _I, _I, _I, _C],
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
    source = b"".join(src.read_bytes() for src in SOURCES + HEADERS)
    key = hashlib.sha256(source + " ".join([cc, *FLAGS, _cpu_signature()]).encode()).hexdigest()[:16]
    out = _cache_dir() / f"cpu_kernels-{key}.so"
    if out.exists():
        return out
    out.parent.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(dir=out.parent) as tmp:
        tmp_so = Path(tmp) / out.name
        sources = [str(src) for src in SOURCES]
        subprocess.run([cc, *FLAGS, *sources, "-o", str(tmp_so), "-lm"], check=True, capture_output=True)
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
        names = ", ".join(src.name for src in SOURCES)
        logger.warning("building %s failed, using PyTorch ops: %s %s", names, e, detail.decode()[-500:])
        return None
    lib = ctypes.CDLL(str(path))  # torch is loaded first, so OpenMP resolves to torch's own runtime
    for name, args in _SIGNATURES.items():
        fn = getattr(lib, name)
        fn.argtypes = args
        fn.restype = None
    lib.gb_bf16_dot_native.argtypes = []
    lib.gb_bf16_dot_native.restype = _C
    lib.gb_gemm_blocks_native.argtypes = []
    lib.gb_gemm_blocks_native.restype = _C
    lib.gb_bf16_amx_init.argtypes = [_C]
    lib.gb_bf16_amx_init.restype = _C
    lib.gb_bf16_amx_init(int(bf16_amx_wanted()))
    return lib


def bf16_amx_wanted() -> bool:
    """``GLASSBOX_BF16_AMX``: "auto" (default: bf16 tiles multiply on AMX where the CPU and the kernel build
    have it) or "off" (AVX-512 BF16 dot products, as on a CPU without AMX)."""
    choice = os.environ.get("GLASSBOX_BF16_AMX", "auto")
    if choice not in ("auto", "off"):
        raise ValueError(f"GLASSBOX_BF16_AMX must be 'auto' or 'off', got {choice!r}")
    return choice == "auto"


def cpu_has_amx() -> bool:
    """Whether this machine's CPU has AMX (Linux /proc/cpuinfo's amx_bf16; False where unknown)."""
    try:
        with open("/proc/cpuinfo") as f:
            return any(line.startswith("flags") and " amx_bf16" in line for line in f)
    except OSError:
        return False


def bf16_tiles_on_amx() -> bool:
    """Whether the bf16 tiles multiply on AMX in this process (``gb_bf16_amx_init``'s answer: the CPU and the
    kernels' build have it, the kernel asked for the tile state and got it, ``GLASSBOX_BF16_AMX`` allows)."""
    lib = library()
    return lib is not None and bool(ctypes.c_int.in_dll(lib, "gb_bf16_amx_on").value)


def usable(dtype: torch.dtype, kv_dtype: torch.dtype) -> bool:
    """Whether the CPU kernels run a model of ``dtype`` with a KV cache of ``kv_dtype`` (not where
    GLASSBOX_CPU_KERNELS=torch asks for the PyTorch reference path)."""
    choice = os.environ.get("GLASSBOX_CPU_KERNELS", "native")
    if choice not in ("native", "torch"):
        raise ValueError(f"GLASSBOX_CPU_KERNELS must be 'native' or 'torch', got {choice!r}")
    same_or_8bit = kv_dtype == dtype or kv_dtype in KV8_CODES
    return choice == "native" and same_or_8bit and dtype in DTYPE_CODES and library() is not None
