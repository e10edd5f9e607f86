"""The triton attention kernels compile for real GPU targets, with no GPU: every launch configuration the
host code picks (head sizes, GQA ratios, dtypes, windows, context splits) goes through Triton's whole
compiler (to a cubin, with its bundled ptxas) for an H100 and a DGX Spark. The interpreter runs in
tests/test_gpu.py check the arithmetic; this checks what only the compiler sees (it once rejected every
kernel for an annotation no interpreter run could notice)."""

from __future__ import annotations

from typing import Any

import pytest
import torch

triton = pytest.importorskip("triton")
from triton.backends.compiler import GPUTarget  # noqa: E402
from triton.compiler import ASTSource  # noqa: E402

from glassbox.kernels import triton_attention as ta  # noqa: E402
from glassbox.layers.attention import build_paged_prefill  # noqa: E402

TARGETS = {"h100": GPUTarget("cuda", 90, 32), "dgx-spark": GPUTarget("cuda", 121, 32)}
SMEM_LIMIT = {"h100": 227 * 1024, "dgx-spark": 99 * 1024}  # shared memory a block may opt in to
TYPES = {torch.bfloat16: "bf16", torch.float16: "fp16", torch.float32: "fp32", torch.int32: "i32"}
TYPES[torch.int64] = "i64"
# (dtype, (Hq, Hk, D), targets): bf16 of real models (Llama-3.1-8B, Qwen3, head sizes 64, 80, 256) on
# both; float32 of the tiny models the GPU parity tests run, and a real shape where shared memory is
# tightest (a float32 tile of 128 dims is the largest; it takes ~25 s to compile)
CASES = [
    (torch.bfloat16, s, tuple(TARGETS))
    for s in [(32, 8, 128), (16, 8, 128), (4, 2, 64), (8, 2, 80), (8, 8, 256)]
]
CASES += [(torch.float32, s, tuple(TARGETS)) for s in [(4, 2, 16), (4, 2, 32)]]
CASES += [(torch.float32, (16, 8, 128), ("dgx-spark",))]
PARAMS = [(target, dtype, shape) for dtype, shape, targets in CASES for target in targets]


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


def _arg_type(v: Any) -> str:
    if isinstance(v, torch.Tensor):
        return "*" + TYPES[v.dtype]
    if isinstance(v, float):
        return "fp32"
    assert isinstance(v, int) and not isinstance(v, bool), v
    return "i32"


def _compile(fn: Any, args: tuple[Any, ...], kwargs: dict[str, Any], target: Any) -> Any:
    names = fn.arg_names
    consts = {k: v for k, v in kwargs.items() if k not in ("num_warps", "num_stages")}
    sig = {n: _arg_type(a) for n, a in zip(names, args, strict=False)}
    sig.update({n: "constexpr" for n in consts})
    src = ASTSource(fn=fn, signature=sig, constexprs={(names.index(k),): v for k, v in consts.items()})
    options = {"num_warps": kwargs["num_warps"], "num_stages": kwargs.get("num_stages", 3)}
    return triton.compile(src, target=target, options=options)


def _launches(monkeypatch: pytest.MonkeyPatch, dtype: torch.dtype, shape: tuple[int, int, int]) -> list:
    """Run the host side of decode (one context split and eight) and prefill on CPU tensors, with and
    without a sliding window, keeping each kernel launch."""
    rec = _Launches()
    for name in ("_decode_kernel", "_reduce_kernel", "_prefill_kernel"):
        monkeypatch.setattr(ta, name, rec.bind(getattr(ta, name)))
    hq, hk, d = shape
    bs, blocks = 16, 8
    cache = torch.zeros(blocks, bs, hk, d, dtype=dtype)
    tables = torch.zeros(2, 4, dtype=torch.int32)
    lens = torch.tensor([30, 64], dtype=torch.int32)
    q = torch.zeros(2, hq, d, dtype=dtype)
    pp = build_paged_prefill(
        [(0, 40, [0, 1, 2]), (16, 20, [3, 4, 5])], ta.prefill_block_m(d, dtype), q.device
    )
    qp = torch.zeros(60, hq, d, dtype=dtype)
    for window in (None, 24):
        for splits in (None, 8):
            ta.decode_attention(q, cache, cache, tables, lens, d**-0.5, window, torch.empty_like(q), splits)
        ta.prefill_attention(
            qp, cache, cache, pp.block_tables, pp.tile_seq, pp.tile_m, pp.q_start, pp.q_len, pp.ctx,
            d**-0.5, window, torch.empty_like(qp), pp.block_m,
        )  # fmt: skip
    return rec.calls


@pytest.mark.parametrize(
    ("target", "dtype", "shape"),
    PARAMS,
    ids=[f"{t}-{TYPES[d]}-hq{a}-hk{b}-d{c}" for t, d, (a, b, c) in PARAMS],
)
def test_every_launch_compiles(
    monkeypatch: pytest.MonkeyPatch, target: str, dtype: torch.dtype, shape: tuple[int, int, int]
) -> None:
    calls = _launches(monkeypatch, dtype, shape)
    kernels = {fn.fn.__name__ for fn, _, _ in calls}
    assert kernels == {"_decode_kernel", "_reduce_kernel", "_prefill_kernel"}
    for fn, args, kwargs in calls:
        compiled = _compile(fn, args, kwargs, TARGETS[target])
        assert compiled.asm["cubin"], fn
        assert compiled.metadata.shared <= SMEM_LIMIT[target], (
            fn.fn.__name__,
            kwargs,
            compiled.metadata.shared,
        )
