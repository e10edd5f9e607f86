"""gpt-oss's and the MoE models' triton launches compile for real GPU targets, with no GPU (as
tests/kernels/test_triton_compile.py does for the attention kernels, whose launch recorder and compile helpers this
reuses): the fused MoE (kernels/triton_moe.py) at both tile families (decode and prefill batches) for
Qwen3-30B-A3B's and gpt-oss-20b's shapes in bf16 and for a tiny gpt-oss in float32 (the GPU parity tests'),
and the attention kernels with sinks at gpt-oss's shape (16- and 8-bit caches) and the tiny model's. Each
cubin must fit the target's shared memory and must not spill registers. Launches that compile to the
same kernel (same constants and argument specialization) are compiled once."""

from __future__ import annotations

import multiprocessing
from typing import Any

import pytest
import torch

pytest.importorskip("triton")
pytestmark = pytest.mark.timeout(1200)
from test_triton_compile import _Launches, _launches  # noqa: E402
from triton_aot import CAPABILITY, SMEM_LIMIT, TARGETS, compile_like_jit, resources  # noqa: E402

from glassbox.kernels import triton_moe as tm  # noqa: E402

# (name, dtype, E, k, H, I, activation, biases, token counts, targets): 1 token takes the decode tiles; 512
# tokens of Qwen3 (4096 pairs) the prefill tiles and the torch alignment, 200 of gpt-oss (800 pairs) the
# prefill tiles and the alignment kernel with 64-row blocks
MOE = [
    ("qwen3-30b-a3b", torch.bfloat16, 128, 8, 2048, 768, "silu", False, (1, 512), ("h100",)),
    ("gpt-oss-20b", torch.bfloat16, 32, 4, 2880, 2880, "swiglu", True, (1, 200), tuple(TARGETS)),
    ("tiny-gpt-oss", torch.float32, 8, 2, 64, 32, "swiglu", True, (5,), tuple(TARGETS)),
]
# the fused MoE on experts in blocks (kernels/triton_block_moe.py): Qwen3-30B-A3B in Q4_K (the 4-bit kind that
# loads most: byte scales and mins, float16 super-block scales) on the DGX Spark (the tighter target: its
# 64-row gate_up tiles spilled at 64 weight rows), 1 and 512 tokens; the full matrix (targets x Q4_K,
# Q6_K, MXFP4, int4 x Qwen3 / gpt-oss shapes) compiled without spills when the tiles were chosen
BLOCK_MOE = [
    ("qwen3-30b-a3b-q4k", torch.bfloat16, 128, 8, 2048, 768, "silu", False, (1, 512), ("dgx-spark",))
]
# (name, dtype, (Hq, Hk, D), KV cache dtype, targets): gpt-oss-20b/120b's attention, the tiny model's. The
# sinks add a load and two selects to a softmax's start: the shapes nearest a target's limits (sm_121's
# 8-bit-cache prefill: 232-240 registers) and one of each other kind, to keep the compile time small
SINKS = [
    ("gpt-oss", torch.bfloat16, (64, 8, 64), torch.bfloat16, ("h100",)),
    ("gpt-oss-int8", torch.bfloat16, (64, 8, 64), torch.int8, ("dgx-spark",)),  # its tightest registers
    ("tiny-gpt-oss", torch.float32, (4, 2, 24), torch.float32, ("h100",)),
]


def _moe_launches(
    monkeypatch: pytest.MonkeyPatch, target: str, case: tuple[Any, ...]
) -> list[tuple[Any, tuple[Any, ...], dict[str, Any]]]:
    """fused_moe's host side on CPU tensors as on ``target``, keeping each kernel launch."""
    rec = _Launches()
    for name in ("_align_kernel", "_gate_up_kernel", "_down_kernel"):
        monkeypatch.setattr(tm, name, rec.bind(getattr(tm, name)))
    monkeypatch.setattr(tm, "device_capability", lambda device: CAPABILITY[target])
    _, dtype, e, k, h, i, act, bias, tokens, _ = case
    w1, w2 = torch.zeros(e, 2 * i, h, dtype=dtype), torch.zeros(e, h, i, dtype=dtype)
    b1, b2 = (torch.zeros(e, 2 * i, dtype=dtype), torch.zeros(e, h, dtype=dtype)) if bias else (None, None)
    for t in tokens:
        x, w = torch.zeros(t, h, dtype=dtype), torch.zeros(t, k, dtype=dtype)
        ids = torch.zeros(t, k, dtype=torch.long)
        tm.fused_moe(x, ids, w, w1, w2, b1, b2, act, 1.702, 7.0, reads=torch.zeros((), dtype=torch.int64))
    return rec.calls


