"""Weights in 32-value blocks (quant/blocks/weights.py, kernels/cpu_quant.c): GGUF Q4_0/Q4_1/Q8_0 kept as
stored and --quantization int4/int8, each checked against the format's own definition (the gguf package,
llama.cpp's reference implementation in Python), the kernels against their arithmetic in PyTorch."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from gguf import GGMLQuantizationType as Q
from gguf.quants import dequantize as gguf_dequantize
from gguf.quants import quantize as gguf_quantize
from tiny_models import build_tiny_model

from glassbox import LLM, SamplingParams
from glassbox.kernels.native import library
from glassbox.quant.at_load import quantize_at_load
from glassbox.quant.blocks.linear import (
    HEAD_KERNEL_ROWS,
    BlockQuantEmbedding,
    BlockQuantLinear,
    block_kernel_rows,
    mark_lm_head,
)
from glassbox.quant.blocks.quantize import quantize
from glassbox.quant.blocks.weights import BLOCK, BlockWeights, from_gguf
from glassbox.quant.formats import FORMATS

needs_kernels = pytest.mark.skipif(library() is None, reason="no C compiler: the kernels are not built")
SHAPES = [
    (7, 64),
    (5, 96),
    (33, 160),
    (3, 576),
    (4, 1024),
    (20, 1024),
    (17, 576),
]  # K % 64 pads a zero block; 512-code chunks + tails


def _weights(n: int, k: int, seed: int = 0) -> np.ndarray:
    rng = np.random.default_rng(seed)
    w = rng.standard_normal((n, k)).astype(np.float32) * 0.05
    w[0, :BLOCK] = 0.0  # an all-zero block
    return w


@pytest.mark.parametrize("qtype", [Q.Q4_0, Q.Q4_1, Q.Q8_0], ids=lambda t: t.name)
@pytest.mark.parametrize(("n", "k"), SHAPES)
def test_gguf_blocks_dequantize_as_gguf_does(qtype: Q, n: int, k: int) -> None:
    raw = gguf_quantize(_weights(n, k), qtype)
    ref = gguf_dequantize(raw, qtype).reshape(n, k)
    blocks = from_gguf(qtype.name, raw, (n, k))
    assert np.array_equal(blocks.dequantize_reference().numpy(), ref)
    assert np.array_equal(blocks.dequantize(torch.float32).numpy(), ref)
    bf16 = torch.from_numpy(ref).bfloat16()
    assert torch.equal(blocks.dequantize(torch.bfloat16), bf16)
    ids = torch.tensor([n - 1, 0, n // 2])
    assert torch.equal(blocks.rows(ids, torch.float32), torch.from_numpy(ref)[ids])


@pytest.mark.parametrize(("bits", "qtype"), [(4, Q.Q4_0), (8, Q.Q8_0)])
@pytest.mark.parametrize(("n", "k"), SHAPES)
def test_int4_int8_quantize_as_llama_cpp(bits: int, qtype: Q, n: int, k: int) -> None:
    """--quantization int4/int8 round exactly as llama.cpp's Q4_0/Q8_0 reference quantization."""
    w = _weights(n, k, seed=1)
    ref = gguf_dequantize(gguf_quantize(w, qtype), qtype).reshape(n, k)
    ours = quantize(torch.from_numpy(w), bits).dequantize_reference().numpy()
    assert np.array_equal(ours, ref)


@pytest.mark.parametrize(("n", "k"), SHAPES)
def test_int4_asym_quantizes_as_llama_cpp_q4_1(n: int, k: int) -> None:
    """--quantization int4-asym rounds exactly as llama.cpp's Q4_1 reference quantization (gguf's), and a
    weight already on a Q4_1 grid (a Q4_1 file dequantized) comes back unchanged."""
    w = _weights(n, k, seed=2)
    ref = gguf_dequantize(gguf_quantize(w, Q.Q4_1), Q.Q4_1).reshape(n, k)
    ours = quantize(torch.from_numpy(w), 4, asymmetric=True)
    assert ours.label == "int4-asym" and ours.offsets is not None
    assert np.array_equal(ours.dequantize_reference().numpy(), ref)
    again = quantize(torch.from_numpy(ref), 4, asymmetric=True).dequantize_reference().numpy()
    assert np.abs(again - ref).max() <= 1e-3 * np.abs(ref).max()  # the fp16 scale and min, re-rounded


