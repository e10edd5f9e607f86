"""The triton attention kernels compile for real GPU targets, with no GPU, into the cubins the device runs:
every launch configuration the host code picks on an H100 and on a DGX Spark (its tiles, head sizes, GQA
ratios, dtypes, windows, context splits, the graph path's int32 tables and the eager path's int64 ones)
goes through Triton's whole compiler (to a cubin, with its bundled ptxas), specialized on its arguments
as Triton's JIT specializes them on the device (tests/helpers/triton_aot.py). Each cubin must fit the target's
shared memory and must not spill registers. The interpreter runs in tests/engine/test_gpu.py check the
arithmetic; this checks what only the compiler sees (it once rejected every kernel for an annotation no
interpreter run could notice)."""

from __future__ import annotations

import multiprocessing
from typing import Any

import pytest
import torch

pytest.importorskip("triton")
# the module fixture compiles every case at once: a cold compile takes minutes (its first test waits for it)
pytestmark = pytest.mark.timeout(1200)
from triton_aot import CAPABILITY, SMEM_LIMIT, SMS, TARGETS, compile_like_jit, resources  # noqa: E402

from glassbox.kernels import attention_tiles  # noqa: E402
from glassbox.kernels import triton_attention as ta  # noqa: E402
from glassbox.layers.attention import build_paged_prefill  # noqa: E402
from glassbox.layers.kv_quant import row_width  # noqa: E402

TYPES = {
    torch.bfloat16: "bf16",
    torch.float16: "fp16",
    torch.float32: "fp32",
    torch.int8: "int8",
    torch.float8_e4m3fn: "fp8",
}
# (dtype, (Hq, Hk, D), targets, KV cache dtype): bf16 of real models (Llama-3.1-8B; head sizes 64, 80, 256)
# on both targets; float32 of the tiny models the GPU parity tests run (head sizes 16, 32) and a real shape
# where shared memory is tightest (a float32 tile of 128 dims is the largest; ~25 s to compile); the 8-bit
# caches at the tightest head sizes (int8 at 64 and 256 under bf16, 32 under float32; fp8 shares int8's
# tiles and differs only in how codes widen: 256 alone). Fewer shapes than the host code can pick: each
# case costs ~10 s of a cold compile, and the suite has a time budget.
CASES = [
    (torch.bfloat16, s, tuple(TARGETS), torch.bfloat16)
    for s in [(32, 8, 128), (4, 2, 64), (8, 2, 80), (8, 8, 256)]
]
CASES += [(torch.float32, (4, 2, 32), tuple(TARGETS), torch.float32)]
CASES += [(torch.float32, s, ("dgx-spark",), torch.float32) for s in [(4, 2, 16), (16, 8, 128)]]
CASES += [(torch.bfloat16, s, tuple(TARGETS), torch.int8) for s in [(4, 2, 64), (8, 8, 256)]]
CASES += [(torch.float32, (4, 2, 32), tuple(TARGETS), torch.int8)]
CASES += [(torch.bfloat16, (8, 8, 256), tuple(TARGETS), torch.float8_e4m3fn)]
PARAMS = [(target, dtype, shape, kv) for dtype, shape, targets, kv in CASES for target in targets]


class _Launches:
    """Stands where a kernel is launched (``kernel[grid](...)``) and keeps the arguments instead."""

    def __init__(self) -> None:
        self.calls: list[tuple[Any, tuple[Any, ...], dict[str, Any]]] = []

    def bind(self, fn: Any) -> Any:
        launches = self

        class _Kernel:
            def __getitem__(self, grid: Any) -> Any:
                return lambda *args, **kwargs: launches.calls.append((fn, args, kwargs))

        return _Kernel()


