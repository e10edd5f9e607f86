"""FP8 weights on the Triton kernels (kernels/triton_fp8_linear.py), as CUDA runs them: 128 x 128 blocks
(partial ones at the edges), per-channel and per-tensor scales, small blocks, a bias; 1, 3, 16, 17 and 70
rows on each kernel (GEMV, split-K, tiled GEMM), against the format's PyTorch dequantization
(``codes.view(float8_e4m3fn).float() * scale``) and F.linear in float64.

Skipped unless CUDA, or ``TRITON_INTERPRET=1`` with triton (float32 and float16 under the interpreter).
"""

from __future__ import annotations

import importlib.util
import os

import pytest
import torch
import torch.nn.functional as F

from glassbox.quant.blocks.linear import block_kernel_rows, to_triton
from glassbox.quant.fp8.linear import Fp8Linear
from glassbox.quant.fp8.weights import Fp8Weights

CUDA = torch.cuda.is_available()
INTERPRET = (
    not CUDA and os.environ.get("TRITON_INTERPRET") == "1" and importlib.util.find_spec("triton") is not None
)
pytestmark = pytest.mark.skipif(not (CUDA or INTERPRET), reason="needs CUDA, or TRITON_INTERPRET=1 + triton")
DEV = torch.device("cuda" if CUDA else "cpu")
LOW = torch.bfloat16 if CUDA else torch.float16

# (N, K, block rows, block cols): HF fp8 blocks with partial ones; per-channel; per-tensor; small blocks
CASES = [(200, 300, 128, 128), (33, 80, 1, 80), (40, 96, 40, 96), (48, 520, 16, 32)]


def _weights(n: int, k: int, bn: int, bk: int, seed: int) -> Fp8Weights:
    g = torch.Generator().manual_seed(seed)
    codes = (torch.randn(n, k, generator=g) * 40).to(torch.float8_e4m3fn).view(torch.uint8)
    scales = torch.rand(-(-n // bn), -(-k // bk), generator=g) * 0.01 + 1e-3
    return Fp8Weights(codes, scales, bn, bk, "FP8 test")


def _check(y: torch.Tensor, x: torch.Tensor, w: Fp8Weights, bias: torch.Tensor | None) -> None:
    assert y.dtype == x.dtype and y.shape == (x.shape[0], w.out_features)
    ref_w = w.dequantize_reference(x.dtype).double()  # rounded once to x's dtype, as the reference path
    ref = F.linear(x.double(), ref_w, None if bias is None else bias.double())
    err = ((y.cpu().double() - ref).norm() / ref.norm()).item()
    assert err < (2e-6 if x.dtype == torch.float32 else 5e-3), err


@pytest.mark.parametrize("case", CASES, ids=[f"{n}x{k}-{bn}x{bk}" for n, k, bn, bk in CASES])
def test_fp8_linear_matches_reference(case: tuple[int, int, int, int]) -> None:
    n, k, bn, bk = case
    w = _weights(n, k, bn, bk, seed=n)
    bias = torch.randn(n) if bn == 128 else None
    lin = Fp8Linear(w, bias)
    assert to_triton(torch.nn.Sequential(lin), DEV) == 1 and lin.triton
    g = torch.Generator().manual_seed(k)
    for m in (1, 3, 16, 17, 70):
        for dtype in (torch.float32, LOW) if m in (1, 3, 17) else (torch.float32,):
            x = torch.randn(m, k, generator=g).to(dtype)
            _check(lin(x.to(DEV)), x, w, bias)
            if m <= 16:  # prompt rows: the GEMM whatever the count
                with block_kernel_rows(False):
                    _check(lin(x.to(DEV)), x, w, bias)


def test_fp8_split_k() -> None:
    from glassbox.kernels.triton_fp8_linear import fp8_matmul

    w = _weights(40, 1000, 128, 128, seed=5)
    bias = torch.randn(40)
    for m in (1, 4):
        x = torch.randn(m, 1000)
        for splits in (2, 3, 9):
            y = fp8_matmul(x.to(DEV), w.codes.to(DEV), w.scales.to(DEV), 128, 128, bias.to(DEV), True, splits)
            _check(y, x, w, bias)


@pytest.mark.skipif(not CUDA, reason="W8A8 runs torch._scaled_mm on CUDA's FP8 tensor cores")
def test_w8a8_prompt_rows() -> None:
    """Per-channel weights, 17+ bf16 rows: W8A8 where the device has FP8 tensor cores (compute capability
    8.9+), the same arithmetic as the CPU's ``torch._scaled_mm`` and within rounding the activations to
    E4M3 of the weight-only product; 16 rows stay weight-only."""
    from glassbox.quant.fp8.quantize import quantize_fp8
    from glassbox.quant.fp8.w8a8 import scaled_mm_rows, w8a8_available

    g = torch.Generator().manual_seed(0)
    w = quantize_fp8(torch.randn(96, 256, generator=g))
    bias = torch.randn(96, generator=g)
    lin = Fp8Linear(w, bias)
    to_triton(torch.nn.Sequential(lin), DEV)
    fp8_cores = torch.cuda.get_device_capability() >= (8, 9)
    assert w8a8_available(DEV) == fp8_cores
    for m in (16, 17, 300):
        x = torch.randn(m, 256, generator=g).bfloat16()
        y = lin(x.to(DEV)).cpu()
        assert lin._w8a8(x.to(DEV)) == (fp8_cores and m >= 17)
        if not lin._w8a8(x.to(DEV)):
            _check(y, x, w, bias)
            continue
        cpu = scaled_mm_rows(x, w.codes, lin.w8a8_scales.cpu(), bias)  # type: ignore[union-attr]
        assert ((y.double() - cpu.double()).norm() / cpu.double().norm()).item() < 5e-3
        ref = F.linear(x.double(), w.dequantize_reference(torch.float64), bias.double())
        assert ((y.double() - ref).norm() / ref.norm()).item() < 0.05
