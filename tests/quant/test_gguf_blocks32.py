"""GGUF Q5_0, Q5_1 and IQ4_NL kept in 32-value blocks (quant/blocks/gguf32.py, kernels/cpu_quant.c): the
dequantization equals the gguf package's bit for bit, the int8-activation GEMV computes its arithmetic
(checked in float64), and a tiny Llama in the mix llama.cpp's quantizer writes for rows not of 256 values
(Q5_0 for Q4_K, Q5_1 for Q5_K, IQ4_NL for IQ4_XS, Q8_0 for Q6_K) runs kept with transformers' greedy tokens
(float32), as the dequantized model in bf16, and through the one-call decode step as the per-op forward."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import torch
from gguf import GGML_QUANT_SIZES
from gguf import GGMLQuantizationType as Q
from gguf.quants import dequantize as gguf_dequantize
from gguf.quants import quantize as gguf_quantize
from gguf_factory import Spec, random_blocks, write_model
from lowbit_factory import quantize_lowbit
from test_quantization import _int8_activation_reference, block_gemv_f32, needs_kernels
from tiny_models import greedy_continuation

from glassbox import LLM, RequestOutput, SamplingParams
from glassbox.engine.checkpoint import open_checkpoint
from glassbox.kernels.native import library
from glassbox.models.llama_native import NativeForward
from glassbox.models.loader import build_model
from glassbox.models.model_config import ModelConfig
from glassbox.models.sources import resolve_model
from glassbox.quant.blocks.gguf32 import from_gguf
from glassbox.quant.blocks.linear import BlockQuantEmbedding, BlockQuantLinear, block_weights
from glassbox.quant.blocks.weights import BlockWeights
from glassbox.quant.formats import kept_ggml_types

TYPES = [Q.Q5_0, Q.Q5_1, Q.IQ4_NL]
# N not a multiple of 16 (tiles of 16 rows, then a short one); K of one block (padded to 64), of tail pairs
# only, of whole 16-block chunks only, of chunks then a tail pair, and of a chunk then six tail pairs (896:
# Qwen2.5-0.5B's hidden, the rows llama.cpp's Q4_K_M writes as Q5_0)
SHAPES = [(1, 32), (17, 96), (16, 512), (37, 1088), (19, 896)]
BITS = {Q.Q5_0: 5.5, Q.Q5_1: 6.0, Q.IQ4_NL: 4.5}  # the file's own


def _tensor(qtype: Q, n: int, k: int, kind: str) -> np.ndarray:
    """GGML blocks (n, row bytes): quantized random weights, or random bytes (every code, every fifth bit)
    with small float16 scales (and mins)."""
    rng = np.random.default_rng(n * k + int(qtype))
    if kind == "random":
        if qtype == Q.IQ4_NL:
            return random_blocks(qtype, n, k, rng)
        raw = rng.integers(0, 256, (n * k // 32, GGML_QUANT_SIZES[qtype][1]), dtype=np.uint8)
        halves = 2 if qtype == Q.Q5_1 else 1  # float16 d (and Q5_1's min m) first
        small = rng.uniform(-0.005, 0.005, (len(raw), halves)).astype(np.float16)
        raw[:, : 2 * halves] = small.view(np.uint8)
        return raw.reshape(n, -1)
    w = (rng.standard_normal((n, k)) * 0.05).astype(np.float32)
    return quantize_lowbit(w, qtype) if qtype == Q.IQ4_NL else gguf_quantize(w, qtype)


@pytest.mark.parametrize("kind", ["quantized", "random"])
@pytest.mark.parametrize(("n", "k"), SHAPES)
@pytest.mark.parametrize("qtype", TYPES, ids=lambda t: t.name)
def test_dequantize_as_gguf_does(qtype: Q, n: int, k: int, kind: str) -> None:
    raw = _tensor(qtype, n, k, kind)
    ref = gguf_dequantize(raw, qtype).reshape(n, k)
    w = from_gguf(qtype.name, raw, (n, k))
    assert np.array_equal(w.dequantize_reference().numpy(), ref)
    assert np.array_equal(w.dequantize(torch.float32).numpy(), ref)
    assert torch.equal(w.dequantize(torch.bfloat16), torch.from_numpy(ref).bfloat16())
    ids = torch.tensor([n - 1, 0, n // 2])
    assert torch.equal(w.rows(ids, torch.float32), torch.from_numpy(ref)[ids])
    lib = library()
    if lib is not None:  # the decode bursts' embedding rows (cpu_dequant.c gb_dequant_block_rows)
        out, rows = torch.empty(n, k), torch.arange(n)
        lib.gb_dequant_block_rows(
            *w.pointers(), n, w.padded, k, w.kernel_bits, rows.data_ptr(), n, out.data_ptr(), 0
        )
        assert np.array_equal(out.numpy(), ref)


@needs_kernels
@pytest.mark.parametrize("m", [1, 3, 16])
@pytest.mark.parametrize(("n", "k"), SHAPES)
@pytest.mark.parametrize("qtype", TYPES, ids=lambda t: t.name)
def test_gemv_matches_its_arithmetic(qtype: Q, n: int, k: int, m: int) -> None:
    """The vector path (a whole tile at batch 1, rows one by one otherwise) and the plain-C path against the
    kernels' arithmetic in float64: a float32 sum of terms, so the error is bound by their magnitudes."""
    w = from_gguf(qtype.name, _tensor(qtype, n, k, "quantized"), (n, k))
    x = torch.randn(m, k, generator=torch.Generator().manual_seed(n * k + m)).bfloat16().float()
    if k > 32:
        x[0, :32] = 0.0  # a zero activation block
    ref, terms = _int8_activation_reference(x, w)
    for generic in (False, True):
        err = (block_gemv_f32(w, x, generic) - ref).abs()
        # float32 accumulation of up to K/32 block terms: a few ulps of their magnitude sum
        assert bool((err <= 1e-6 * terms + 1e-7).all()), (generic, (err / terms).max())
    exact = x @ w.dequantize_reference().t()  # and the int8 activations cost little
    assert ((ref - exact).norm() / exact.norm()).item() < 0.02