def _launches(
    monkeypatch: pytest.MonkeyPatch,
    target: str,
    dtype: torch.dtype,
    shape: tuple[int, int, int],
    kv_dtype: torch.dtype,
    sinks: bool = False,
) -> list[tuple[Any, tuple[Any, ...], dict[str, Any]]]:
    """Run the host side of decode and prefill on CPU tensors as on ``target`` (its compute capability
    picks the tiles, its multiprocessors the context splits), keeping each kernel launch: decode as the
    CUDA graphs run it (int32 tables as wide as the longest sequence, batch 1) and as an eager step does
    (int64 tables, a batch that needs no split), prefill of two sequences; with and without a window;
    with ``sinks``, attention sinks (gpt-oss) on every launch."""
    rec = _Launches()
    for name in ("_decode_kernel", "_reduce_kernel", "_prefill_kernel"):
        monkeypatch.setattr(ta, name, rec.bind(getattr(ta, name)))
    cap = CAPABILITY[target]
    monkeypatch.setattr(attention_tiles, "device_capability", lambda device: cap)
    monkeypatch.setattr(ta, "device_capability", lambda device: cap)
    monkeypatch.setattr(ta, "num_sms", lambda device: SMS[target])
    hq, hk, d = shape
    bs = 16
    cache = torch.zeros(64, bs, hk, row_width(d, kv_dtype), dtype=kv_dtype)
    block_m = ta.prefill_block_m(d, kv_dtype, dtype, cache.device)
    pp = build_paged_prefill([(0, 40, [0, 1, 2]), (16, 20, [3, 4, 5])], block_m, cache.device)
    qp = torch.zeros(60, hq, d, dtype=dtype)
    sk = torch.zeros(hq, dtype=dtype) if sinks else None
    for window in (None, 24):
        q = torch.zeros(1, hq, d, dtype=dtype)  # graphs: batch 1 splits the context over the SMs
        tables, lens = torch.zeros(1, 256, dtype=torch.int32), torch.tensor([64], dtype=torch.int32)
        ta.decode_attention(q, cache, cache, tables, lens, d**-0.5, window, torch.empty_like(q), sinks=sk)
        ta.prefill_attention(
            qp, cache, cache, pp.block_tables, pp.tile_seq, pp.tile_m, pp.q_start, pp.q_len, pp.ctx,
            d**-0.5, window, torch.empty_like(qp), pp.block_m, sk,
        )  # fmt: skip
    q = torch.zeros(2, hq, d, dtype=dtype)  # eager: int64 tables and lengths, no split
    tables, lens = torch.zeros(2, 4, dtype=torch.long), torch.tensor([30, 64])
    ta.decode_attention(
        q, cache, cache, tables, lens, d**-0.5, None, torch.empty_like(q), num_splits=1, sinks=sk
    )
    return rec.calls


IDS = [
    f"{t}-{TYPES[d]}-hq{a}-hk{b}-d{c}" + (f"-kv{TYPES[kv]}" if kv != d else "")
    for t, d, (a, b, c), kv in PARAMS
]
# Every case's launches, collected by the host code in this process; compiled by two forked workers (the
# compiler is single-threaded: a cold compile of them all is the suite's longest wait, halved on 2 cores)
_LAUNCHES: list[tuple[str, Any, tuple[Any, ...], dict[str, Any]]] = []  # (case id, kernel, args, kwargs)


def _compile_one(i: int) -> tuple[str, bool, str, bool, bool]:
    """(case id, has a cubin, what, fits shared memory, spills) of launch ``i`` (in a forked worker)."""
    case, fn, args, kwargs = _LAUNCHES[i]
    target = PARAMS[IDS.index(case)][0]
    compiled = compile_like_jit(fn, args, kwargs, TARGETS[target])
    r = resources(compiled)
    consts = {k: v for k, v in kwargs.items() if k.isupper() or k.startswith("num_")}
    types = [a.dtype for a in args if isinstance(a, torch.Tensor)][3:5]  # tables, lengths (decode)
    what = f"{fn.fn.__name__} {consts} {types}: {r}"
    return case, bool(compiled.asm["cubin"]), what, r.shared <= SMEM_LIMIT[target], bool(r.spills)


