"""``--quantization fp8`` (quant/fp8/quantize.py): a float model's linears in E4M3 with a scale per output
channel, held to the format's definition as tests/quant/test_fp8_checkpoint.py decodes it (E4M3 from its bits,
times the scale); the engine runs token for token as transformers runs the dequantized weights. W8A8
(``scaled_mm_rows``, the CUDA prompt path) checked for its arithmetic on the CPU's ``torch._scaled_mm``."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file
from test_fp8_checkpoint import E4M3, LINEARS, PROMPTS, dequantized, quantize, write_checkpoint
from tiny_models import build_tiny_model, hf_greedy

from glassbox import LLM, SamplingParams
from glassbox.config import EngineConfig
from glassbox.perf.memory_plan import weight_bytes
from glassbox.perf.quant import resolve_scheme
from glassbox.quant.fp8.linear import Fp8Linear
from glassbox.quant.fp8.quantize import quantize_fp8
from glassbox.quant.fp8.w8a8 import (
    W8A8_MIN_ROWS,
    quantize_rows_fp8,
    row_scales,
    scaled_mm_rows,
    w8a8_available,
)
from glassbox.quant.fp8.weights import Fp8Weights
from glassbox.tokenizer.hf_tokenizer import Tokenizer
from glassbox.trace import weight_quant


@pytest.mark.parametrize(("n", "k"), [(7, 64), (33, 200), (1, 5)])
def test_per_channel_codes_are_the_definition(n: int, k: int) -> None:
    w = torch.randn(n, k, generator=torch.Generator().manual_seed(n)) * torch.logspace(-3, 1, n)[:, None]
    w[0] = 0.0  # a row of zeros: scale 1, codes 0
    fp8 = quantize_fp8(w)
    assert (fp8.block_rows, fp8.block_cols, fp8.label) == (1, k, "FP8 per-channel")
    assert fp8.nbytes == n * k + 4 * n
    q, s = quantize(w[1:], 1, k)  # each row's max scaled to 448, rounded by torch's float8 cast
    assert torch.equal(fp8.codes[1:], q.view(torch.uint8)) and torch.equal(fp8.scales[1:], s)
    assert torch.equal(fp8.codes[0], torch.zeros(k, dtype=torch.uint8)) and fp8.scales[0, 0] == 1.0
    decoded = E4M3[fp8.codes.long()]
    assert torch.equal(decoded[1:].abs().amax(dim=1), torch.full((n - 1,), 448.0, dtype=torch.float64))
    # within half an E4M3 step (3 mantissa bits: 1/16 of the value) of the weight
    err = (dequantized(fp8.codes, fp8.scales, 1, k).double() - w.double()).abs()
    assert bool((err <= w.double().abs() / 16 + 2.0**-10 * fp8.scales.double()).all())


@pytest.fixture(scope="module")
def models(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    """(a tiny float32 Llama, the same with its linears' weights per-channel E4M3 and dequantized by the
    definition: what --quantization fp8 should run)."""
    root = tmp_path_factory.mktemp("fp8q")
    base = build_tiny_model("llama", root, hidden_size=256, intermediate_size=384, num_attention_heads=4)
    floats = load_file(str(base / "model.safetensors"))
    dense = dict(floats)
    for key in (n for n in floats if n.rpartition(".")[0].endswith(LINEARS)):
        q, s = quantize(floats[key], 1, floats[key].shape[1])
        dense[key] = dequantized(q, s, 1, floats[key].shape[1])
    return base, write_checkpoint(base, root / "dequantized", dense, None)


def test_engine_runs_as_the_dequantized_weights(models: tuple[Path, Path]) -> None:
    base, ddir = models
    prompts = [Tokenizer.from_dir(base).encode(p) for p in PROMPTS]
    ref = hf_greedy(ddir, prompts, 8)
    params = SamplingParams(temperature=0, max_tokens=8, ignore_eos=True, logprobs=1)
    llm = LLM(str(base), dtype="float32", device="cpu", quantization="fp8")
    ex = llm.engine.executor
    fp8 = [m for m in ex.model.modules() if isinstance(m, Fp8Linear)]
    assert len(fp8) >= 2 * 4 and type(ex.model.lm_head) is torch.nn.Linear  # LM head stays float32
    assert ex.block_formats == ["FP8 per-channel"]
    for out, (toks, lps) in zip(llm.generate(prompts, params), ref, strict=True):
        assert out.token_ids == toks
        assert out.logprobs is not None
        assert max(abs(out.logprobs[j][t] - lps[j]) for j, t in enumerate(toks)) < 1e-4
    facts = llm.engine.facts  # the planner and the trace cost it as fp8 linears, 32-bit tables
    scheme = resolve_scheme(weight_quant(llm.engine), facts.native_quant, "fp32", False, None)
    assert scheme.main.name == "fp8" and scheme.embed.name == "fp32"
    assert weight_bytes(facts, scheme) == pytest.approx(ex.weight_bytes, rel=0.01)


def test_demo_model_keeps_its_greedy_output() -> None:
    """On a trained model (bf16), per-channel E4M3 keeps greedy continuations close to bf16's."""
    prompts = ["def fibonacci(n):", "import os\nimport sys\n", "class Stack:\n    def push(self, item):\n"]
    params = SamplingParams(temperature=0, max_tokens=16, ignore_eos=True)
    ref = LLM("glassbox-demo", dtype="bfloat16").generate(prompts, params)
    got = LLM("glassbox-demo", dtype="bfloat16", quantization="fp8").generate(prompts, params)
    same = sum(
        a == b for r, q in zip(ref, got, strict=True) for a, b in zip(r.token_ids, q.token_ids, strict=True)
    )
    assert all(r.token_ids[0] == q.token_ids[0] for r, q in zip(ref, got, strict=True))
    assert same >= 0.6 * 16 * len(prompts)  # measured 34 of 48 (3 mantissa bits: less than int8's 0.75)