def test_stored_bits_per_weight() -> None:
    """The bytes kept are the file's own (rows of whole 64-value groups: no padding)."""
    for qtype, bits in BITS.items():
        n, k = 3, 1088
        w = from_gguf(qtype.name, _tensor(qtype, n, k, "random"), (n, k))
        assert w.nbytes == n * k // 32 * GGML_QUANT_SIZES[qtype][1]
        assert w.nbytes * 8 / (n * k) == bits


def test_cuda_keeps_only_what_triton_runs() -> None:
    """The table keeps these types on the CPU; CUDA (no Triton layout for them) dequantizes them at load."""
    assert {"Q5_0", "Q5_1", "IQ4_NL"} <= kept_ggml_types("blocks")
    assert not {"Q5_0", "Q5_1", "IQ4_NL"} & kept_ggml_types("blocks", triton=True)
    assert {"Q4_0", "Q8_0", "Q4_K"} <= kept_ggml_types("blocks", triton=True)
    w = from_gguf("Q5_0", _tensor(Q.Q5_0, 2, 64, "random"), (2, 64))
    with pytest.raises(ValueError, match="no Triton kernels"):
        _ = w.triton_args


# ---- a tiny Llama in llama.cpp's fallback mix ---------------------------------------------------------------

# hidden 544 (17 blocks: a whole chunk, then a tail pair once padded), FFN 1088 (two chunks, a tail pair)
MIX = {"v_proj": Q.Q8_0, "o_proj": Q.Q5_1, "down_proj": Q.IQ4_NL, "lm_head": Q.Q8_0}  # the rest Q5_0
PROMPTS = [[1, 5, 9, 13, 2], [7, 7, 30, 41, 12, 3, 60, 22, 18], [50, 1, 33]]
NEW = 8


@pytest.fixture(scope="module")
def model_file(tmp_path_factory: pytest.TempPathFactory) -> Path:
    path = tmp_path_factory.mktemp("blocks32") / "tiny-q5.gguf"
    spec = Spec(hidden=544, ffn=1088, layers=2, heads=4, kv_heads=2, vocab=64, qtype=Q.Q5_0, types=MIX)
    write_model(path, spec, seed=5)
    return path


@pytest.fixture(scope="module")
def reference(model_file: Path) -> list[tuple[list[int], list[float]]]:
    """transformers reading the file (dequantized by the gguf package), float32, greedy."""
    import transformers as tf

    model = tf.AutoModelForCausalLM.from_pretrained(
        model_file.parent, gguf_file=model_file.name, dtype=torch.float32
    )
    return [greedy_continuation(model, ids, NEW) for ids in PROMPTS]


