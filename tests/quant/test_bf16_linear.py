"""glassbox's bf16 tiles (quant/dense/bf16_tiles.py, kernels/cpu_bf16.c and cpu_bf16_amx.c) against float64
products of the same bf16 values, on odd shapes: rows past a tile, in-dims that are not a multiple of the
kernel's unrolling (nor of AMX's 32), 1 to 20 activation rows (each of the kernel's row paths) and a
prefill-sized batch; the kernel tests run on both multiply paths, AVX-512 dot products and AMX tiles (skipped
on a CPU without AMX)."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
import torch
from tiny_models import build_tiny_model

from glassbox import LLM, SamplingParams
from glassbox.kernels import native
from glassbox.quant.dense.bf16_tiles import (
    TiledBf16Linear,
    linear_tiled,
    tile_weight,
    tiled_available,
    untile_weight,
    untiled,
)

pytestmark = pytest.mark.skipif(
    not tiled_available(), reason="bf16 tiles need AVX-512 BF16 and the C kernels"
)

SHAPES = [(1, 2), (15, 34), (16, 64), (37, 78), (130, 576), (48, 1030)]  # (N, K)
ROWS = [1, 2, 3, 4, 5, 7, 8, 9, 16, 20, 67]


@pytest.fixture(params=["dot", "amx"])
def multiply(request: pytest.FixtureRequest) -> Iterator[str]:
    """The kernel's multiply path for the test: AVX-512 BF16 dot products, or AMX tiles where the CPU has
    them; the process's own choice (GLASSBOX_BF16_AMX) restored after."""
    lib = native.library()
    assert lib is not None
    if not lib.gb_bf16_amx_init(int(request.param == "amx")) and request.param == "amx":
        lib.gb_bf16_amx_init(int(native.bf16_amx_wanted()))
        pytest.skip("no AMX on this CPU (or in the kernels' build)")
    yield request.param
    lib.gb_bf16_amx_init(int(native.bf16_amx_wanted()))


def _case(n: int, k: int, m: int, bias: bool) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor | None]:
    g = torch.Generator().manual_seed(n * 1000 + k + m)
    w = torch.randn(n, k, generator=g).to(torch.bfloat16)
    x = torch.randn(m, k, generator=g).to(torch.bfloat16)
    b = torch.randn(n, generator=g).to(torch.bfloat16).float() if bias else None
    return w, x, b