@pytest.mark.parametrize("m", [W8A8_MIN_ROWS, 64])
def test_w8a8_is_its_arithmetic(m: int) -> None:
    """scaled_mm_rows = (e4m3(x / s_x) s_x) (e4m3(W) s_w)^T: each row of x scaled to max 448 and rounded
    by the float8 cast; close to the weight-only product (activations rounded to 3 mantissa bits)."""
    n, k = 48, 160
    g = torch.Generator().manual_seed(m)
    w = quantize_fp8(torch.randn(n, k, generator=g))
    x = (torch.randn(m, k, generator=g) * torch.logspace(-2, 2, m)[:, None]).bfloat16()
    bias = torch.randn(n, generator=g)
    y = scaled_mm_rows(x, w.codes, row_scales(w), bias)  # type: ignore[arg-type]
    assert y.dtype == torch.bfloat16 and y.shape == (m, n)
    q, sx = quantize_rows_fp8(x)
    assert torch.equal(E4M3[q.view(torch.uint8).long()].abs().amax(dim=1), torch.full((m,), 448.0).double())
    xa = E4M3[q.view(torch.uint8).long()] * sx.double()
    ref = xa @ dequantized(w.codes, w.scales, 1, k).double().t() + bias.double()
    assert torch.allclose(y.double(), ref, rtol=1e-2, atol=1e-2 * ref.abs().amax().item())
    weight_only = x.double() @ dequantized(w.codes, w.scales, 1, k).double().t() + bias.double()
    rel = (y.double() - weight_only).norm() / weight_only.norm()
    assert rel < 0.05


def test_w8a8_needs_channel_scales_and_fp8_tensor_cores() -> None:
    codes = torch.zeros(64, 256, dtype=torch.uint8)
    per_tensor = Fp8Weights(codes, torch.tensor([[0.5]]), 64, 256, "t")
    assert torch.equal(row_scales(per_tensor), torch.full((1, 64), 0.5))  # type: ignore[arg-type]
    assert row_scales(Fp8Weights(codes, torch.ones(1, 2), 64, 128, "b")) is None  # K blocks: weight-only
    assert not w8a8_available(torch.device("cpu"))
    lin = Fp8Linear(per_tensor)
    assert lin.w8a8_scales is not None and not lin._w8a8(torch.zeros(64, 256, dtype=torch.bfloat16))
    try:
        from glassbox.kernels.triton_block_linear import DECODE_ROWS
    except ImportError:
        return
    assert W8A8_MIN_ROWS == DECODE_ROWS + 1  # the rows a decode step's GEMV does not take


def test_fp8_is_a_quantization_choice() -> None:
    assert EngineConfig(quantization="fp8").quantization == "fp8"
    with pytest.raises(ValueError, match="--quantization"):
        EngineConfig(quantization="fp8-block")
