"""4-bit floats (MXFP4, NVFP4) on the Triton kernels (quant/fp4/triton.py: the block kernels with E2M1 codes
and byte scales decoded in registers), as CUDA runs them: checkpoint layouts with every scale byte (E8M0
exponents, E4M3 normals, subnormals and negatives), fused rows of different NVFP4 tensor scales, N not a
multiple of 16, K with blocks past the last whole chunk, at 1, 3, 16, 17 and 70 rows and forced K splits,
against the format's PyTorch dequantization (``FP4Weights.dequantize_reference``, itself checked against
transformers and ModelOpt's formula in tests/quant/test_fp4.py) and F.linear in float64. Then the engine with
``--quantization mxfp4|nvfp4`` on the triton path: the greedy tokens of the CPU's float32 path.

Skipped unless CUDA, or ``TRITON_INTERPRET=1`` with triton (float32 and float16 there: the interpreter's
bf16 dot is wrong).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch
from test_triton_block_linear import (
    DEV,
    INTERPRET,
    _check,
    _on_triton,
    _tokens,
    check_row_counts,
    check_splits,
)

from glassbox.quant.blocks.linear import to_triton
from glassbox.quant.fp4.linear import FP4Linear
from glassbox.quant.fp4.weights import FP4Weights, concat, from_mxfp4, from_nvfp4

CUDA = torch.cuda.is_available()
pytestmark = pytest.mark.skipif(not (CUDA or INTERPRET), reason="needs CUDA, or TRITON_INTERPRET=1 + triton")

SHAPES = [(16, 512), (40, 96), (33, 1088), (20, 608)]  # a chunk; 3 blocks; 2 chunks + 2; 1 chunk + 3


def _weights(kind: str, n: int, k: int, seed: int) -> FP4Weights:
    """A checkpoint's tensors of random bytes: every code; MXFP4 exponents 110-135 (and a few 0: 2^-127,
    read as 0 by the kernels), NVFP4 every E4M3 byte but NaN (subnormals and negatives included) and a
    tensor scale."""
    rng = np.random.default_rng(seed)
    if kind == "mxfp4":
        blocks = torch.from_numpy(rng.integers(0, 256, (n, k // 32, 16), dtype=np.uint8))
        e = rng.integers(110, 136, (n, k // 32), dtype=np.uint8)
        e[0, 0] = 0
        return from_mxfp4(blocks, torch.from_numpy(e))
    packed = torch.from_numpy(rng.integers(0, 256, (n, k // 2), dtype=np.uint8))
    s = rng.integers(0, 256, (n, k // 16), dtype=np.uint8)
    s[(s & 0x7F) == 0x7F] = 0x38  # NaN codes: 1.0 instead
    s[:, :4] = [1, 7, 0x81, 0]  # subnormals, a negative subnormal, zero
    scale = torch.from_numpy(s).view(torch.float8_e4m3fn)
    return from_nvfp4(packed, scale, torch.tensor(0.0123))


def _linear(w: FP4Weights, bias: torch.Tensor | None) -> FP4Linear:
    lin = FP4Linear(w, bias)
    assert to_triton(torch.nn.Sequential(lin), DEV) == 1 and lin.triton is not None
    return lin


@pytest.mark.parametrize("shape", SHAPES, ids=[f"{n}x{k}" for n, k in SHAPES])
@pytest.mark.parametrize("kind", ["mxfp4", "nvfp4"])
def test_fp4_linear_matches_reference(kind: str, shape: tuple[int, int]) -> None:
    n, k = shape
    w = _weights(kind, n, k, seed=n * k)
    ref_w = w.dequantize_reference(torch.float32)
    bias = torch.randn(n, generator=torch.Generator().manual_seed(1)) if n % 2 else None
    lin = _linear(w, bias)
    assert lin.triton is not None and lin.held_weights() == [lin.triton]
    check_row_counts(lin, ref_w, bias)


def test_fused_rows_of_different_tensor_scales() -> None:
    """q/k/v fused: NVFP4's tensor scale per row (each part's own)."""
    parts = [_weights("nvfp4", n, 96, seed=n) for n in (16, 8, 8)]
    for i, p in enumerate(parts):
        assert p.row_scale is not None
        p.row_scale.fill_(0.01 * (i + 1))
    w = concat(parts)
    assert w is not None
    lin = _linear(w, None)
    x = torch.randn(3, 96)
    _check(lin(x.to(DEV)), x, w.dequantize_reference(torch.float32), None)


@pytest.mark.parametrize("kind", ["mxfp4", "nvfp4"])
def test_split_k_partial_sums(kind: str) -> None:
    """Every K split count gives the reference (the tail on the last split; splits with no step)."""
    w = _weights(kind, 48, 2624, seed=5)  # 5 chunks and 2 blocks
    t = FP4Linear(w)
    t.move_to_triton(DEV)
    assert t.triton is not None
    check_splits(t.triton.triton_args, w.dequantize_reference(torch.float32))


@pytest.mark.skipif(not INTERPRET, reason="needs TRITON_INTERPRET=1, triton, and no CUDA")
@pytest.mark.parametrize("quantization", ["mxfp4", "nvfp4"])
def test_interpreted_engine_quantization(tmp_path: Path, quantization: str) -> None:
    """--quantization mxfp4|nvfp4 (every linear but the LM head) on the triton path: the greedy tokens of
    the CPU's float32 path (the dequantized weights), through decode graphs and chunked mixed steps."""
    from test_gpu import with_engine
    from tiny_models import build_tiny_model

    d = build_tiny_model("qwen3", tmp_path, intermediate_size=544)  # down_proj: a chunk and a pair
    kw: dict[str, Any] = dict(dtype="float32", device="cpu", quantization=quantization, max_num_seqs=4)
    ref = with_engine(d, _tokens, **kw)
    assert with_engine(d, _on_triton(True), **kw) == ref
    assert with_engine(d, _on_triton(False), **kw, max_num_batched_tokens=24) == ref
