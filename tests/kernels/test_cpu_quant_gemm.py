"""The int8 prompt GEMM for block weights (kernels/cpu_quant_gemm.c, quant/blocks/prompt_gemm.py) against float64
references, on shapes that leave every edge: N not a multiple of the 4-row register tile nor of the 16-row
storage tile, M not a multiple of the 4-row activation tile and past one 64-row panel, K with and without
blocks past the last whole 16-block chunk."""

from __future__ import annotations

import pytest
import torch
from gguf import GGMLQuantizationType as Q
from test_gguf_blocks32 import _tensor
from test_quantization import _int8_activation_reference

from glassbox.quant.blocks.gguf32 import from_gguf
from glassbox.quant.blocks.prompt_gemm import int8_gemm
from glassbox.quant.blocks.quantize import quantize
from glassbox.quant.blocks.weights import BLOCK, BlockWeights, native_library

U = 2.0**-24  # float32's unit roundoff

needs_vnni = pytest.mark.skipif(
    native_library() is None or not native_library().gb_gemm_blocks_native(),  # type: ignore[union-attr]
    reason="the C kernels are not built with AVX-512 VNNI here",
)

# (N, K, M): 37 rows = 2 tiles of 16 + 5 (a 4-row group and a single row); K = 544 pads to 576 (a chunk, then a
# tail pair), 1088 (two chunks, a tail pair), 2048 (four whole chunks); M = 70: 17 tiles of 4 rows and 2 rows;
# 2048 x 261: a panel of 256 activation rows (cpu_quant_gemm.c PANEL_BYTES / Kp), then 5
SHAPES = [(37, 544, 70), (19, 1088, 5), (53, 2048, 7), (4, 512, 1), (21, 2048, 261)]
TYPES = [Q.Q4_0, Q.Q4_1, Q.Q8_0, Q.Q5_0, Q.Q5_1, Q.IQ4_NL]


def _weights(qtype: Q | str, n: int, k: int) -> BlockWeights:
    if isinstance(qtype, str):  # --quantization int4 with zero codes, asymmetric (GPTQ-like offsets)
        w = torch.randn(n, k, generator=torch.Generator().manual_seed(n + k)) * 0.05
        return quantize(w, 4, asymmetric=True)
    return from_gguf(qtype.name, _tensor(qtype, n, k, "quantized"), (n, k))


def _exact(x: torch.Tensor, w: BlockWeights) -> tuple[torch.Tensor, torch.Tensor]:
    """x W^T in float64 with W = d q + o by the format's definition, and sum_k |x_k| |W_nk| per output."""
    q = w.unpacked_codes().double().view(w.out_features, -1, BLOCK)
    wf = q * w.scales.double()[..., None] + w.offset_values().double()[..., None]
    wf = wf.reshape(w.out_features, -1)[:, : w.in_features]
    return x.double() @ wf.t(), x.double().abs() @ wf.abs().t()


def _quantization_bound(x: torch.Tensor, w: BlockWeights) -> torch.Tensor:
    """|x W^T - x^ W^T| for x^ = x in int8 blocks: each value moves by at most half its block's step
    dx = max|x_b| / 127 (round to nearest; the float32 quotient x / dx adds at most a few ulps, the 1e-6),
    so the error is at most sum_b dx_b / 2 sum_{k in b} |W_nk|."""
    kp = w.padded
    xb = torch.nn.functional.pad(x.double(), (0, kp - x.shape[1])).view(x.shape[0], -1, BLOCK)
    half_step = xb.abs().amax(-1) / 127.0 / 2.0 * (1 + 1e-6)  # (M, nb)
    q = w.unpacked_codes().double().view(w.out_features, -1, BLOCK)
    wabs = (q * w.scales.double()[..., None] + w.offset_values().double()[..., None]).abs().sum(-1)  # (N, nb)
    return half_step @ wabs.t()


@needs_vnni
@pytest.mark.parametrize(("n", "k", "m"), SHAPES)
@pytest.mark.parametrize("qtype", [*TYPES, "int4-asym"], ids=lambda t: getattr(t, "name", t))
def test_int8_gemm_matches_float64(qtype: Q | str, n: int, k: int, m: int) -> None:
    w = _weights(qtype, n, k)
    x = torch.randn(m, k, generator=torch.Generator().manual_seed(n * k + m))
    x[0, :32] = 0.0  # a zero activation block (dx = 0)
    bias = torch.randn(n, generator=torch.Generator().manual_seed(7))
    y = int8_gemm(x.contiguous(), w, bias).double() - bias.double()
    nb = w.padded // BLOCK
    # 1. the kernel's own arithmetic (int8 activations, exact int32 block sums) in float64: what is left is
    # float32 rounding of sum_b dx d ip + o cx, each term formed with <= 3 roundings, summed in one of 16 lanes
    # over <= nb / 16 + 2 steps, then a 4-level tree, then the bias: (nb / 16 + 10) u of the terms' magnitudes
    ref, terms = _int8_activation_reference(x, w)
    f32 = (nb / 16 + 10) * U * terms.double() + (2 * U) * bias.double().abs()[None]
    err = (y - ref.double()).abs()
    assert bool((err <= f32 + 1e-30).all()), (err / (f32 + 1e-30)).max().item()
    # 2. against x W^T itself: the activations' quantization bound (derived in _quantization_bound) plus the same
    # float32 rounding (a worst case: the random errors here reach a few percent of it; 1. is the tight check)
    exact, _ = _exact(x, w)
    bound = _quantization_bound(x, w) + f32
    err = (y - exact).abs()
    assert bool((err <= bound).all()), (err / bound).max().item()


@needs_vnni
@pytest.mark.parametrize("qtype", [Q.Q4_0, Q.Q8_0])
def test_bf16_in_and_out(qtype: Q) -> None:
    """bf16 activations (as the engine passes them) and a bf16 result: the float32 result (same activation
    values) rounded once to nearest even."""
    n, k, m = 21, 1088, 9
    w = _weights(qtype, n, k)
    x = torch.randn(m, k, generator=torch.Generator().manual_seed(3)).bfloat16()
    y16 = int8_gemm(x.contiguous(), w, None)
    assert y16.dtype == torch.bfloat16
    y32 = int8_gemm(x.float().contiguous(), w, None)
    assert torch.equal(y16, y32.bfloat16())
