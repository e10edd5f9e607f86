"""The launches the host code of kernels/triton_block_linear.py and triton_fp8_linear.py makes, collected on
CPU tensors as on a target GPU (its multiprocessors: the K splits), for
tests/kernels/test_triton_compile.py, and a sweep of them all:

    PYTHONPATH=src python tests/helpers/triton_linear_launches.py [h100,dgx-spark] [bfloat16,float16,float32] [block,fp4,kquant,fp8]

prints the registers, stack and shared memory of every launch configuration (block weights: bits x offset
kind x bias x dtype x row count; 4-bit floats: MXFP4 / NVFP4 x bias x dtype x row count; K-quants: Q4_K /
Q5_K / Q6_K x bias x dtype x row count; FP8: scale grid x
bias x dtype x row count; each compiles apart).
"""

from __future__ import annotations

import contextlib
import itertools
from collections.abc import Iterator
from typing import Any

import torch
from triton_aot import SMS

from glassbox.kernels import triton_block_linear as tbl
from glassbox.kernels import triton_fp8_linear as tfl

Launch = tuple[Any, tuple[Any, ...], dict[str, Any]]  # (kernel, args, kwargs)
OFFSETS = ("factor", "stored", "zeros")  # Q4_0/Q8_0/int, Q4_1, GPTQ/AWQ
FP4 = ("mxfp4", "nvfp4")  # 4-bit floats, as ``offsets`` of 4-bit launches
KQUANTS = {
    "Q4_K": 4,
    "Q5_K": 8,
    "Q6_K": 8,
}  # GGUF K-quants (quant/blocks/kquant_triton.py) and their code bits
KINDS = {
    "factor": 0,
    "stored": 1,
    "zeros": 2,
    "mxfp4": 3,
    "nvfp4": 4,
    "Q4_K": 5,
    "Q5_K": 5,
    "Q6_K": 6,
}  # OFFSETS
# one row: the GEMV; 4: split-K decode tiles; 48 and 200: the prompt tiles (64 and 128 rows; float32: 32)
ROWS = (1, 4, 48, 200)
KERNELS = ("_block_gemv_kernel", "_block_mm_kernel", "_split_sum_kernel")
FP8_KERNELS = ("_fp8_gemv_kernel", "_fp8_mm_kernel", "_split_sum_kernel")


@contextlib.contextmanager
def _recording(target: str) -> Iterator[list[Launch]]:
    """Within: the modules' kernels record their launches instead of running, on ``target``'s shapes."""
    calls: list[Launch] = []
    saved = {name: getattr(tbl, name) for name in (*KERNELS, "num_sms")}
    saved_fp8 = {name: getattr(tfl, name) for name in FP8_KERNELS}

    def recorder(fn: Any) -> Any:
        class _Kernel:
            def __getitem__(self, grid: Any) -> Any:
                return lambda *args, **kwargs: calls.append((fn, args, kwargs))

        return _Kernel()

    for name in KERNELS:
        setattr(tbl, name, recorder(saved[name]))
    for name in FP8_KERNELS:
        setattr(tfl, name, recorder(saved_fp8[name]))
    tbl.num_sms = lambda device: SMS[target]  # type: ignore[assignment]
    try:
        yield calls
    finally:
        for name, value in saved.items():
            setattr(tbl, name, value)
        for name, value in saved_fp8.items():
            setattr(tfl, name, value)