def _block_moe_launches(
    monkeypatch: pytest.MonkeyPatch, target: str, case: tuple[Any, ...]
) -> list[tuple[Any, tuple[Any, ...], dict[str, Any]]]:
    """block_fused_moe's host side on CPU tensors (Q4_K experts) as on ``target``, keeping each launch."""
    from glassbox.kernels import triton_block_moe as tbm

    rec = _Launches()
    for name in ("_gate_up_kernel", "_down_kernel"):
        monkeypatch.setattr(tbm, name, rec.bind(getattr(tbm, name)))
    monkeypatch.setattr(tm, "_align_kernel", _Launches().bind(tm._align_kernel))  # compiled above
    monkeypatch.setattr(tbm, "device_capability", lambda device: CAPABILITY[target])
    _, dtype, e, k, h, i, act, _, tokens, _ = case

    def q4k(n: int, width: int) -> Any:  # codes, 6-bit scales and mins, float16 d and dmin
        s = torch.zeros(n, width // 32, dtype=torch.uint8)
        return tbm.BlockArgs(torch.zeros(n, width // 2, dtype=torch.uint8), s, s, torch.zeros(n, width // 128,
                             dtype=torch.float16), s, 4, 5, 0.0, width, False)  # fmt: skip

    for t in tokens:
        ids = torch.zeros(t, k, dtype=torch.long)
        x, w = torch.zeros(t, h, dtype=dtype), torch.zeros(t, k, dtype=dtype)
        tbm.block_fused_moe(x, ids, w, q4k(e * 2 * i, h), q4k(e * h, i), e, act=act)
    return rec.calls


def _key(fn: Any, target: str, args: tuple[Any, ...], kwargs: dict[str, Any]) -> tuple[Any, ...]:
    """What the JIT's specialization depends on: constants, tensor dtypes, integers' divisibility by 16."""

    def spec(a: Any) -> Any:
        if isinstance(a, torch.Tensor):
            return a.dtype
        if isinstance(a, int):
            return (a == 1, a % 16 == 0)
        return type(a)

    return (fn.fn.__name__, target, tuple(sorted(kwargs.items())), tuple(spec(a) for a in args))


_LAUNCHES: list[tuple[str, str, Any, tuple[Any, ...], dict[str, Any]]] = []  # (case, target, fn, args, kw)


def _compile_one(i: int) -> tuple[bool, str, bool, bool]:
    """(has a cubin, what, fits shared memory, spills) of launch ``i`` (in a forked worker)."""
    _, target, fn, args, kwargs = _LAUNCHES[i]
    compiled = compile_like_jit(fn, args, kwargs, TARGETS[target])
    r = resources(compiled)
    consts = {k: v for k, v in kwargs.items() if k.isupper() or k.startswith("num_")}
    return (
        bool(compiled.asm["cubin"]),
        f"{target} {fn.fn.__name__} {consts}: {r}",
        r.shared <= SMEM_LIMIT[target],
        bool(r.spills),
    )


IDS = (
    [f"moe-{c[0]}-{t}" for c in MOE for t in c[-1]]
    + [f"block-moe-{c[0]}-{t}" for c in BLOCK_MOE for t in c[-1]]
    + [f"sinks-{c[0]}-{t}" for c in SINKS for t in c[-1]]
)


@pytest.fixture(scope="module")
def compiled() -> dict[str, list[tuple[bool, str, bool, bool]]]:
    seen: set[tuple[Any, ...]] = set()
    for case in MOE:
        for target in case[-1]:
            with pytest.MonkeyPatch.context() as mp:
                calls = _moe_launches(mp, target, case)
            assert {fn.fn.__name__ for fn, _, _ in calls} == {
                "_align_kernel",
                "_gate_up_kernel",
                "_down_kernel",
            }
            for fn, args, kwargs in calls:
                if (key := _key(fn, target, args, kwargs)) not in seen:
                    seen.add(key)
                    _LAUNCHES.append((f"moe-{case[0]}-{target}", target, fn, args, kwargs))
    for case in BLOCK_MOE:
        for target in case[-1]:
            with pytest.MonkeyPatch.context() as mp:
                calls = _block_moe_launches(mp, target, case)
            assert {fn.fn.__name__ for fn, _, _ in calls} == {"_gate_up_kernel", "_down_kernel"}
            for fn, args, kwargs in calls:
                if (key := _key(fn, target, args, kwargs)) not in seen:
                    seen.add(key)
                    _LAUNCHES.append((f"block-moe-{case[0]}-{target}", target, fn, args, kwargs))
    for name, dtype, shape, kv, targets in SINKS:
        for target in targets:
            with pytest.MonkeyPatch.context() as mp:
                calls = _launches(mp, target, dtype, shape, kv, sinks=True)
            for fn, args, kwargs in calls:  # the reduce kernel does not see the sinks
                if fn.fn.__name__ != "_reduce_kernel" and (key := _key(fn, target, args, kwargs)) not in seen:
                    assert kwargs["HAS_SINKS"]
                    seen.add(key)
                    _LAUNCHES.append((f"sinks-{name}-{target}", target, fn, args, kwargs))
    with multiprocessing.get_context("fork").Pool(2) as pool:
        results = pool.map(_compile_one, range(len(_LAUNCHES)), chunksize=1)
    out: dict[str, list[tuple[bool, str, bool, bool]]] = {case: [] for case in IDS}
    for (case, *_), r in zip(_LAUNCHES, results, strict=True):
        out[case].append(r)
    return out


@pytest.mark.parametrize("case", IDS)
def test_every_launch_compiles_without_spills(
    compiled: dict[str, list[tuple[bool, str, bool, bool]]], case: str
) -> None:
    assert compiled[case], case
    for cubin, what, fits, spills in compiled[case]:
        assert cubin, what
        assert fits, what
        assert not spills, what