def test_kept_float32_model_matches_transformers(model_file: Path, reference: list) -> None:
    """Every tensor kept (the Q5_0 embedding too), float32: the dequantization is exact, so greedy tokens
    equal transformers' on the gguf package's dequantized weights."""
    checkpoint = open_checkpoint(resolve_model(str(model_file)))
    floats, kept = checkpoint.weights(True, torch.device("cpu"), torch.float32)
    assert {p.label for p in kept.values()} == {"Q5_0", "Q5_1", "IQ4_NL", "Q8_0"}
    assert len(kept) == 2 * 7 + 2
    cfg = ModelConfig.from_facts(checkpoint.facts)
    model = build_model(cfg, floats, torch.float32, torch.device("cpu"), kept=kept)
    assert isinstance(model.get_submodule("model.embed_tokens"), BlockQuantEmbedding)
    assert not [m for m in model.modules() if isinstance(m, torch.nn.Linear | torch.nn.Embedding)]
    sizes = checkpoint.gguf.stored_sizes() if checkpoint.gguf else {}
    for name, w in kept.items():  # the file's bytes, rows padded to whole 64-value groups (544 -> 576)
        assert isinstance(w, BlockWeights) and w.nbytes * w.in_features == sizes[name][1] * w.padded
    llm = LLM(str(model_file), dtype="float32", device="cpu", max_model_len=128)
    params = SamplingParams(temperature=0, max_tokens=NEW, ignore_eos=True, logprobs=1)
    for out, (toks, lps) in zip(llm.generate(PROMPTS, params), reference, strict=True):
        assert out.token_ids == toks
        assert out.logprobs is not None
        assert [lp[t] for lp, t in zip(out.logprobs, toks, strict=True)] == pytest.approx(lps, abs=1e-4)


def assert_close_to(ours: list[RequestOutput], ref: list[RequestOutput], tol: float = 0.25) -> None:
    """Greedy paths of two engines on the same weights in different arithmetic (int8 activations and bf16
    roundings: logits ~1% apart): while the tokens agree their logprobs are within ``tol``; where they part,
    the reference's own choice was a near tie (its logprob within ``tol`` of ours)."""
    for a, b in zip(ours, ref, strict=True):
        assert a.logprobs is not None and b.logprobs is not None
        for j, t in enumerate(b.token_ids):
            if a.token_ids[j] != t:
                assert b.logprobs[j][t] - b.logprobs[j].get(a.token_ids[j], -1e9) < tol, (j, a.token_ids, t)
                break
            assert abs(a.logprobs[j][t] - b.logprobs[j][t]) < tol


@needs_kernels
def test_bf16_engine_keeps_the_blocks_as_the_dequantized_one_runs(model_file: Path) -> None:
    """bf16 as served: the blocks kept, decode steps on the int8-activation kernel; against the engine on the
    same file dequantized at load (--quantization none keeps nothing: a bf16 model) close (a random tiny
    model's logits are near ties, which either arithmetic may break its way)."""
    llm = LLM(str(model_file), dtype="bfloat16", device="cpu", max_model_len=128)
    ex = llm.engine.executor
    assert ex.block_formats == ["IQ4_NL", "Q5_0", "Q5_1", "Q8_0"]
    assert all(isinstance(w, BlockWeights) for w in block_weights(ex.model))
    params = SamplingParams(temperature=0, max_tokens=NEW, ignore_eos=True, logprobs=5)
    outs = llm.generate(PROMPTS, params)
    ran = [m for m in ex.model.modules() if isinstance(m, BlockQuantLinear) and m._call is not None]
    assert ran, "no kept layer ran the GEMV kernel"
    dense = LLM(str(model_file), dtype="bfloat16", device="cpu", max_model_len=128, quantization="none")
    assert dense.engine.executor.block_formats == []
    assert_close_to(outs, dense.generate(PROMPTS, params))


@needs_kernels
def test_one_call_step_equals_the_per_op_forward(model_file: Path) -> None:
    """The one-call decode step (kernels/cpu_step.c) takes the 5-bit and IQ4_NL linears (q/k/v of two types as
    parts): the same kernels as the per-op forward, so the same bits."""
    llm = LLM(str(model_file), dtype="bfloat16", device="cpu", max_model_len=128)
    forward = llm.engine.executor.forward
    assert isinstance(forward, NativeForward) and forward.step is not None
    assert forward.step.layers[0].qkv_parts == 3  # q and k Q5_0, v Q8_0
    params = SamplingParams(temperature=0, max_tokens=NEW, ignore_eos=True, logprobs=2)

    def run() -> list[tuple[list[int], list[float]]]:
        outs = llm.generate(PROMPTS, params)
        return [
            (o.token_ids, [lp[t] for lp, t in zip(o.logprobs or [], o.token_ids, strict=True)]) for o in outs
        ]

    stepped = run()
    forward.step = None  # the per-op forward for every step
    assert stepped == run()
