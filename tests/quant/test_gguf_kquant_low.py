"""GGUF Q2_K, Q3_K and IQ4_XS kept in the K-quant layout (quant/blocks/kquant_low.py, kernels/cpu_kquant*.c):
the dequantization equals the gguf package's bit for bit, the int8-activation GEMV computes its arithmetic
(checked in float64), and a tiny Llama in a mix of them runs kept with transformers' greedy tokens (float32),
close to the dequantized engine in bf16, and through the one-call decode step as the per-op forward."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import torch
from gguf import GGML_QUANT_SIZES
from gguf import GGMLQuantizationType as Q
from gguf.quants import dequantize as gguf_dequantize
from gguf_factory import Spec, random_blocks, write_model
from lowbit_factory import quantize_lowbit
from test_gguf_blocks32 import assert_close_to
from test_gguf_kquant import _int8_activation_reference, kquant_gemv
from tiny_models import greedy_continuation

from glassbox import LLM, SamplingParams
from glassbox.engine.checkpoint import open_checkpoint
from glassbox.kernels.native import library
from glassbox.models.llama_native import NativeForward
from glassbox.models.loader import build_model
from glassbox.models.model_config import ModelConfig
from glassbox.models.sources import resolve_model
from glassbox.quant.blocks.kquant import KQuantWeights, from_gguf
from glassbox.quant.blocks.linear import BlockQuantEmbedding, BlockQuantLinear, block_weights
from glassbox.quant.formats import kept_ggml_types

needs_kernels = pytest.mark.skipif(library() is None, reason="no C compiler: the kernels are not built")
TYPES = [Q.Q2_K, Q.Q3_K, Q.IQ4_XS]
SHAPES = [(1, 256), (17, 512), (33, 768)]  # N not a multiple of 16 (tiles of 16 rows, then one by one)
BITS = {Q.Q2_K: 2.625, Q.Q3_K: 3.4375, Q.IQ4_XS: 4.25}  # the file's own


def _tensor(qtype: Q, n: int, k: int, kind: str) -> np.ndarray:
    """GGML blocks (n, row bytes): quantized random weights, or random bytes (every code and scale bit)
    with small float16 super-block scales."""
    rng = np.random.default_rng(n * k + int(qtype))
    if kind == "random":
        return random_blocks(qtype, n, k, rng)
    w = (rng.standard_normal((n, k)) * 0.05).astype(np.float32)
    if k > 256:  # an all-zero super-block
        w[0, -256:] = 0.0
    return quantize_lowbit(w, qtype)


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
    if lib is not None:  # the plain-C twin of the vector path
        out = torch.empty(n, k)
        lib.gb_dequant_kquant(w.codes.data_ptr(), w.meta.data_ptr(), w.kind, n, k, out.data_ptr(), 0, 1, 1)
        assert np.array_equal(out.numpy(), ref)


@needs_kernels
@pytest.mark.parametrize(("n", "k"), SHAPES + [(48, 1024)])
@pytest.mark.parametrize("qtype", TYPES, ids=lambda t: t.name)
def test_gemv_matches_its_arithmetic(qtype: Q, n: int, k: int) -> None:
    """Batch 1 (whole tiles in one pass), 3 and 16 rows, the vector and plain-C paths, against the kernels'
    arithmetic in float64 (exact integer lane sums, less the offset code's share): float32 sums of terms,
    so the error is bound by their magnitudes."""
    w = from_gguf(qtype.name, _tensor(qtype, n, k, "quantized"), (n, k))
    refs, exact = [], []
    for m in (1, 3, 16):
        x = torch.randn(m, k, generator=torch.Generator().manual_seed(n + m)).bfloat16().float()
        x[0, :32] = 0.0  # a zero activation block
        ref, terms = _int8_activation_reference(x, w)
        for generic in (False, True):
            err = (kquant_gemv(w, x, generic) - ref).abs()
            assert bool((err <= 2e-6 * terms + 1e-7).all()), (generic, m, (err / terms).max())
        refs.append(ref)
        exact.append(x @ w.dequantize_reference().t())
    error = (torch.cat(refs) - torch.cat(exact)).norm() / torch.cat(exact).norm()
    assert error.item() < 0.02  # the int8 activations cost little against the exact product


def test_stored_bits_per_weight() -> None:
    """The bytes kept are the file's own; CUDA (no Triton layout for them) dequantizes them at load."""
    for qtype, bits in BITS.items():
        n, k = 3, 512
        w = from_gguf(qtype.name, _tensor(qtype, n, k, "random"), (n, k))
        assert w.nbytes == n * k // 256 * GGML_QUANT_SIZES[qtype][1]
        assert w.nbytes * 8 / (n * k) == bits
    assert {"Q2_K", "Q3_K", "IQ4_XS"} <= kept_ggml_types("blocks")
    assert not {"Q2_K", "Q3_K", "IQ4_XS"} & kept_ggml_types("blocks", triton=True)


# ---- a tiny Llama in a mix of them --------------------------------------------------------------------------

MIX = {"v_proj": Q.Q3_K, "o_proj": Q.IQ4_XS, "down_proj": Q.Q3_K, "lm_head": Q.IQ4_XS, "embed": Q.Q2_K}
PROMPTS = [[1, 5, 9, 13, 2], [7, 7, 30, 41, 12, 3, 60, 22, 18], [50, 1, 33]]
NEW = 8


@pytest.fixture(scope="module")
def model_file(tmp_path_factory: pytest.TempPathFactory) -> Path:
    path = tmp_path_factory.mktemp("kquant_low") / "tiny-low.gguf"
    spec = Spec(hidden=256, ffn=512, layers=2, heads=4, kv_heads=2, vocab=64, qtype=Q.IQ4_XS, types=MIX)
    write_model(path, spec, seed=7)
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
    """Every tensor kept (the Q2_K embedding too), float32: the dequantization is exact, so greedy tokens
    equal transformers' on the gguf package's dequantized weights."""
    checkpoint = open_checkpoint(resolve_model(str(model_file)))
    floats, kept = checkpoint.weights(True, torch.device("cpu"), torch.float32)
    assert {p.label for p in kept.values()} == {"Q2_K", "Q3_K", "IQ4_XS"}
    assert len(kept) == 2 * 7 + 2
    cfg = ModelConfig.from_facts(checkpoint.facts)
    model = build_model(cfg, floats, torch.float32, torch.device("cpu"), kept=kept)
    assert isinstance(model.get_submodule("model.embed_tokens"), BlockQuantEmbedding)
    assert not [m for m in model.modules() if isinstance(m, torch.nn.Linear | torch.nn.Embedding)]
    llm = LLM(str(model_file), dtype="float32", device="cpu", max_model_len=128)
    params = SamplingParams(temperature=0, max_tokens=NEW, ignore_eos=True, logprobs=1)
    for out, (toks, lps) in zip(llm.generate(PROMPTS, params), reference, strict=True):
        assert out.token_ids == toks
        assert out.logprobs is not None
        assert [lp[t] for lp, t in zip(out.logprobs, toks, strict=True)] == pytest.approx(lps, abs=1e-4)


@needs_kernels
def test_bf16_engine_keeps_them_and_the_one_call_step_runs_them(model_file: Path) -> None:
    """bf16 as served: the blocks kept, decode steps on the int8-activation kernel, through the one-call step
    (kernels/cpu_step.c) as through the per-op forward (the same kernels: the same bits); close to the
    dequantized engine (--quantization none: test_gguf_blocks32.assert_close_to)."""
    llm = LLM(str(model_file), dtype="bfloat16", device="cpu", max_model_len=128)
    ex = llm.engine.executor
    assert ex.block_formats == ["IQ4_XS", "Q2_K", "Q3_K"]
    assert all(isinstance(w, KQuantWeights) for w in block_weights(ex.model))
    forward = ex.forward
    assert isinstance(forward, NativeForward) and forward.step is not None
    params = SamplingParams(temperature=0, max_tokens=NEW, ignore_eos=True, logprobs=5)

    def run(engine: LLM) -> list[tuple[list[int], list[float]]]:
        outs = engine.generate(PROMPTS, params)
        return [
            (o.token_ids, [lp[t] for lp, t in zip(o.logprobs or [], o.token_ids, strict=True)]) for o in outs
        ]

    stepped = run(llm)
    assert [m for m in ex.model.modules() if isinstance(m, BlockQuantLinear) and m._call is not None]
    forward.step = None  # the per-op forward for every step
    assert stepped == run(llm)
    dense = LLM(str(model_file), dtype="bfloat16", device="cpu", max_model_len=128, quantization="none")
    assert dense.engine.executor.block_formats == []
    assert_close_to(llm.generate(PROMPTS, params), dense.generate(PROMPTS, params))