@pytest.mark.parametrize(("n", "k"), SHAPES)
def test_tiles_hold_the_matrix(n: int, k: int) -> None:
    w = torch.randn(n, k).to(torch.bfloat16)
    wp = tile_weight(w)
    assert wp.shape == ((n + 15) // 16, k // 2, 16, 2)
    assert torch.equal(untile_weight(wp, n), w)
    assert not untile_weight(wp, wp.shape[0] * 16)[n:].any()  # the rows past N are zeros


@pytest.mark.parametrize(("n", "k"), SHAPES)
def test_fast_untiling_gives_the_matrix(n: int, k: int) -> None:
    w = torch.randn(n, k).to(torch.bfloat16)
    m = untiled(tile_weight(w), n)
    assert torch.equal(m, w) and m.is_contiguous()


@pytest.fixture
def prompts_on_onednn(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    """Prompt-sized products on oneDNN's GEMM whatever the CPU (auto: where it has AMX)."""
    from glassbox.quant.dense.bf16_tiles import onednn_prompts

    monkeypatch.setenv("GLASSBOX_BF16_PROMPTS", "onednn")
    onednn_prompts.cache_clear()
    yield
    onednn_prompts.cache_clear()


@pytest.mark.usefixtures("prompts_on_onednn")
def test_many_rows_run_the_gemm_on_the_untiled_matrix() -> None:
    """Past 32 rows (outside an engine step, or in a step with prompt rows) the module runs oneDNN's GEMM
    on the untiled matrix: within bf16's rounding of the float64 product; 32 rows and fewer, and decode
    steps of any width, stay on the tiles (bit for bit ``linear_tiled``)."""
    from glassbox.quant.blocks.linear import block_kernel_rows

    w, x, b = _case(130, 576, 67, True)
    lin = TiledBf16Linear(w, b.to(torch.bfloat16) if b is not None else None)
    ref = x.double() @ w.double().T + b.double()
    y = lin(x)
    assert ((y.double() - ref).abs() <= ref.abs() / 128 + 1e-2).all()  # bf16 output: 8 bits of mantissa
    assert torch.equal(lin(x[:32]), linear_tiled(x[:32], lin.tiles, 130, lin.bias_f32))
    for kernel in (True, False):  # decode steps, of few rows or wide: the tiles
        with block_kernel_rows(kernel):
            assert torch.equal(lin(x), linear_tiled(x, lin.tiles, 130, lin.bias_f32))
    with block_kernel_rows(False, prompt=True):  # a step with prompt rows: the GEMM
        assert torch.equal(lin(x), y)


def test_odd_in_dim_is_refused() -> None:
    with pytest.raises(ValueError, match="even in-dimension"):
        tile_weight(torch.zeros(4, 7, dtype=torch.bfloat16))


@pytest.mark.parametrize(("n", "k"), SHAPES)
@pytest.mark.parametrize("bias", [False, True])
def test_kernel_against_float64(n: int, k: int, bias: bool, multiply: str) -> None:
    for m in ROWS:
        w, x, b = _case(n, k, m, bias)
        ref = x.double() @ w.double().T + (0 if b is None else b.double())
        bound = (x.double().abs() @ w.double().abs().T) * 1e-6 + 1e-6  # float32 sums of exact products
        for generic in (False, True):
            y = linear_tiled(x, tile_weight(w), n, b, torch.float32, generic=generic)
            assert ((y.double() - ref).abs() <= bound).all(), (
                m,
                generic,
                float((y.double() - ref).abs().max()),
            )
        # a bf16 output is the float32 sum rounded once
        y16 = linear_tiled(x, tile_weight(w), n, b)
        assert torch.equal(y16, linear_tiled(x, tile_weight(w), n, b, torch.float32).to(torch.bfloat16))


@pytest.mark.parametrize(("n", "k"), SHAPES)
def test_a_row_gets_the_same_bits_whatever_rows_run_with_it(n: int, k: int, multiply: str) -> None:
    """Batch invariance: each output is summed in k order in one lane on every path (1-4 rows, 5+ rows,
    left-over tiles; on AMX every row count), so row i alone equals row i of any batch."""
    w, x, b = _case(n, k, 67, True)
    wp = tile_weight(w)
    alone = torch.cat([linear_tiled(x[i : i + 1], wp, n, b, torch.float32) for i in range(67)])
    for m in ROWS:
        assert torch.equal(linear_tiled(x[:m], wp, n, b, torch.float32), alone[:m]), m


def test_threads_split_the_rows_without_changing_a_bit(multiply: str) -> None:
    w, x, b = _case(1000, 576, 3, True)
    wp, before = tile_weight(w), torch.get_num_threads()
    try:
        torch.set_num_threads(1)
        one = linear_tiled(x, wp, 1000, b, torch.float32)
        torch.set_num_threads(2)
        two = linear_tiled(x, wp, 1000, b, torch.float32)
    finally:
        torch.set_num_threads(before)
    assert torch.equal(one, two)


def test_module_takes_any_leading_shape_and_strided_rows() -> None:
    w, x, b = _case(40, 64, 6, True)
    lin = TiledBf16Linear(w, b.to(torch.bfloat16) if b is not None else None)
    wide = torch.randn(6, 128).to(torch.bfloat16)
    y = lin(wide[:, ::2].contiguous().view(2, 3, 64))
    assert y.shape == (2, 3, 40)
    assert torch.equal(lin(wide[:, :64]), lin(wide[:, :64].contiguous()))  # a row stride of 128
    with pytest.raises(ValueError, match="expected bf16"):
        lin(torch.zeros(2, 64))


def test_a_bf16_model_decodes_alike_on_tiles_and_on_onednn(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The same tiny bf16 model through both layouts: the same greedy tokens and logprobs within bf16's
    rounding (the sums' order differs)."""
    d = build_tiny_model("llama", tmp_path)
    params = SamplingParams(temperature=0, max_tokens=12, ignore_eos=True, logprobs=1)
    prompts = ["def fibonacci(n):", "import os\n", "x = [1, 2"]
    runs = []
    for choice in ("tiled", "onednn"):
        monkeypatch.setenv("GLASSBOX_BF16_LINEAR", choice)
        llm = LLM(str(d), dtype="bfloat16")
        outs = llm.generate(prompts, params)
        runs.append(
            [
                (o.token_ids, [lp[t] for lp, t in zip(o.logprobs or [], o.token_ids, strict=True)])
                for o in outs
            ]
        )
        del llm
    for (tok_a, lp_a), (tok_b, lp_b) in zip(*runs, strict=True):
        assert tok_a == tok_b
        assert max(abs(a - b) for a, b in zip(lp_a, lp_b, strict=True)) < 0.05