def linear_launches(
    target: str, bits: int, offsets: str, bias: bool, dtype: torch.dtype, rows: tuple[int, ...] = ROWS
) -> list[Launch]:
    """The launches of a 4096 x 4096 block linear (Llama-3.1-8B's o_proj) at each row count in ``rows``:
    as a decode step where it has at most 16 rows, as a prompt step beyond."""
    n, k = 4096, 4096
    blocks = k // 32
    codes = torch.zeros(n, k * bits // 8, dtype=torch.uint8)
    six = offsets == "Q6_K"
    if offsets in KQUANTS:  # byte scales (Q6_K: two a block) and float16 super-block scales
        assert bits == KQUANTS[offsets]
        scales = torch.zeros(n, blocks * (2 if six else 1), dtype=torch.int8 if six else torch.uint8)
        sb = torch.zeros(n, k // 256 * (1 if six else 2), dtype=torch.float16)
    else:  # 4-bit floats: byte scales (quant/fp4/triton.py); block weights: float16
        scales = torch.zeros(n, blocks, dtype=torch.uint8 if offsets in FP4 else torch.float16)
        sb = scales
    offs = {
        "stored": torch.zeros(n, blocks, dtype=torch.float16), "zeros": torch.zeros(n, blocks, dtype=torch.uint8),
        "nvfp4": torch.zeros(n, blocks, dtype=torch.uint8), "Q4_K": torch.zeros(n, blocks, dtype=torch.uint8),
        "Q5_K": torch.zeros(n, blocks, dtype=torch.uint8),
    }.get(offsets, scales)  # fmt: skip
    rs = torch.zeros(n) if offsets == "nvfp4" else scales
    w = tbl.BlockArgs(
        codes, scales, offs, sb, rs, bits, KINDS[offsets], -8.0 if offsets == "factor" else -32.0 if six else 0.0,
        k, offsets == "nvfp4",
    )  # fmt: skip
    with _recording(target) as calls:
        for m in rows:
            tbl.block_matmul(torch.zeros(m, k, dtype=dtype), w, torch.zeros(n) if bias else None, m <= 16)
    return calls


def fp8_launches(
    target: str, block: tuple[int, int], bias: bool, dtype: torch.dtype, rows: tuple[int, ...] = ROWS
) -> list[Launch]:
    """The launches of a 4096 x 4096 FP8 linear with scales per ``block`` (rows, cols) at each row count."""
    n, k = 4096, 4096
    codes = torch.zeros(n, k, dtype=torch.uint8)
    scales = torch.zeros(-(-n // block[0]), -(-k // block[1]))
    b = torch.zeros(n) if bias else None
    with _recording(target) as calls:
        for m in rows:
            tfl.fp8_matmul(torch.zeros(m, k, dtype=dtype), codes, scales, *block, b, m <= 16)
    return calls


def _sweep(targets: list[str], dtype_names: list[str], kinds: list[str]) -> None:
    from triton_aot import TARGETS, compile_like_jit, resources

    print(
        "target    kernel              bits offsets bias dtype    tiles                                 regs stack spillI shared"
    )
    dtypes = [getattr(torch, name) for name in dtype_names]
    cases: list[tuple[str, str, str, bool, torch.dtype, list[Launch]]] = []
    if "block" in kinds:
        for t, bits, offsets, bias, dtype in itertools.product(
            targets, (4, 8), OFFSETS, (False, True), dtypes
        ):
            cases.append((t, str(bits), offsets, bias, dtype, linear_launches(t, bits, offsets, bias, dtype)))
    if "fp4" in kinds:
        for t, kind, bias, dtype in itertools.product(targets, FP4, (False, True), dtypes):
            cases.append((t, "4", kind, bias, dtype, linear_launches(t, 4, kind, bias, dtype)))
    if "kquant" in kinds:
        for t, kind, bias, dtype in itertools.product(targets, KQUANTS, (False, True), dtypes):
            b = KQUANTS[kind]
            cases.append((t, str(b), kind, bias, dtype, linear_launches(t, b, kind, bias, dtype)))
    if "fp8" in kinds:
        for t, (bn, bk), bias, dtype in itertools.product(
            targets, ((128, 128), (1, 4096)), (False, True), dtypes
        ):
            cases.append((t, "fp8", f"{bn}x{bk}", bias, dtype, fp8_launches(t, (bn, bk), bias, dtype)))
    for target, bits, offsets, bias, dtype, launches in cases:
        seen = set()
        for fn, args, kwargs in launches:
            consts = {k: v for k, v in kwargs.items() if k.isupper() or k.startswith("num_")}
            key = (fn.fn.__name__, str(consts))
            if key in seen:
                continue
            seen.add(key)
            r = resources(compile_like_jit(fn, args, kwargs, TARGETS[target]))
            tiles = " ".join(
                f"{k.removeprefix('BLOCK_').removeprefix('num_')[:5].lower()}{int(v)}"
                for k, v in consts.items()
                if k not in ("BITS", "OFFSETS", "HAS_BIAS")
            )
            print(
                f"{target:9s} {fn.fn.__name__:19s} {bits:>4s} {offsets:8s} {bias!s:5s} {str(dtype)[6:]:8s} "
                f"{tiles:37s} {r.registers:4d} {r.stack:5d} {r.spill_instructions!s:>6} {r.shared:6d}",
                flush=True,
            )


if __name__ == "__main__":
    import sys

    argv = [*sys.argv[1:], "", "", ""][:3]
    _sweep(
        (argv[0] or "h100,dgx-spark").split(","),
        (argv[1] or "bfloat16,float16,float32").split(","),
        (argv[2] or "block,fp8").split(","),
    )
