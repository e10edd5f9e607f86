"""Ahead-of-time compiles of glassbox's triton kernels for GPU targets, with no GPU, as Triton's JIT
compiles them on the device.

The JIT specializes each launch on its arguments: a pointer whose address is a multiple of 16 bytes and an
integer divisible by 16 get ``tt.divisibility = 16`` (wider, vectorized loads), an integer equal to 1
becomes a constant. ``compile_like_jit`` runs the JIT's own binder on the launch's arguments (CPU tensors
from torch's allocator are 64-byte aligned, as the CUDA caching allocator's blocks are 512-byte aligned,
so views at the same offsets get the same attributes) and compiles what the device would run.
``resources`` reads registers, stack frame, spill instructions and shared memory off the cubin with the
cuobjdump Triton bundles.

    PYTHONPATH=src python tests/helpers/triton_aot.py bfloat16 80,128 dgx-spark 128x64x8x2 128x32x8x2

prints the registers, stack and shared memory of those prefill tiles (the sweep behind
kernels/attention_tiles.py).
"""

from __future__ import annotations

import os
import re
import subprocess
import tempfile
from dataclasses import dataclass
from typing import Any

import triton
from triton.backends.compiler import GPUTarget
from triton.compiler import ASTSource, make_backend
from triton.runtime.jit import create_function_from_signature

TARGETS = {"h100": GPUTarget("cuda", 90, 32), "dgx-spark": GPUTarget("cuda", 121, 32)}
CAPABILITY = {"h100": (9, 0), "dgx-spark": (12, 1)}
SMS = {"h100": 132, "dgx-spark": 48}  # multiprocessors: the decode kernel's context splits depend on it
SMEM_LIMIT = {"h100": 227 * 1024, "dgx-spark": 99 * 1024}  # shared memory a block may opt in to
_BIN = os.path.join(os.path.dirname(triton.__file__), "backends", "nvidia", "bin")


def compile_like_jit(fn: Any, args: tuple[Any, ...], kwargs: dict[str, Any], target: GPUTarget) -> Any:
    """``fn[grid](*args, **kwargs)``'s kernel for ``target``: the JIT's specialization of these arguments
    (triton.runtime.jit's binder and ``JITFunction._pack_args``, as ``JITFunction.run`` calls them)."""
    backend = make_backend(target)
    binder = create_function_from_signature(fn.signature, fn.params, backend)
    bound, specialization, options = binder(*args, **kwargs)
    opts, signature, constexprs, attrs = fn._pack_args(backend, kwargs, bound, specialization, options)
    src = ASTSource(fn=fn, signature=signature, constexprs=constexprs, attrs=attrs)
    return triton.compile(src, target=target, options=opts.__dict__)


@dataclass(frozen=True)
class Resources:
    registers: int  # per thread
    stack: int  # stack frame bytes per thread: where spilled registers go
    spill_instructions: int | None  # STL/LDL in the SASS (None: this cuobjdump cannot read the target's)
    shared: int  # bytes of dynamic shared memory the launch asks for

    @property
    def spills(self) -> bool:
        return self.stack > 0 or bool(self.spill_instructions)


def _tool(name: str, *args: str, cubin: bytes) -> subprocess.CompletedProcess[str]:
    with tempfile.NamedTemporaryFile(suffix=".cubin", delete=False) as f:
        f.write(cubin)
    try:
        return subprocess.run([os.path.join(_BIN, name), *args, f.name], capture_output=True, text=True)
    finally:
        os.remove(f.name)


def resources(compiled: Any) -> Resources:
    cubin = compiled.asm["cubin"]
    usage = _tool("cuobjdump", "--dump-resource-usage", cubin=cubin).stdout
    m = re.search(r"REG:(\d+) STACK:(\d+)", usage)
    assert m, usage
    sass = _tool("cuobjdump", "--dump-sass", cubin=cubin)  # Triton 3.6's (CUDA 12.8) cannot read sm_121
    spills = len(re.findall(r"\b(?:STL|LDL)\b", sass.stdout)) if sass.returncode == 0 else None
    return Resources(int(m[1]), int(m[2]), spills, int(compiled.metadata.shared))


def prefill_launch(hq: int, hk: int, d: int, dtype: Any, tiles: tuple[int, int, int, int]) -> tuple:
    """(args, kwargs) of one prefill launch of ``tiles`` (block_m, block_n, warps, stages), no window."""
    import torch

    from glassbox.kernels import triton_attention as ta
    from glassbox.layers.attention import build_paged_prefill

    bm, bn, warps, stages = tiles
    bs = 16
    cache = torch.zeros(64, bs, hk, d, dtype=dtype)
    pp = build_paged_prefill([(0, 40, [0, 1, 2]), (16, 20, [3, 4, 5])], bm, cache.device)
    q = torch.zeros(60, hq, d, dtype=dtype)
    args = (q, cache, cache, torch.empty_like(q), pp.block_tables, pp.tile_seq, pp.tile_m, pp.q_start,
            pp.q_len, pp.ctx, 0.1, 0, q.stride(0), q.stride(1), q.stride(0), q.stride(1), cache.stride(0),
            cache.stride(1), cache.stride(2), pp.block_tables.stride(0))  # fmt: skip
    kw = dict(GROUP=hq // hk, HEAD_DIM=d, BLOCK_D=max(16, ta._pow2(d)), BLOCK_SIZE=bs, BLOCK_M=bm,
              BLOCK_N=bn, USE_WINDOW=False, IEEE=dtype == torch.float32, num_warps=warps,
              num_stages=stages)  # fmt: skip
    return args, kw


def _sweep(argv: list[str]) -> None:
    """Prefill tiles: registers, stack and shared memory of each (head dim, target, tiles) asked for.

    argv: dtype, head dims (comma-separated), targets (comma-separated), then tiles as MxNxWARPSxSTAGES."""
    import torch

    from glassbox.kernels import triton_attention as ta

    dtype = getattr(torch, argv[0])
    print("target      D   M   N warps stages   regs stack spillI  shared")
    for d in map(int, argv[1].split(",")):
        hq, hk = 8, 2
        for target in argv[2].split(","):
            for spec in argv[3:]:
                tiles = tuple(int(x) for x in spec.split("x"))
                assert len(tiles) == 4, spec
                args, kw = prefill_launch(hq, hk, d, dtype, tiles)  # type: ignore[arg-type]
                r = resources(compile_like_jit(ta._prefill_kernel, args, kw, TARGETS[target]))
                print(
                    f"{target:9s} {d:3d} {tiles[0]:3d} {tiles[1]:3d} {tiles[2]:5d} {tiles[3]:6d} "
                    f"{r.registers:6d} {r.stack:5d} {r.spill_instructions!s:>6} {r.shared:7d}",
                    flush=True,
                )


if __name__ == "__main__":
    import sys

    _sweep(sys.argv[1:])
