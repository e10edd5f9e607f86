"""Block weights on the Triton kernels (kernels/triton_block_linear.py), as CUDA runs them: every layout
variant (4 and 8 bits; constant offsets, stored offsets, zero codes; act-order's input permutation; a bias;
N not a multiple of 16; K with blocks past the last whole chunk, or not a multiple of 32) at 1, 3, 16, 17 and
70 rows, on each kernel (GEMV, split-K, tiled GEMM), against an independent reference: gguf.quants'
dequantization for GGUF's Q4_0/Q4_1/Q8_0, d (q - z) from the codes for zero codes, the format's PyTorch
dequantization for ``--quantization int4|int8``, then F.linear in float64. Then the engine on the triton
path with ``--quantization int4|int8``, a GGUF Q4_0 file and a GPTQ act-order checkpoint: the greedy tokens
of the CPU's dequantized model.

Skipped unless CUDA, or ``TRITON_INTERPRET=1`` with triton (the interpreter runs the kernels on CPU
tensors; float32 and float16: its bf16 dot is wrong).
"""

from __future__ import annotations

import importlib.util
import os
from collections.abc import Callable
from pathlib import Path
from typing import Any

import gguf
import numpy as np
import pytest
import torch
import torch.nn.functional as F
from gguf import GGMLQuantizationType as Q

from glassbox.quant.blocks.linear import BlockQuantLinear, block_kernel_rows, to_triton
from glassbox.quant.blocks.quantize import quantize
from glassbox.quant.blocks.weights import BLOCK, BlockWeights, from_gguf, from_zero_codes

CUDA = torch.cuda.is_available()
INTERPRET = (
    not CUDA and os.environ.get("TRITON_INTERPRET") == "1" and importlib.util.find_spec("triton") is not None
)
pytestmark = pytest.mark.skipif(not (CUDA or INTERPRET), reason="needs CUDA, or TRITON_INTERPRET=1 + triton")
DEV = torch.device("cuda" if CUDA else "cpu")
LOW = torch.bfloat16 if CUDA else torch.float16  # the interpreter's bf16 dot is wrong

# (N, K): one chunk exactly; no whole chunk (3 blocks, padded to 4); two chunks and a pair past them, N odd;
# one chunk and 3 (GGUF: 608) or 2.75 (the others: 600, padded to 640) blocks past it
SHAPES = [(16, 512), (40, 96), (33, 1088), (20, 600)]
VARIANTS = ["Q4_0", "Q4_1", "Q8_0", "int4", "int8", "gptq4", "gptq8", "gptq4-act-order"]


