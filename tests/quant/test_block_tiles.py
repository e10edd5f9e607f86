"""Block weights' and K-quants' 16-row tiles (quant/blocks/tiles.py, kernels/cpu_quant.c): the edge cases of the layout,
each checked against the format's own dequantization (the gguf package) or the GEMV's arithmetic in
PyTorch: N not a multiple of 16, K with blocks past the last whole 16-block chunk, fused parts whose last
tile is short, embedding rows gathered from the tiles."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from gguf import GGMLQuantizationType as Q
from gguf.quants import dequantize as gguf_dequantize
from gguf.quants import quantize as gguf_quantize
from gguf_factory import random_blocks
from test_quantization import _int8_activation_reference, _weights, block_gemv_f32, needs_kernels

from glassbox.quant.blocks.kquant import KQuantWeights
from glassbox.quant.blocks.kquant import from_gguf as kquant_from_gguf
from glassbox.quant.blocks.linear import BlockQuantEmbedding, concat_weights
from glassbox.quant.blocks.weights import BlockWeights, from_gguf, from_zero_codes


def _gguf(qtype: Q, n: int, k: int, seed: int) -> tuple[BlockWeights, np.ndarray]:
    raw = gguf_quantize(_weights(n, k, seed), qtype)
    return from_gguf(qtype.name, raw, (n, k)), gguf_dequantize(raw, qtype).reshape(n, k)


def test_the_tiled_order() -> None:
    """A Q8_0 20 x 576 weight (18 blocks: one 16-block chunk of 512 code bytes, then 64 tail bytes per row;
    a tile of 16 rows, then one of 4) whose row n has codes n - 64 and scale n + 1 in its chunk, codes n + 10
    and scale -(n + 1) in its tail blocks: each lies where the layout says, spelled out by hand."""
    n, k, nb = 20, 576, 18
    raw = np.zeros((n, nb, 34), np.uint8)
    for row in range(n):
        for b in range(nb):
            tail = b >= 16
            raw[row, b, :2] = np.array([-(row + 1) if tail else row + 1], np.float16).view(np.uint8)
            raw[row, b, 2:] = np.array([row + 10 if tail else row - 64], np.int8).view(np.uint8)
    w = from_gguf("Q8_0", raw.reshape(n, -1), (n, k))
    codes, scales = w.codes.reshape(-1).long() - 128, w.tiled_scales.reshape(-1).float()

    def same(t: torch.Tensor, value: float) -> bool:
        return bool((t == value).all())

    # row 3 (tile 0, r = 3): its chunk's codes at (0 * 16 + 3) * 512, its tail's at 16 * 512 + 3 * 64
    assert same(codes[3 * 512 : 4 * 512], 3 - 64) and same(codes[16 * 512 + 3 * 64 :][:64], 3 + 10)
    assert same(scales[3 * 16 : 4 * 16], 4) and same(scales[16 * 16 + 3 * 2 :][:2], -4)
    # row 17 (tile 1 of 4 rows, r = 1) from 16 * 576 (scales 16 * 18): chunk + 512, tail + 4 * 512 + 64
    base, sbase = 16 * 576, 16 * 18
    assert same(codes[base + 512 :][:512], 17 - 64) and same(codes[base + 4 * 512 + 64 :][:64], 17 + 10)
    assert same(scales[sbase + 16 :][:16], 18) and same(scales[sbase + 4 * 16 + 2 :][:2], -18)


@needs_kernels
@pytest.mark.parametrize("qtype", ["Q4_0", "Q4_1", "Q8_0", "gptq"])
def test_gemv_over_short_tiles_and_tail_blocks(qtype: str) -> None:
    """N = 37 (two whole tiles and 5 rows), K = 1088 (two chunks and two tail blocks): batch 1 (whole tiles
    in one pass, the last rows one by one) and 3 rows, the vector and plain-C paths, against the
    arithmetic; and the dequantized weight against the format's own."""
    n, k = 37, 1088
    if qtype == "gptq":
        rng = np.random.default_rng(5)
        q = rng.integers(0, 16, (n, k // 32, 32), dtype=np.uint8)
        d = rng.uniform(1e-3, 1e-2, (n, k // 32)).astype(np.float16)
        z = rng.integers(0, 16, (n, k // 32), dtype=np.uint8)
        w = from_zero_codes(q, d, z, 4, k, "gptq", None)
        ref_w = (d.astype(np.float32)[..., None] * (q.astype(np.float32) - z[..., None])).reshape(n, k)
    else:
        w, ref_w = _gguf(Q[qtype], n, k, 4)
    assert np.array_equal(w.dequantize(torch.float32).numpy(), ref_w)
    for m in (1, 3):
        x = torch.randn(m, k, generator=torch.Generator().manual_seed(m)).bfloat16().float()
        ref, terms = _int8_activation_reference(x, w)
        for generic in (False, True):
            err = (block_gemv_f32(w, x, generic) - ref).abs()
            assert bool((err <= 1e-6 * terms + 1e-7).all()), (err / terms).max()


def test_concat_of_parts_with_short_tiles() -> None:
    """q/k/v parts of 20, 7 and 16 rows stacked (each part's last tile short) dequantize to the stacked
    rows, and keep the bytes."""
    parts = [_gguf(Q.Q4_1, n, 576, s) for s, n in enumerate((20, 7, 16))]
    fused = concat_weights([p for p, _ in parts])
    assert isinstance(fused, BlockWeights) and fused.out_features == 43
    assert np.array_equal(fused.dequantize(torch.float32).numpy(), np.concatenate([r for _, r in parts]))
    assert fused.nbytes == sum(p.nbytes for p, _ in parts)


@pytest.mark.parametrize("qtype", [Q.Q4_0, Q.Q8_0])
def test_embedding_rows_from_the_tiles(qtype: Q) -> None:
    """Rows looked up in a (batch, positions) id tensor, from whole tiles and the short last one."""
    n, k = 35, 1088
    w, ref = _gguf(qtype, n, k, 6)
    ids = torch.tensor([[34, 0, 17], [33, 33, 15]])
    got = BlockQuantEmbedding(w, torch.float32)(ids)
    assert got.shape == (2, 3, k)
    assert torch.equal(got, torch.from_numpy(ref)[ids])


@pytest.mark.parametrize("qtype", [Q.Q4_K, Q.Q6_K], ids=lambda t: t.name)
def test_kquant_rows_and_fused_parts_from_the_tiles(qtype: Q) -> None:
    """K-quants in tiles (steps of two super-blocks for Q4_K, one for Q6_K; 3 super-blocks leave Q4_K a lone
    last one): embedding rows and parts of 20 and 7 rows stacked, against the gguf package's dequantization."""
    k = 768
    raws = [random_blocks(qtype, n, k, np.random.default_rng(n)) for n in (20, 7)]
    refs = [gguf_dequantize(r, qtype).reshape(-1, k) for r in raws]
    parts = [kquant_from_gguf(qtype.name, r, (len(ref), k)) for r, ref in zip(raws, refs, strict=True)]
    ids = torch.tensor([[19, 0], [16, 3]])
    got = BlockQuantEmbedding(parts[0], torch.float32)(ids)
    assert torch.equal(got, torch.from_numpy(refs[0])[ids])
    fused = concat_weights(parts)
    assert isinstance(fused, KQuantWeights) and fused.out_features == 27
    assert np.array_equal(fused.dequantize(torch.float32).numpy(), np.concatenate(refs))
    assert fused.nbytes == sum(p.nbytes for p in parts)