@pytest.fixture(scope="module")
def compiled() -> dict[str, list[tuple[str, bool, str, bool, bool]]]:
    """Each case's launches compiled: case id -> [(kernel name, cubin, what, fits, spills)]."""
    names: dict[str, set[str]] = {}
    for case, (target, dtype, shape, kv_dtype) in zip(IDS, PARAMS, strict=True):
        with pytest.MonkeyPatch.context() as mp:
            calls = _launches(mp, target, dtype, shape, kv_dtype)
        names[case] = {fn.fn.__name__ for fn, _, _ in calls}
        _LAUNCHES.extend((case, fn, args, kwargs) for fn, args, kwargs in calls)
    with multiprocessing.get_context("fork").Pool(2) as pool:
        results = pool.map(_compile_one, range(len(_LAUNCHES)), chunksize=1)
    out: dict[str, list[tuple[str, bool, str, bool, bool]]] = {case: [] for case in IDS}
    for (case, fn, _, _), (_, cubin, what, fits, spills) in zip(_LAUNCHES, results, strict=True):
        out[case].append((fn.fn.__name__, cubin, what, fits, spills))
    for case in IDS:
        assert {n for n, *_ in out[case]} == names[case]
    return out


@pytest.mark.parametrize("case", IDS)
def test_every_launch_compiles_without_spills(
    compiled: dict[str, list[tuple[str, bool, str, bool, bool]]], case: str
) -> None:
    kernels = {name for name, *_ in compiled[case]}
    assert kernels == {"_decode_kernel", "_reduce_kernel", "_prefill_kernel"}
    for name, cubin, what, fits, spills in compiled[case]:
        assert cubin, name
        assert fits, what
        assert not spills, what


def test_the_jit_specialization_reaches_the_compile() -> None:
    """16-byte-aligned pointers and integers divisible by 16 get ``tt.divisibility``; others do not."""
    calls: list[tuple[Any, tuple[Any, ...], dict[str, Any]]] = []
    rec = _Launches()
    rec.calls = calls
    kernel = rec.bind(ta._reduce_kernel)
    out = torch.zeros(2, 4, 80, dtype=torch.bfloat16)
    part_o, part_lse = torch.zeros(2, 4, 8, 128), torch.zeros(2, 4, 8)
    kernel[(2, 4)](part_o, part_lse, out[:, :, 8:], 4, 320, 80, HEAD_DIM=72, BLOCK_D=128, NUM_SPLITS=8)
    kernel[(2, 4)](part_o, part_lse, out[:, :, 2:], 4, 320, 17, HEAD_DIM=72, BLOCK_D=128, NUM_SPLITS=8)
    ttir = [compile_like_jit(fn, a, {**k, "num_warps": 4}, TARGETS["h100"]).asm["ttir"] for fn, a, k in calls]
    # out_ptr at +16 bytes and stride_oh 80: both divisible; at +4 bytes and 17: neither
    assert ttir[0].count("tt.divisibility = 16") == ttir[1].count("tt.divisibility = 16") + 2


# -- the block-weight and FP8 linears (kernels/triton_block_linear.py, triton_fp8_linear.py) ----------------
# Each kernel at each tile shape the host code picks (rows 1: the GEMV; 4: the split-K decode tiles and the
# split sum; 48 and 200: the 64- and 128-row prompt tiles; float32: its own): 4-bit block weights on both
# targets with the offset kind that loads most (Q4_1's stored offsets); on the DGX Spark alone (the tighter
# target: 99 KiB of shared memory, no wgmma) 8-bit ones (GPTQ's zero codes), FP8 (128 x 128 blocks, a
# bias), NVFP4 (the 4-bit float that loads most: two scale bytes and a row scale), the K-quants Q4_K
# (one row and the largest tiles) and Q6_K (decode rows) and float32 (the interpreter tests' dtype): ~31
# compiles. The full matrix (both targets, bits x offset kinds x bias x bf16/float16/float32 x rows; MXFP4
# and NVFP4; the K-quants; FP8 block and per-channel scales) is tests/helpers/triton_linear_launches.py's sweep:
# none spills or overflows shared memory (figures in kernels/triton_block_linear.py's docstring).
from triton_linear_launches import fp8_launches, linear_launches  # noqa: E402

