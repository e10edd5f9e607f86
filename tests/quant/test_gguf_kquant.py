"""GGUF K-quants kept as stored (quant/blocks/kquant.py, kernels/cpu_kquant*.c): the dequantization equals the gguf
package's bit for bit, the int8-activation GEMV computes its arithmetic (checked in float64 PyTorch), a tiny
Llama in a Q4_K_M-like mix of Q4_K/Q5_K/Q6_K runs packed with transformers' greedy tokens (float32) and
through the one-call decode step as through the per-op forward (bf16), and a packed Gemma 3 table keeps its
scale."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import torch
from gguf import GGML_QUANT_SIZES
from gguf import GGMLQuantizationType as Q
from gguf.quants import dequantize as gguf_dequantize
from gguf_factory import Spec, random_blocks, write_model
from kquant_factory import quantize_k
from tiny_models import greedy_continuation

from glassbox import LLM, SamplingParams
from glassbox.engine.checkpoint import open_checkpoint
from glassbox.kernels.native import library
from glassbox.layers.attention import AttentionMetadata, PrefillSeq
from glassbox.models.causal_lm import CausalLM
from glassbox.models.llama_native import NativeForward
from glassbox.models.loader import build_model
from glassbox.models.model_config import ModelConfig
from glassbox.models.sources import resolve_model
from glassbox.quant.blocks.kquant import KQuantWeights, from_gguf
from glassbox.quant.blocks.linear import BlockQuantEmbedding, BlockQuantLinear, block_weights

needs_kernels = pytest.mark.skipif(library() is None, reason="no C compiler: the kernels are not built")
TYPES = [Q.Q4_K, Q.Q5_K, Q.Q6_K]
SHAPES = [(1, 256), (17, 512), (33, 768)]  # N not a multiple of 16 (tiles of 16 rows, then one by one)
BITS = {Q.Q4_K: 4.5, Q.Q5_K: 5.5, Q.Q6_K: 6.5625}  # the file's own


def _tensor(qtype: Q, n: int, k: int, kind: str) -> np.ndarray:
    """GGML blocks (n, row bytes): quantized random weights, or random bytes (every code and scale bit,
    negative Q6_K scales) with small float16 super-block scales."""
    rng = np.random.default_rng(n * k + int(qtype))
    if kind == "random":
        return random_blocks(qtype, n, k, rng)
    w = (rng.standard_normal((n, k)) * 0.05).astype(np.float32)
    if k > 256:  # an all-zero super-block (not in a weight of one super-block: its product would be 0)
        w[0, -256:] = 0.0
    return quantize_k(w, qtype)


@pytest.mark.parametrize("kind", ["quantized", "random"])
@pytest.mark.parametrize(("n", "k"), SHAPES)
@pytest.mark.parametrize("qtype", TYPES, ids=lambda t: t.name)
def test_dequantize_as_gguf_does(qtype: Q, n: int, k: int, kind: str) -> None:
    raw = _tensor(qtype, n, k, kind)
    ref = gguf_dequantize(raw, qtype).reshape(n, k)
    w = from_gguf(qtype.name, raw, (n, k))
    assert w.nbytes * 8 == BITS[qtype] * n * k
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


def _int8_activation_reference(x: torch.Tensor, w: KQuantWeights) -> tuple[torch.Tensor, torch.Tensor]:
    """The kernel's arithmetic in float64: x in int8 per 32 values (scale max|x| / 127, codes rounded half
    away from zero), exact integer sums per 16-value lane, then sum dx S ip + O cx; and the sum of the
    terms' magnitudes (the float32 rounding scales with them)."""
    m, k = x.shape
    xb = x.float().view(m, -1, 32)
    dx = xb.abs().amax(-1) / 127.0
    scaled = xb * torch.where(dx > 0, 1.0 / dx, 0.0)[..., None]
    qx = (torch.sign(scaled) * torch.floor(scaled.abs() + 0.5)).view(m, -1, 16).double()
    dx16 = dx.repeat_interleave(2, dim=-1).double()  # (m, K/16)
    cx = dx16 * qx.sum(-1)
    q, s, o = w.unpacked()  # W = S q + O per 16-value lane (q less 32 for Q6_K)
    ip = torch.einsum("mlj,nlj->mnl", qx, q.double().view(w.out_features, -1, 16))  # exact
    main = dx16[:, None] * s.double()[None] * ip
    off = cx[:, None] * o.double()[None]
    return (main + off).sum(-1).float(), (main.abs() + off.abs()).sum(-1).float()