def _weights(variant: str, n: int, k: int, seed: int) -> tuple[BlockWeights, torch.Tensor]:
    """(the blocks, the reference (N, K) float32 weight in input-channel order)."""
    rng = np.random.default_rng(seed)
    if variant.startswith("Q"):
        k = -(-k // BLOCK) * BLOCK  # GGUF rows are whole blocks
        qtype = Q[variant]
        raw = gguf.quants.quantize(rng.standard_normal((n, k)).astype(np.float32), qtype)
        return from_gguf(variant, raw, (n, k)), torch.from_numpy(gguf.quants.dequantize(raw, qtype))
    if variant.startswith("int"):
        w = quantize(torch.from_numpy(rng.standard_normal((n, k)).astype(np.float32)), int(variant[3]))
        return w, w.dequantize_reference(torch.float32)
    bits = int(variant[4])
    nb = -(-k // BLOCK)
    q = rng.integers(0, 1 << bits, (n, nb, BLOCK), dtype=np.uint8)
    d = (rng.uniform(0.002, 0.05, (n, nb)) * rng.choice([-1, 1], (n, nb))).astype(np.float16)
    z = rng.integers(0, 1 << bits, (n, nb), dtype=np.uint8)
    ref = (d.astype(np.float32)[..., None] * (q.astype(np.float32) - z[..., None])).reshape(n, -1)[:, :k]
    perm = torch.from_numpy(rng.permutation(k)) if variant.endswith("act-order") else None
    w = from_zero_codes(q, d, z, bits, k, variant, perm)
    dense = torch.from_numpy(ref)
    if perm is not None:  # column j of the blocks is input channel perm[j]
        dense = torch.empty_like(dense)
        dense[:, perm] = torch.from_numpy(ref)
    return w, dense


def _linear(w: BlockWeights, bias: torch.Tensor | None) -> BlockQuantLinear:
    lin = BlockQuantLinear(w, bias)
    model = torch.nn.Sequential(lin)
    assert to_triton(model, DEV) == 1 and lin.triton
    return lin


def _check(y: torch.Tensor, x: torch.Tensor, ref_w: torch.Tensor, bias: torch.Tensor | None) -> None:
    """Relative error against F.linear in float64 on the reference weight rounded to x's dtype (as the
    reference path runs it): 2e-6 in float32, 5e-3 in 16 bits."""
    assert y.dtype == x.dtype and y.shape == (x.shape[0], ref_w.shape[0])
    w = ref_w.to(x.dtype).double()
    ref = F.linear(x.cpu().double(), w, None if bias is None else bias.double())
    err = ((y.cpu().double() - ref).norm() / ref.norm()).item()
    assert err < (2e-6 if x.dtype == torch.float32 else 5e-3), err


@pytest.mark.parametrize("shape", SHAPES, ids=[f"{n}x{k}" for n, k in SHAPES])
@pytest.mark.parametrize("variant", VARIANTS)
def test_block_linear_matches_reference(variant: str, shape: tuple[int, int]) -> None:
    n, k = shape
    w, ref_w = _weights(variant, n, k, seed=n * k)
    k = w.in_features
    bias = (
        torch.randn(n, generator=torch.Generator().manual_seed(1)) if variant in ("Q8_0", "gptq4") else None
    )
    check_row_counts(_linear(w, bias), ref_w, bias)


def check_row_counts(lin: Any, ref_w: torch.Tensor, bias: torch.Tensor | None) -> None:
    """``lin`` at 1, 3, 16, 17 and 70 rows (float32; 1, 3 and 17 in 16 bits too) against ``_check``: the
    decode kernels up to 16 rows, the GEMM beyond, and the GEMM for up to 16 prompt rows of a step with
    prompts (whatever the count)."""
    k = ref_w.shape[1]
    g = torch.Generator().manual_seed(k)
    for m in (1, 3, 16, 17, 70):
        for dtype in (torch.float32, LOW) if m in (1, 3, 17) else (torch.float32,):
            x = torch.randn(m, k, generator=g).to(dtype)
            _check(lin(x.to(DEV)), x, ref_w, bias)
            if m <= 16:
                with block_kernel_rows(False):
                    _check(lin(x.to(DEV)), x, ref_w, bias)


@pytest.mark.parametrize("bits", [4, 8])
def test_split_k_partial_sums(bits: int) -> None:
    w, ref_w = _weights(f"gptq{bits}", 48, 2600, seed=bits)  # 5 chunks and 2 blocks
    check_splits(w.to(DEV).triton_args, ref_w)


def check_splits(w: Any, ref_w: torch.Tensor) -> None:
    """``block_matmul`` on ``w`` (BlockArgs on DEV) at 1 and 5 rows with a bias: every K split count gives
    the reference (the tail on the last split; splits with no step)."""
    from glassbox.kernels.triton_block_linear import block_matmul

    bias = torch.randn(w.rows)
    for m in (1, 5):
        x = torch.randn(m, w.in_features)
        for splits in (2, 3, 7, 16):
            _check(block_matmul(x.to(DEV), w, bias.to(DEV), True, splits=splits), x, ref_w, bias)


def test_to_device_keeps_a_tied_table_once() -> None:
    """The embedding table and a tied LM head share their moved blocks; the linear runs the kernels."""
    from glassbox.quant.blocks.linear import BlockQuantEmbedding

    w, ref_w = _weights("int4", 24, 64, seed=3)
    model = torch.nn.ModuleDict({"embed": BlockQuantEmbedding(w, torch.float32), "head": BlockQuantLinear(w)})
    assert to_triton(model, DEV) == 1
    embed, head = model["embed"], model["head"]
    assert isinstance(embed, BlockQuantEmbedding) and isinstance(head, BlockQuantLinear)
    assert embed.w is head.w and head.w.codes.device.type == DEV.type and head.triton
    ids = torch.tensor([[3, 0], [23, 7]])
    torch.testing.assert_close(embed(ids.to(DEV)).cpu(), ref_w[ids], rtol=0, atol=0)
    x = torch.randn(2, 64)
    _check(head(x.to(DEV)), x, ref_w, None)


# -- the engine on the triton path --------------------------------------------------------------------------
MAX_NEW = 10


def _prompts(vocab: int) -> list[list[int]]:
    rnd = np.random.default_rng(4)
    return [[int(t) for t in rnd.integers(3, vocab, n)] for n in (1, 17, 40, 5)]


def _on_triton(graphs: bool, model: Callable[[Any], Any] | None = None) -> Callable[[Any], list[list[int]]]:
    """Use the engine as CUDA runs it: its model (or ``model(llm)``'s) with the block weights on the
    Triton kernels (to_triton), the triton attention, and the decode graph runner when ``graphs``."""
    from test_gpu import _use_triton

    def use(llm: Any) -> list[list[int]]:
        ex = llm.engine.executor
        if model is not None:
            ex.model = model(llm)
        assert to_triton(ex.model, ex.device) > 0
        _use_triton(llm, graphs)
        return _tokens(llm)

    return use


def _tokens(llm: Any) -> list[list[int]]:
    from glassbox import SamplingParams

    sp = SamplingParams(temperature=0, max_tokens=MAX_NEW, ignore_eos=True)
    prompts = _prompts(llm.engine.model_config.vocab_size)
    got = [o.token_ids for o in llm.generate(prompts, sp)]
    llm.engine.check_integrity()
    return got


@pytest.mark.skipif(not INTERPRET, reason="needs TRITON_INTERPRET=1, triton, and no CUDA")
@pytest.mark.parametrize("quantization", ["int4", "int4-asym", "int8"])
def test_interpreted_engine_quantization(tmp_path: Path, quantization: str) -> None:
    """--quantization int4|int4-asym|int8 (every linear and the embedding table in blocks) on the triton path: the
    greedy tokens of the CPU's float32 path (the dequantized weights), through decode graphs (one row: the
    GEMV; 2-4: split-K) and chunked mixed steps (the GEMM)."""
    from test_gpu import with_engine
    from tiny_models import build_tiny_model

    d = build_tiny_model("qwen3", tmp_path, intermediate_size=544)  # down_proj: a chunk and a pair
    kw: dict[str, Any] = dict(dtype="float32", device="cpu", quantization=quantization, max_num_seqs=4)
    ref = with_engine(d, _tokens, **kw)
    assert with_engine(d, _on_triton(True), **kw) == ref
    assert with_engine(d, _on_triton(False), **kw, max_num_batched_tokens=24) == ref


@pytest.mark.skipif(not INTERPRET, reason="needs TRITON_INTERPRET=1, triton, and no CUDA")
def test_interpreted_engine_gguf_q4_0(tmp_path: Path) -> None:
    """A GGUF Q4_0 file kept in its blocks (as on CUDA) on the triton path: the greedy tokens of the CPU's
    float32 path, which dequantizes the file at load."""
    from gguf_factory import Spec, write_model
    from test_gpu import with_engine

    from glassbox.models.loader import build_model

    path = tmp_path / "q4_0.gguf"
    write_model(path, Spec(qtype=Q.Q4_0, hidden=64, ffn=544, vocab=96, tie=True))

    def packed_model(llm: Any) -> Any:
        """The model as the executor builds it on CUDA: the file's Q4_0 tensors kept in their blocks."""
        from glassbox.engine.checkpoint import open_checkpoint

        ex = llm.engine.executor
        weights, kept = open_checkpoint(llm.engine.source).weights(True, ex.device, ex.dtype, cpu=False)
        assert kept and all(w.label == "Q4_0" for w in kept.values())
        return build_model(ex.model_config, weights, ex.dtype, ex.device, kept=kept)

    kw: dict[str, Any] = dict(dtype="float32", device="cpu", max_num_seqs=4)
    ref = with_engine(path, _tokens, **kw)
    assert with_engine(path, _on_triton(True, packed_model), **kw) == ref
    assert with_engine(path, _on_triton(False, packed_model), **kw, max_num_batched_tokens=24) == ref


@pytest.mark.skipif(not INTERPRET, reason="needs TRITON_INTERPRET=1, triton, and no CUDA")
def test_interpreted_engine_gptq_act_order(tmp_path: Path) -> None:
    """A GPTQ act-order checkpoint (zero codes, the input permutation) on the triton path with the decode
    graphs: the greedy tokens of the CPU's float32 path."""
    from test_gptq_awq import quantized_model
    from test_gpu import with_engine

    qdir, _ = quantized_model(tmp_path, "gptq-v2-g128-act")
    kw: dict[str, Any] = dict(dtype="float32", device="cpu", max_num_seqs=4)
    assert with_engine(qdir, _on_triton(True), **kw) == with_engine(qdir, _tokens, **kw)


# -- on a GPU (not run yet: no GPU in this project's CI) -----------------------------------------------------
@pytest.mark.skipif(not CUDA, reason="needs a CUDA device")
@pytest.mark.parametrize("quantization", ["int4", "int8", "Q4_0"])
def test_cuda_engine_matches_the_cpu(tmp_path: Path, quantization: str) -> None:
    """The executor's CUDA path (blocks kept or quantized on the device, to_triton, graphs): float32
    greedy tokens equal to the CPU's float32 path on the same weights; bf16 graphs equal bf16 eager; an
    eager step's launch never synchronizes."""
    from gguf_factory import Spec, write_model
    from test_gpu import with_engine
    from tiny_models import build_tiny_model

    if quantization == "Q4_0":
        model: Path = tmp_path / "q4_0.gguf"
        write_model(model, Spec(qtype=Q.Q4_0, hidden=64, ffn=544, vocab=96, tie=True))
        kw: dict[str, Any] = {}
    else:
        model = build_tiny_model("qwen3", tmp_path, intermediate_size=544)
        kw = dict(quantization=quantization)
    ref = with_engine(model, _tokens, dtype="float32", device="cpu", **kw)

    def on_gpu(llm: Any) -> list[list[int]]:
        ex = llm.engine.executor
        assert ex.block_formats and all(f in ("int4", "int8", "Q4_0") for f in ex.block_formats)
        lin = [m for m in ex.model.modules() if isinstance(m, BlockQuantLinear)]
        assert lin and all(m.triton and m.w.codes.is_cuda for m in lin)
        return _tokens(llm)

    assert with_engine(model, on_gpu, dtype="float32", device="cuda", max_num_seqs=4, **kw) == ref

    def no_sync(llm: Any) -> list[list[int]]:
        launch = llm.engine.executor.launch

        def checked(batch: Any) -> Any:
            torch.cuda.set_sync_debug_mode("error")
            try:
                return launch(batch)
            finally:
                torch.cuda.set_sync_debug_mode("default")

        llm.engine.executor.launch = checked
        return _tokens(llm)

    bf16: dict[str, Any] = dict(dtype="bfloat16", device="cuda", max_num_seqs=4, **kw)
    eager = with_engine(model, no_sync, enforce_eager=True, **bf16)
    assert with_engine(model, _tokens, **bf16) == eager