@needs_kernels
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize(("bits", "asymmetric"), [(4, False), (8, False), (4, True)])
def test_the_c_quantizer_gives_the_reference_bytes(bits: int, asymmetric: bool, dtype: torch.dtype) -> None:
    """kernels/cpu_quantize.c against ``quantize_reference`` (the PyTorch ops, themselves checked against
    gguf's quantization above), byte for byte: K past the last block, zero blocks, magnitude ties, scales
    that are float16 subnormals or overflow, negative zeros."""
    from glassbox.quant.blocks.quantize import quantize_reference

    g = torch.Generator().manual_seed(bits + 2 * asymmetric)
    w = torch.randn(37, 300, generator=g) * torch.logspace(-9, 5, 37).unsqueeze(1)
    w[0, :64] = 0.0
    w[1, :32] = -0.0
    w[2, :32] = torch.tensor([0.5, -0.5] * 16)  # ties: the first extreme
    w[3, 5], w[3, 9] = -2.0, 2.0
    w = w.to(dtype)
    ours, ref = quantize(w, bits, asymmetric), quantize_reference(w, bits, asymmetric)
    assert ours.label == ref.label and ours.offset_factor == ref.offset_factor
    for name, t in ref.stored().items():
        assert torch.equal(ours.stored()[name].view(torch.uint8), t.view(torch.uint8)), name


def _int8_activation_reference(x: torch.Tensor, w: BlockWeights) -> tuple[torch.Tensor, torch.Tensor]:
    """The kernels' arithmetic in PyTorch: x in int8 blocks (round half away from zero), exact integer
    block products, then sum_b dx d ip + o cx; and the sum of its terms' magnitudes (Q4_1's offsets
    cancel much of the products, so float32 rounding scales with the terms, not the result)."""
    kp = w.padded
    xb = torch.nn.functional.pad(x.float(), (0, kp - x.shape[1])).view(x.shape[0], -1, BLOCK)
    dx = xb.abs().amax(-1) / 127.0
    scaled = xb * torch.where(dx > 0, 1.0 / dx, 0.0)[..., None]
    qx = torch.sign(scaled) * torch.floor(scaled.abs() + 0.5)
    cx = (dx * qx.sum(-1)).double()
    q = w.unpacked_codes().double().view(w.out_features, -1, BLOCK)
    ip = torch.einsum("mbj,nbj->mnb", qx.double(), q)  # exact
    main = dx[:, None, :].double() * w.scales[None].double() * ip  # (m, n, b)
    off = cx[:, None, :] * w.offset_values().double()[None]
    return (main + off).sum(-1).float(), (main.abs() + off.abs()).sum(-1).float()


