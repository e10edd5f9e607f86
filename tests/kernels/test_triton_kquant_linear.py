"""GGUF K-quants (Q4_K, Q5_K, Q6_K) on the Triton kernels (quant/blocks/kquant_triton.py: the block kernels with
integer sub-block scales and float16 super-block scales decoded in registers), as CUDA runs them.

The layout, everywhere: its dequantization (PyTorch ops, the embedding lookup's path) equals the gguf
package's of the file's bytes bit for bit (random bytes: every code and scale bit, negative Q6_K scales),
with its bytes per weight. The kernels, under CUDA or ``TRITON_INTERPRET=1``: N not a multiple of 16, K
with a super-block past the last whole chunk or none, at 1, 3, 16, 17 and 70 rows and forced K splits,
against F.linear in float64 on that dequantization; a tied table and LM head moved once; the engine on a
Q4_K_M-like file (Q4_K, Q5_K, Q6_K, the table kept) kept packed as CUDA keeps it: the greedy tokens of
the CPU's float32 path, which dequantizes the file at load.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch
from gguf import GGMLQuantizationType as Q
from gguf.quants import dequantize as gguf_dequantize
from gguf_factory import Spec, random_blocks, write_model
from test_triton_block_linear import (
    CUDA,
    DEV,
    INTERPRET,
    _check,
    _on_triton,
    _tokens,
    check_row_counts,
    check_splits,
)

from glassbox.quant.blocks.kquant import from_gguf
from glassbox.quant.blocks.kquant_triton import TritonKQuant, for_triton
from glassbox.quant.blocks.linear import BlockQuantEmbedding, BlockQuantLinear, to_triton

on_triton = pytest.mark.skipif(not (CUDA or INTERPRET), reason="needs CUDA, or TRITON_INTERPRET=1 + triton")
TYPES = [Q.Q4_K, Q.Q5_K, Q.Q6_K]
# (N, K): one chunk (two super-blocks); a chunk and a super-block past it, N odd; only a super-block
SHAPES = [(16, 512), (33, 768), (20, 256)]
BITS = {Q.Q4_K: 4.625, Q.Q5_K: 8.625, Q.Q6_K: 8.5625}  # here: scales and 5- and 6-bit codes a byte each


def _raw(qtype: Q, n: int, k: int) -> tuple[np.ndarray, torch.Tensor]:
    """(GGML blocks of random bytes, the gguf package's dequantization (n, k) float32)."""
    raw = random_blocks(qtype, n, k, np.random.default_rng(n * k + int(qtype)))
    return raw, torch.from_numpy(gguf_dequantize(raw, qtype).reshape(n, k).copy())


@pytest.mark.parametrize(("n", "k"), SHAPES)
@pytest.mark.parametrize("qtype", TYPES, ids=lambda t: t.name)
def test_layout_dequantizes_as_gguf_does(qtype: Q, n: int, k: int) -> None:
    raw, ref = _raw(qtype, n, k)
    t = for_triton(from_gguf(qtype.name, raw, (n, k)))
    assert t.nbytes * 8 == BITS[qtype] * n * k
    assert torch.equal(t.dequantize_reference(), ref)
    ids = torch.tensor([[n - 1, 0], [n // 2, 17 % n]])
    assert torch.equal(t.rows(ids, torch.float32), ref[ids])
    assert torch.equal(t.rows(ids, torch.float16), ref[ids].half())


def _linear(qtype: Q, n: int, k: int, bias: torch.Tensor | None) -> tuple[BlockQuantLinear, torch.Tensor]:
    raw, ref = _raw(qtype, n, k)
    lin = BlockQuantLinear(from_gguf(qtype.name, raw, (n, k)), bias)
    assert to_triton(torch.nn.Sequential(lin), DEV) == 1 and lin.triton and isinstance(lin.w, TritonKQuant)
    assert set(dict(lin.named_buffers())) == set(lin.w.stored()), "the CPU layout's buffers let go"
    return lin, ref


@on_triton
@pytest.mark.parametrize(("n", "k"), SHAPES)
@pytest.mark.parametrize("qtype", TYPES, ids=lambda t: t.name)
def test_kquant_linear_matches_reference(qtype: Q, n: int, k: int) -> None:
    bias = torch.randn(n, generator=torch.Generator().manual_seed(1)) if n % 2 else None
    lin, ref_w = _linear(qtype, n, k, bias)
    check_row_counts(lin, ref_w, bias)


@on_triton
@pytest.mark.parametrize("qtype", [Q.Q4_K, Q.Q6_K], ids=lambda t: t.name)
def test_split_k_partial_sums(qtype: Q) -> None:
    """Every K split count gives the reference (the tail super-block on the last split)."""
    lin, ref_w = _linear(qtype, 48, 2816, None)  # 5 chunks and a super-block
    assert isinstance(lin.w, TritonKQuant)
    check_splits(lin.w.triton_args, ref_w)


@on_triton
def test_tied_table_moves_once() -> None:
    """The embedding table and a tied LM head share their re-laid K-quants; the linear runs the kernels."""
    raw, ref = _raw(Q.Q6_K, 24, 256)
    w = from_gguf("Q6_K", raw, (24, 256))
    model = torch.nn.ModuleDict({"embed": BlockQuantEmbedding(w, torch.float32), "head": BlockQuantLinear(w)})
    assert to_triton(model, DEV) == 1
    embed, head = model["embed"], model["head"]
    assert isinstance(embed, BlockQuantEmbedding) and isinstance(head, BlockQuantLinear)
    assert embed.w is head.w and isinstance(head.w, TritonKQuant) and head.w.codes.device.type == DEV.type
    assert "meta" not in dict(embed.named_buffers())
    ids = torch.tensor([[3, 0], [23, 7]])
    assert torch.equal(embed(ids.to(DEV)).cpu(), ref[ids])
    x = torch.randn(2, 256)
    _check(head(x.to(DEV)), x, ref, None)


# llama.cpp's Q4_K_M: Q4_K, with Q6_K for the output and (some layers') attn_v and ffn_down; Q5_K here too
MIX = {"v_proj": Q.Q6_K, "down_proj": Q.Q6_K, "lm_head": Q.Q6_K, "o_proj": Q.Q5_K}


@pytest.mark.skipif(not INTERPRET, reason="needs TRITON_INTERPRET=1, triton, and no CUDA")
@pytest.mark.timeout(600)  # ~150 s interpreted
def test_interpreted_engine_gguf_kquant_mix(tmp_path: Path) -> None:
    """A Q4_K_M-like file kept packed (as on CUDA) on the triton path, through decode graphs and chunked
    mixed steps: the greedy tokens of the CPU's float32 path, which dequantizes the file at load."""
    from test_gpu import with_engine

    from glassbox.models.loader import build_model

    path = tmp_path / "q4_k_m.gguf"
    write_model(path, Spec(hidden=256, ffn=512, layers=1, vocab=96, qtype=Q.Q4_K, types=MIX), seed=5)

    def packed_model(llm: Any) -> Any:
        """The model as the executor builds it on CUDA: the file's K-quants kept (the table too)."""
        from glassbox.engine.checkpoint import open_checkpoint

        ex = llm.engine.executor
        weights, kept = open_checkpoint(llm.engine.source).weights(True, ex.device, ex.dtype, cpu=False)
        assert {w.label for w in kept.values()} == {"Q4_K", "Q5_K", "Q6_K"}
        model = build_model(ex.model_config, weights, ex.dtype, ex.device, kept=kept)
        assert isinstance(model.get_submodule("model.embed_tokens"), BlockQuantEmbedding)
        return model

    kw: dict[str, Any] = dict(dtype="float32", device="cpu", max_num_seqs=4)
    ref = with_engine(path, _tokens, **kw)
    assert with_engine(path, _on_triton(True, packed_model), **kw) == ref
    assert with_engine(path, _on_triton(False, packed_model), **kw, max_num_batched_tokens=24) == ref