BF16 = torch.bfloat16
LINEAR_CASES: list[tuple[str, str, Any]] = [  # (id, target, launches)
    *((f"{t}-bf16-q4-stored", t, lambda t=t: linear_launches(t, 4, "stored", False, BF16)) for t in TARGETS),
    ("dgx-spark-bf16-q8-zeros", "dgx-spark", lambda: linear_launches("dgx-spark", 8, "zeros", False, BF16)),
    ("dgx-spark-bf16-nvfp4", "dgx-spark", lambda: linear_launches("dgx-spark", 4, "nvfp4", False, BF16)),
    # MXFP4's prompt tiles (its 128 x 128 ones spilled on sm_121)
    (
        "dgx-spark-bf16-mxfp4",
        "dgx-spark",
        lambda: linear_launches("dgx-spark", 4, "mxfp4", False, BF16, rows=(200,)),
    ),
    # K-quants: Q4_K's GEMV and its largest tiles (246 registers on sm_121), Q6_K's half-block scales
    (
        "dgx-spark-bf16-q4k",
        "dgx-spark",
        lambda: linear_launches("dgx-spark", 4, "Q4_K", False, BF16, rows=(1, 200)),
    ),
    (
        "dgx-spark-bf16-q6k",
        "dgx-spark",
        lambda: linear_launches("dgx-spark", 8, "Q6_K", False, BF16, rows=(1, 4)),
    ),
    ("dgx-spark-bf16-fp8-bias", "dgx-spark", lambda: fp8_launches("dgx-spark", (128, 128), True, BF16)),
    (
        "dgx-spark-fp32-q4",
        "dgx-spark",
        lambda: linear_launches("dgx-spark", 4, "factor", False, torch.float32, rows=(1, 4, 48)),
    ),
]
_LINEAR_LAUNCHES: list[tuple[str, str, Any, tuple[Any, ...], dict[str, Any]]] = []


def _compile_linear(i: int) -> tuple[bool, str, bool, bool]:
    """(has a cubin, what, fits shared memory, spills) of linear launch ``i`` (in a forked worker)."""
    _, target, fn, args, kwargs = _LINEAR_LAUNCHES[i]
    compiled = compile_like_jit(fn, args, kwargs, TARGETS[target])
    r = resources(compiled)
    consts = {k: v for k, v in kwargs.items() if k.isupper() or k.startswith("num_")}
    what = f"{target} {fn.fn.__name__} {consts} {args[0].dtype}: {r}"
    return bool(compiled.asm["cubin"]), what, r.shared <= SMEM_LIMIT[target], bool(r.spills)


@pytest.fixture(scope="module")
def compiled_linears() -> dict[str, list[tuple[str, bool, str, bool, bool]]]:
    """Each case's distinct launches compiled: case id -> [(kernel name, cubin, what, fits, spills)]."""
    seen = set()
    for case, target, launches in LINEAR_CASES:
        for fn, args, kwargs in launches():
            spec = [(a == 1, a % 16 == 0) if isinstance(a, int) else getattr(a, "dtype", a) for a in args]
            key = (target, fn.fn.__name__, str(kwargs), str(spec))  # as the JIT specializes
            if key not in seen:
                seen.add(key)
                _LINEAR_LAUNCHES.append((case, target, fn, args, kwargs))
    with multiprocessing.get_context("fork").Pool(2) as pool:
        results = pool.map(_compile_linear, range(len(_LINEAR_LAUNCHES)), chunksize=1)
    out: dict[str, list[tuple[str, bool, str, bool, bool]]] = {case: [] for case, _, _ in LINEAR_CASES}
    for (case, _, fn, _, _), res in zip(_LINEAR_LAUNCHES, results, strict=True):
        out[case].append((fn.fn.__name__, *res))
    return out


@pytest.mark.parametrize("case", [c for c, _, _ in LINEAR_CASES])
def test_linear_launches_compile_without_spills(
    compiled_linears: dict[str, list[tuple[str, bool, str, bool, bool]]], case: str
) -> None:
    assert compiled_linears[case], "a case with no launch of its own"
    for name, cubin, what, fits, spills in compiled_linears[case]:
        assert cubin, name
        assert fits, what
        assert not spills, what


def test_every_linear_kernel_compiles(
    compiled_linears: dict[str, list[tuple[str, bool, str, bool, bool]]],
) -> None:
    names = {name for launches in compiled_linears.values() for name, *_ in launches}
    assert names == {
        "_block_gemv_kernel",
        "_block_mm_kernel",
        "_fp8_gemv_kernel",
        "_fp8_mm_kernel",
        "_split_sum_kernel",
    }