def kquant_gemv(w: KQuantWeights, x: torch.Tensor, generic: bool) -> torch.Tensor:
    """gb_gemv_kquant (or its plain-C twin) with a float32 output."""
    lib = library()
    assert lib is not None
    m, k = x.shape
    qx = torch.empty(m, k, dtype=torch.int8)
    dx, cx = torch.empty(m, k // 32), torch.empty(m, k // 32)  # per 32-value block
    sx = torch.empty(m, k // 16, dtype=torch.int32)  # per 16-value lane
    xb = x.bfloat16().contiguous()
    lib.gb_quantize_rows_kq(
        xb.data_ptr(), m, k, qx.data_ptr(), dx.data_ptr(), cx.data_ptr(), sx.data_ptr(), 1, 1
    )
    out = torch.empty(m, w.out_features)
    lib.gb_gemv_kquant(
        w.codes.data_ptr(), w.meta.data_ptr(), w.kind, None, w.out_features, k,
        qx.data_ptr(), dx.data_ptr(), cx.data_ptr(), sx.data_ptr(), m, out.data_ptr(), w.out_features, 0, 1,
        int(generic),
    )  # fmt: skip
    return out


@needs_kernels
@pytest.mark.parametrize(("n", "k"), SHAPES + [(48, 1024)])
@pytest.mark.parametrize("qtype", TYPES, ids=lambda t: t.name)
def test_gemv_matches_its_arithmetic(qtype: Q, n: int, k: int) -> None:
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
    # and the int8 activations cost little against the exact product (over all 20 n outputs)
    error = (torch.cat(refs) - torch.cat(exact)).norm() / torch.cat(exact).norm()
    assert error.item() < 0.02


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_linear_forward(dtype: torch.dtype) -> None:
    """Decode rows (bf16) run the GEMV (the tiles of 16 rows and the rows past them), other rows and float32
    the dequantized weight; bias added."""
    n, k = 40, 512
    w = from_gguf("Q6_K", _tensor(Q.Q6_K, n, k, "quantized"), (n, k))
    bias = torch.randn(n)
    lin = BlockQuantLinear(w, bias)
    for rows in (1, 5, 40):
        x = torch.randn(rows, k).to(dtype)
        exact = x.float() @ w.dequantize_reference().t() + bias
        y = lin(x)
        assert y.dtype == dtype and y.shape == (rows, n)
        tol = 1e-5 if dtype == torch.float32 else 0.03
        assert ((y.float() - exact).norm() / exact.norm()).item() < tol


def test_rejects_rows_that_are_not_whole_super_blocks() -> None:
    with pytest.raises(ValueError, match="super-blocks of 256"):
        from_gguf("Q4_K", np.zeros((2, 144), np.uint8), (2, 128))
    with pytest.raises(ValueError, match="not a K-quant"):
        from_gguf("Q4_0", np.zeros((2, 18), np.uint8), (2, 32))


# ---- a tiny Llama in a Q4_K_M-like mix --------------------------------------------------------------------

# llama.cpp's Q4_K_M: Q4_K, with Q6_K for the output and (some layers') attn_v and ffn_down; Q5_K here too
MIX = {"v_proj": Q.Q6_K, "down_proj": Q.Q6_K, "lm_head": Q.Q6_K, "o_proj": Q.Q5_K}
PROMPTS = [[1, 5, 9, 13, 2], [7, 7, 30, 41, 12, 3, 60, 22, 18], [50, 1, 33]]
NEW = 8


@pytest.fixture(scope="module")
def model_file(tmp_path_factory: pytest.TempPathFactory) -> Path:
    path = tmp_path_factory.mktemp("kquant") / "tiny-q4_k_m.gguf"
    spec = Spec(hidden=256, ffn=512, layers=2, heads=4, kv_heads=2, vocab=64, qtype=Q.Q4_K, types=MIX)
    write_model(path, spec, seed=3)
    return path


@pytest.fixture(scope="module")
def reference(model_file: Path) -> list[tuple[list[int], list[float]]]:
    """transformers reading the file (dequantized by the gguf package), float32, greedy."""
    import transformers as tf

    model = tf.AutoModelForCausalLM.from_pretrained(
        model_file.parent, gguf_file=model_file.name, dtype=torch.float32
    )
    return [greedy_continuation(model, ids, NEW) for ids in PROMPTS]


def _greedy(model: CausalLM, cfg: ModelConfig, ids: list[int], n: int) -> tuple[list[int], list[float]]:
    """The model's greedy continuation, each step the whole sequence prefilled afresh (PyTorch ops)."""
    seq, toks, lps = list(ids), [], []
    with torch.inference_mode():
        for _ in range(n):
            t, blocks = len(seq), -(-len(seq) // 16)
            caches = [
                torch.zeros(2, blocks, 16, cfg.num_kv_heads, cfg.head_dim) for _ in range(cfg.num_layers)
            ]
            meta = AttentionMetadata(
                slot_mapping=torch.arange(t), prefills=[PrefillSeq(0, t, 0, torch.arange(blocks))]
            )
            hidden = model(torch.tensor(seq), torch.arange(t), caches, meta)
            logp = torch.log_softmax(model.compute_logits(hidden[-1:])[0].float(), -1)
            tok = int(logp.argmax())
            toks.append(tok)
            lps.append(float(logp[tok]))
            seq.append(tok)
    return toks, lps


def test_packed_float32_model_matches_transformers(model_file: Path, reference: list) -> None:
    """Every K-quant tensor packed (the embedding too), float32: the dequantization is exact, so greedy
    tokens equal transformers' on the gguf package's dequantized weights."""
    checkpoint = open_checkpoint(resolve_model(str(model_file)))
    floats, kept = checkpoint.weights(True, torch.device("cpu"), torch.float32)
    assert {p.label for p in kept.values()} == {"Q4_K", "Q5_K", "Q6_K"}
    assert len(kept) == 2 * 7 + 2  # every 2-D tensor: 7 per layer, the embedding and the output
    cfg = ModelConfig.from_facts(checkpoint.facts)
    model = build_model(cfg, floats, torch.float32, torch.device("cpu"), kept=kept)
    assert isinstance(model.get_submodule("model.embed_tokens"), BlockQuantEmbedding)
    assert not [m for m in model.modules() if isinstance(m, torch.nn.Linear | torch.nn.Embedding)]
    sizes = checkpoint.gguf.stored_sizes() if checkpoint.gguf else {}
    for name, w in kept.items():  # the layout's bytes against the file's
        elements, stored = sizes[name]
        assert w.nbytes == stored
        assert elements == w.out_features * w.in_features
    for ids, (toks, lps) in zip(PROMPTS, reference, strict=True):
        ours, our_lps = _greedy(model, cfg, ids, NEW)
        assert ours == toks
        assert our_lps == pytest.approx(lps, abs=1e-4)


@needs_kernels
def test_engine_serves_the_blocks_in_bf16(model_file: Path, reference: list) -> None:
    """The engine as served (bf16): K-quants kept kept, decode steps on the int8-activation kernel; the
    first token as transformers', logprobs close while the greedy paths agree."""
    llm = LLM(str(model_file), dtype="bfloat16", device="cpu", max_model_len=128)
    ex = llm.engine.executor
    assert ex.block_formats == ["Q4_K", "Q5_K", "Q6_K"]
    blocks = block_weights(ex.model)
    assert all(isinstance(w, KQuantWeights) for w in blocks)
    params = SamplingParams(temperature=0, max_tokens=NEW, ignore_eos=True, logprobs=1)
    outs = llm.generate(PROMPTS, params)
    ran = [m for m in ex.model.modules() if isinstance(m, BlockQuantLinear) and m._call is not None]
    assert ran, "no K-quant layer ran the GEMV kernel"
    for out, (toks, lps) in zip(outs, reference, strict=True):
        assert out.token_ids[0] == toks[0]
        assert out.logprobs is not None
        for j, t in enumerate(toks):
            if out.token_ids[: j + 1] != toks[: j + 1]:
                break
            assert abs(out.logprobs[j][t] - lps[j]) < 0.25


@needs_kernels
def test_one_call_step_equals_the_per_op_forward(model_file: Path) -> None:
    """The one-call decode step (kernels/cpu_step.c) takes K-quant linears, q/k/v of two types as their parts:
    the same kernels as the per-op forward, so the same bits."""
    llm = LLM(str(model_file), dtype="bfloat16", device="cpu", max_model_len=128)
    forward = llm.engine.executor.forward
    assert isinstance(forward, NativeForward) and forward.step is not None
    assert forward.step.layers[0].qkv_parts == 3  # q and k Q4_K, v Q6_K
    params = SamplingParams(temperature=0, max_tokens=NEW, ignore_eos=True, logprobs=2)

    def run() -> list[tuple[list[int], list[float]]]:
        outs = llm.generate(PROMPTS, params)
        return [
            (o.token_ids, [lp[t] for lp, t in zip(o.logprobs or [], o.token_ids, strict=True)]) for o in outs
        ]

    stepped = run()
    forward.step = None  # the per-op forward for every step
    assert stepped == run()


def test_stored_bits_per_weight() -> None:
    """The bytes kept are the file's own."""
    for qtype, bits in BITS.items():
        n, k = 3, 512
        w = from_gguf(qtype.name, _tensor(qtype, n, k, "random"), (n, k))
        assert w.nbytes == n * k // 256 * GGML_QUANT_SIZES[qtype][1]
        assert w.nbytes * 8 / (n * k) == bits


def test_gemma3_packed_embedding_keeps_its_scale(tmp_path: Path) -> None:
    """Gemma 3 scales its embedding rows by sqrt(hidden): a packed table (Q8_0 here, Q4_K linears) must too.
    The packed float32 model's logits against the same file dequantized by the gguf package."""
    spec = Spec(
        arch="gemma3", hidden=256, ffn=512, layers=2, heads=2, kv_heads=1, head_dim=256, vocab=64, tie=True,
        qtype=Q.Q4_K, types={"embed_tokens": Q.Q8_0}, meta={"attention.sliding_window": 4},
    )  # fmt: skip
    path = tmp_path / "gemma3-k.gguf"
    write_model(path, spec)
    checkpoint = open_checkpoint(resolve_model(str(path)))
    cfg = ModelConfig.from_facts(checkpoint.facts)
    cpu = torch.device("cpu")
    floats, kept = checkpoint.weights(True, cpu, torch.float32)
    assert {w.label for w in kept.values()} == {"Q4_K", "Q8_0"}
    ours = build_model(cfg, floats, torch.float32, cpu, kept=kept)
    dense = build_model(cfg, checkpoint.weights(False, cpu, torch.float32)[0], torch.float32, cpu)
    toks, lps = _greedy(ours, cfg, PROMPTS[1], 4)
    ref_toks, ref_lps = _greedy(dense, cfg, PROMPTS[1], 4)
    assert toks == ref_toks and lps == pytest.approx(ref_lps, abs=1e-5)