def block_gemv_f32(w: BlockWeights, x: torch.Tensor, generic: bool = False) -> torch.Tensor:
    """gb_gemv_blocks (or its plain-C twin) with a float32 output."""
    lib = library()
    assert lib is not None
    m, kp = x.shape[0], w.padded
    qx = torch.empty(m, kp, dtype=torch.int8)
    dx = torch.empty(m, kp // BLOCK)
    cx = torch.empty(m, kp // BLOCK)
    xb = x.to(torch.bfloat16).contiguous()
    lib.gb_quantize_rows_q8(
        xb.data_ptr(), m, w.in_features, kp, qx.data_ptr(), dx.data_ptr(), cx.data_ptr(), 1, 2
    )
    out = torch.empty(m, w.out_features)
    fn = lib.gb_gemv_blocks_generic if generic else lib.gb_gemv_blocks
    fn(
        *w.pointers(), None, w.out_features, kp, w.kernel_bits,
        qx.data_ptr(), dx.data_ptr(), cx.data_ptr(), m, out.data_ptr(), w.out_features, 0, 2,
    )  # fmt: skip
    return out


@needs_kernels
@pytest.mark.parametrize("qtype", ["Q4_0", "Q4_1", "Q8_0"])
@pytest.mark.parametrize(("n", "k"), SHAPES)
@pytest.mark.parametrize("m", [1, 3, 16])
def test_gemv_matches_its_arithmetic(qtype: str, n: int, k: int, m: int) -> None:
    w = from_gguf(qtype, gguf_quantize(_weights(n, k, 2), Q[qtype]), (n, k))
    x = torch.randn(m, k, generator=torch.Generator().manual_seed(n * k + m)).bfloat16().float()
    ref, terms = _int8_activation_reference(x, w)
    for generic in (False, True):
        err = (block_gemv_f32(w, x, generic) - ref).abs()
        assert bool((err <= 1e-6 * terms + 1e-7).all()), (err / terms).max()
    # and the int8 activations cost little against the exact product with the same weights
    exact = x @ w.dequantize_reference().t()
    assert ((ref - exact).norm() / exact.norm()).item() < 0.02


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_linear_forward(dtype: torch.dtype) -> None:
    """Decode rows (bf16) run the GEMV, other rows and float32 the dequantized weight; bias added."""
    n, k = 24, 96
    w = from_gguf("Q4_1", gguf_quantize(_weights(n, k, 3), Q.Q4_1), (n, k))
    bias = torch.randn(n)
    lin = BlockQuantLinear(w, bias)
    for rows in (1, 5, 40):
        x = torch.randn(rows, k).to(dtype)
        exact = x.float() @ w.dequantize_reference().t() + bias
        y = lin(x)
        assert y.dtype == dtype and y.shape == (rows, n)
        tol = 1e-5 if dtype == torch.float32 else 0.03
        assert ((y.float() - exact).norm() / exact.norm()).item() < tol


@pytest.mark.skipif(library() is None, reason="no C compiler to build the kernels")
def test_lm_head_chooses_by_its_own_rows(monkeypatch: pytest.MonkeyPatch) -> None:
    """A packed LM head (mark_lm_head) runs the kernel for up to HEAD_KERNEL_ROWS rows even in a step with
    prompt rows (where other block linears multiply the dequantized weight), the GEMM past them; the
    engine marks the head and not its other block linears."""
    from glassbox.quant.blocks.prompt_gemm import int8_prompt_rows

    monkeypatch.setenv("GLASSBOX_BLOCK_PROMPTS", "dequant")  # prompt rows on the dequantized GEMM here
    int8_prompt_rows.cache_clear()
    n, k = 40, 64
    w = from_gguf("Q8_0", gguf_quantize(_weights(n, k, 5), Q.Q8_0), (n, k))
    body, head = BlockQuantLinear(w), BlockQuantLinear(w)
    model = torch.nn.Module()
    model.lm_head = head
    assert mark_lm_head(model) and head.head_rows == HEAD_KERNEL_ROWS and body.head_rows is None
    for rows in (1, HEAD_KERNEL_ROWS, HEAD_KERNEL_ROWS + 1):
        x = torch.randn(rows, k).bfloat16()
        with block_kernel_rows(True):
            kernel = body(x)
        with block_kernel_rows(False, prompt=True):
            gemm, ours = body(x), head(x)
        assert not torch.equal(kernel, gemm)  # the two paths differ in their bits (int8 activations)
        assert torch.equal(ours, kernel if rows <= HEAD_KERNEL_ROWS else gemm)
    llm = LLM("glassbox-demo", dtype="bfloat16", quantization="int8")  # its tied table packed once
    marked = [m for m in llm.engine.executor.model.modules() if getattr(m, "head_rows", None)]
    assert marked == [llm.engine.executor.model.lm_head]
    int8_prompt_rows.cache_clear()  # the choice read again from the environment after this test


def test_quantize_at_load_shares_a_tied_table() -> None:
    emb = torch.nn.Embedding(50, 64)
    head = torch.nn.Linear(64, 50, bias=False)
    head.weight = emb.weight
    model = torch.nn.ModuleDict({"emb": emb, "mid": torch.nn.Linear(64, 64), "head": head})
    assert quantize_at_load(model, FORMATS["q4_0"]) == 3
    assert isinstance(model["emb"], BlockQuantEmbedding) and isinstance(model["head"], BlockQuantLinear)
    assert model["emb"].w is model["head"].w  # one copy of the blocks
    assert not any(isinstance(m, torch.nn.Linear | torch.nn.Embedding) for m in model.modules())


def test_int4_asym_keeps_token_tables_in_8_bits() -> None:
    """int4-asym: linears in Q4_1-style blocks; the embedding and an untied LM head (named lm_head) in
    Q8_0-style blocks, as llama.cpp's Q4_1 files keep them."""
    model = torch.nn.Module()
    model.embed = torch.nn.Embedding(50, 64)
    model.mid = torch.nn.Linear(64, 64)
    model.lm_head = torch.nn.Linear(64, 50, bias=False)
    assert quantize_at_load(model, FORMATS["q4_1"]) == 3
    labels = {name: m.w.label for name, m in model.named_children()}
    assert labels == {"embed": "int8", "mid": "int4-asym", "lm_head": "int8"}


@pytest.mark.parametrize("arch", ["llama", "qwen3"])
@pytest.mark.parametrize("quantization", ["int8", "int4", "int4-asym"])
def test_quantized_logprobs_stay_close_to_full_precision(tmp_path, arch: str, quantization: str) -> None:  # type: ignore[no-untyped-def]
    """Through the engine (embedding and tied head quantized too). A random tiny model's next-token
    distribution is nearly flat, so greedy tokens may swap places; its logprobs may not move much."""
    d = build_tiny_model(arch, tmp_path)
    prompts = ["def fibonacci(n):", "import os\nimport sys\n", "你好，世界", "class Foo:\n    def"]
    params = SamplingParams(temperature=0, max_tokens=1, logprobs=5)
    full = LLM(str(d), dtype="float32").generate(prompts, params)
    q = LLM(str(d), dtype="float32", quantization=quantization)
    assert isinstance(q.engine.executor.model.lm_head, BlockQuantLinear)
    quant = q.generate(prompts, params)
    limit = 0.05 if quantization == "int8" else 0.6  # 4-bit blocks of random weights: ~0.4 nats seen
    for a, b in zip(full, quant, strict=True):
        assert a.logprobs is not None and b.logprobs is not None
        ref, got = a.logprobs[0], b.logprobs[0]
        for t in set(ref) & set(got):
            assert abs(ref[t] - got[t]) < limit
        assert max(got.values()) == pytest.approx(max(ref.values()), abs=limit)


@pytest.mark.parametrize("quantization", ["int8", "int4"])
def test_quantized_demo_model_keeps_its_greedy_output(quantization: str) -> None:
    """On a trained model (the demo), block weights leave greedy continuations close to bf16's."""
    prompts = [
        "def fibonacci(n):",
        "import os\nimport sys\n",
        "class Stack:\n    def push(self, item):\n",
        "    for i in range(len(items)):\n",
    ]
    params = SamplingParams(temperature=0, max_tokens=16, ignore_eos=True)
    ref = LLM("glassbox-demo", dtype="bfloat16").generate(prompts, params)
    quant = LLM("glassbox-demo", dtype="bfloat16", quantization=quantization).generate(prompts, params)
    same = sum(
        a == b for r, q in zip(ref, quant, strict=True) for a, b in zip(r.token_ids, q.token_ids, strict=True)
    )
    first = sum(r.token_ids[0] == q.token_ids[0] for r, q in zip(ref, quant, strict=True))
    # a 5.8M-parameter model in 4 bits loses more than a large one: measured 3 of 4 first tokens, 36 of 64
    assert first >= (len(prompts) if quantization == "int8" else len(prompts) - 1)
    assert same >= (0.75 if quantization == "int8" else 0.4) * 16 * len(prompts)
