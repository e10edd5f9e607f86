"""gpt-oss (GptOssForCausalLM): a tiny random model token-exact with transformers under every scheduling
regime, on the C kernels and on the PyTorch ops; attention sinks on every CPU attention path against a
plain softmax with one more logit; YaRN against transformers' own; the routed block against
transformers' GptOssMLP; an 8-bit KV cache with sinks near a 16-bit one."""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Any

import pytest
import torch
from test_cpu_prefill import _case
from test_engine_parity import CPU_KERNELS, _check, _hf_logprobs, reference_runs

from glassbox import LLM, SamplingParams
from glassbox.kernels import cpu_ops, cpu_prefill, native
from glassbox.layers import kv_quant
from glassbox.layers.attention import AttentionMetadata, PrefillSeq, paged_attention
from glassbox.layers.rotary import RotaryEmbedding, inv_frequencies
from glassbox.models.config_reader import facts_from_config, facts_from_dir
from glassbox.models.model_config import ModelConfig
from glassbox.models.moe import SparseMoeBlock
from glassbox.perf.model_presets import PRESETS

NATIVE = native.compiler() is not None
needs_cc = pytest.mark.skipif(not NATIVE, reason="no C compiler to build the kernels")


@pytest.fixture(scope="module")
def oss(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, list[list[int]], list]:
    return reference_runs(tmp_path_factory.mktemp("gpt_oss"), ["gpt_oss"])["gpt_oss"]


# ---- the model description ----------------------------------------------------------------------------


def test_facts_match_what_transformers_builds(oss: tuple) -> None:
    import transformers as tf

    d = oss[0]
    facts = facts_from_dir(d)
    hf = tf.AutoModelForCausalLM.from_pretrained(d, dtype=torch.float32)
    assert facts.total_params == sum(p.numel() for p in hf.parameters())
    assert facts.layer_windows == (16, None) and facts.attention_sinks
    cfg = ModelConfig.from_facts(facts)
    assert (cfg.moe_router, cfg.moe_bias, cfg.swiglu_limit, cfg.swiglu_alpha) == (
        "topk_softmax",
        True,
        1.0,
        1.702,
    )
    assert cfg.qkv_bias and cfg.o_bias and cfg.head_dim == 24 and cfg.layer_moe == (True, True)


def test_a_real_config_reads_its_yarn_and_experts() -> None:
    """gpt-oss-20b's config.json (the preset; bf16, without its MXFP4 quantization_config): YaRN as
    transformers' GptOssConfig reads it (theta 150000 where the config names none), biases, sinks."""
    import transformers as tf
    from transformers.modeling_rope_utils import ROPE_INIT_FUNCTIONS

    raw = {k: v for k, v in PRESETS["gpt-oss-20b"].items() if k != "quantization_config"}
    cfg = ModelConfig.from_facts(facts_from_config(raw))
    assert cfg.architecture == "GptOssForCausalLM" and cfg.attention_sinks
    assert (cfg.swiglu_limit, cfg.swiglu_alpha, cfg.moe_router) == (7.0, 1.702, "topk_softmax")
    assert cfg.layer_windows[:2] == (128, None) and cfg.experts_per_token == 4
    assert cfg.rope["original_max_position_embeddings"] == 4096 and cfg.rope["truncate"] is False
    inv, attn = inv_frequencies(cfg.head_dim, cfg.rope)
    want_inv, want_attn = ROPE_INIT_FUNCTIONS["yarn"](tf.GptOssConfig())  # the same settings by default
    assert torch.equal(inv, want_inv) and attn == want_attn
    no_theta = {k: v for k, v in raw.items() if k != "rope_theta"}
    assert facts_from_config(no_theta).rope["rope_theta"] == 150000.0


@pytest.mark.parametrize(
    "extra",
    [
        {"truncate": True},
        {"truncate": False, "beta_fast": 16.0, "beta_slow": 2.0},
        {"mscale": 0.707, "mscale_all_dim": 1.0},
        {"attention_factor": 1.25, "factor": 2.0},
        {"factor": 1.0},  # no scaling: attention factor 1
    ],
)
def test_yarn_matches_transformers(extra: dict[str, Any]) -> None:
    import transformers as tf
    from transformers.modeling_rope_utils import ROPE_INIT_FUNCTIONS

    rope = {
        "rope_type": "yarn",
        "rope_theta": 10000.0,
        "factor": 8.0,
        "original_max_position_embeddings": 512,
    }
    rope |= extra
    hf = tf.LlamaConfig(head_dim=40, hidden_size=160, num_attention_heads=4, max_position_embeddings=4096,
                        rope_parameters=dict(rope))  # fmt: skip
    want_inv, want_attn = ROPE_INIT_FUNCTIONS["yarn"](hf)
    inv, attn = inv_frequencies(40, rope)
    assert torch.equal(inv, want_inv) and attn == pytest.approx(want_attn, rel=1e-12)
    cos = RotaryEmbedding(40, 64, rope).cos  # the tables carry the attention factor
    assert torch.allclose(cos[0], torch.full((40,), attn))


# ---- the engine against transformers ----------------------------------------------------------------


@pytest.mark.parametrize("kernels", CPU_KERNELS)
def test_greedy_parity_batched(
    oss: tuple, kernels: str, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    """Ten prompts (1..300 tokens, most longer than the window of 16) through 3 sequence slots, on the C
    kernels (decode attention with sinks) and on the PyTorch ops, with no fallback."""
    monkeypatch.setenv("GLASSBOX_CPU_KERNELS", kernels)
    d, prompts, ref = oss
    with caplog.at_level(logging.WARNING, logger="glassbox.engine.torch_executor"):
        llm = LLM(str(d), dtype="float32", max_num_seqs=3)
        _check(llm, prompts, ref)
    assert llm.engine.executor.attn_backend == kernels
    assert not [r for r in caplog.records if "CPU kernels cannot run this model" in r.getMessage()]


def test_parity_chunked_prefill(oss: tuple) -> None:
    d, prompts, ref = oss
    llm = LLM(str(d), dtype="float32", max_num_seqs=5, max_num_batched_tokens=37)
    _check(llm, prompts, ref)
    assert any(r.phase == "mixed" for r in llm.engine.step_records), "chunks never shared a step with decodes"


def test_parity_prefix_caching(oss: tuple) -> None:
    d, prompts, ref = oss
    llm = LLM(str(d), dtype="float32", max_num_seqs=4, enable_prefix_caching=True)
    _check(llm, prompts, ref)
    _check(llm, prompts, ref)  # the second round finds the prompts cached
    assert llm.engine.block_manager.stats.hits > 0


def test_bfloat16_stays_close_to_float32_reference(oss: tuple) -> None:
    """bf16: packed expert GEMMs with their biases, the bf16 prefill softmax and decode kernel with sinks."""
    d, prompts, _ = oss
    llm = LLM(str(d), dtype="bfloat16", max_num_seqs=4)
    outs = llm.generate(prompts[:5], SamplingParams(temperature=0, max_tokens=6, ignore_eos=True, logprobs=0))
    for prompt, out in zip(prompts[:5], outs, strict=True):
        ref = _hf_logprobs(d, prompt + out.token_ids, len(prompt))
        assert out.logprobs is not None
        for j, t in enumerate(out.token_ids):
            assert ref[j, t] >= ref[j].max() - 0.15, f"token {j}: bf16 pick is not a top choice"
            assert abs(out.logprobs[j][t] - float(ref[j, t])) < 0.15


@pytest.mark.parametrize("kv", ["int8", "fp8"])
def test_8bit_cache_with_sinks_stays_near_transformers(
    oss: tuple, kv: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """An 8-bit cache on the C kernels and on the PyTorch ops: the first token as transformers', its
    logprob within the codes' error, and both backends alike."""
    d, prompts, ref = oss
    sp = SamplingParams(temperature=0, max_tokens=3, ignore_eos=True, logprobs=0)
    runs = []
    for kernels in CPU_KERNELS:
        monkeypatch.setenv("GLASSBOX_CPU_KERNELS", kernels)
        outs = LLM(str(d), dtype="float32", kv_cache_dtype=kv, max_num_seqs=4).generate(prompts[6:], sp)
        runs.append(
            [
                (o.token_ids, [lp[t] for lp, t in zip(o.logprobs or [], o.token_ids, strict=True)])
                for o in outs
            ]
        )
    for i, (toks, lps) in enumerate(runs[0]):
        want_toks, want_lps = ref[6 + i]
        assert toks[0] == want_toks[0] and abs(lps[0] - want_lps[0]) < 0.05
        for other in runs[1:]:
            assert abs(other[i][1][0] - lps[0]) < 2e-3


# ---- attention sinks on every CPU path --------------------------------------------------------------

HQ, HK, BS = 6, 2, 16
SINKS = torch.tensor([-1.0, 0.5, 3.0, 40.0, -40.0, 1.5])  # 40: above every score (the shift path)


def _reference(
    q: torch.Tensor, keys: torch.Tensor, values: torch.Tensor, scale: float, sinks: torch.Tensor
) -> torch.Tensor:
    """One query row (Hq, D) over its visible keys/values (L, Hk, D): a softmax over the scores and the
    head's sink logit, in float64, the sink's share dropped."""
    g = q.shape[0] // keys.shape[1]
    out = torch.empty(q.shape, dtype=torch.float64)
    for j in range(q.shape[0]):
        k, v = keys[:, j // g].double(), values[:, j // g].double()
        logits = torch.cat([k @ q[j].double() * scale, sinks[j : j + 1].double()])
        out[j] = torch.softmax(logits, 0)[:-1] @ v
    return out


def _decode_case(
    d: int, lens: list[int], seed: int
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    nb = sum((n + BS - 1) // BS for n in lens) + 3
    cache = torch.randn(2, nb, BS, HK, d, generator=g)
    width = max((n + BS - 1) // BS for n in lens)
    tables = torch.stack([torch.randperm(nb, generator=g)[:width] for _ in lens])
    qkv = torch.randn(len(lens), (HQ + 2 * HK) * d, generator=g) * 2
    return cache, tables, torch.tensor(lens), qkv


def _decode_reference(
    cache: torch.Tensor,
    tables: torch.Tensor,
    lens: torch.Tensor,
    q: torch.Tensor,
    window: int | None,
    sinks: torch.Tensor,
) -> torch.Tensor:
    d = q.shape[-1]
    out = []
    for i, n in enumerate(lens.tolist()):
        kv = cache[:, tables[i]].reshape(2, -1, HK, d)[:, :n]
        lo = max(0, n - window) if window else 0
        out.append(_reference(q[i], kv[0, lo:], kv[1, lo:], d**-0.5, sinks))
    return torch.stack(out)


@pytest.mark.parametrize("d", [20, 64])  # 64: the C kernel's bf16 copy for gpt-oss's head size
@pytest.mark.parametrize("window", [None, 7])
@pytest.mark.parametrize("lens", [[1, 5, 17, 40], [40]])  # one sequence: the C kernel splits it in parts
def test_decode_with_sinks_is_a_softmax_with_one_more_logit(
    d: int, window: int | None, lens: list[int]
) -> None:
    cache, tables, lens_t, qkv = _decode_case(d, lens, seed=len(lens) + (window or 0))
    q = qkv[:, : HQ * d].reshape(-1, HQ, d)
    want = _decode_reference(cache, tables, lens_t, q, window, SINKS)
    meta = AttentionMetadata(slot_mapping=torch.zeros(len(lens), dtype=torch.long), num_decode=len(lens),
                             decode_block_tables=tables, decode_context_lens=lens_t)  # fmt: skip
    got = paged_attention(q, q, q, cache, meta, d**-0.5, window, SINKS)
    torch.testing.assert_close(got.double(), want, rtol=1e-5, atol=1e-6)
    plain = paged_attention(q, q, q, cache, meta, d**-0.5, window)
    assert (plain - got).abs().max() > 0.1  # the sinks matter
    if not NATIVE:
        return
    rot = RotaryEmbedding(d, 4, {"rope_theta": 1e4, "rope_type": "default"})
    for dtype, tol in ((torch.float32, 1e-5), (torch.bfloat16, 3e-2)):
        ops = cpu_ops.PagedAttention(
            HQ, cache.to(dtype), rot.tables(dtype), None, None, 0.0, d**-0.5, window, SINKS
        )
        out = torch.empty(len(lens), HQ * d, dtype=dtype)
        ops.decode(qkv.to(dtype), tables, lens_t, out)
        torch.testing.assert_close(out.double().view(-1, HQ, d), want, rtol=tol, atol=tol)


def _prefill_reference(
    q: torch.Tensor, cache: torch.Tensor, prefills: list[PrefillSeq], window: int | None, sinks: torch.Tensor
) -> torch.Tensor:
    d = q.shape[-1]
    out = torch.empty(q.shape, dtype=torch.float64)
    for p in prefills:
        kv = cache[:, p.block_table].reshape(2, -1, HK, d)[:, : p.start + p.q_len].float()
        for i in range(p.q_len):
            pos = p.start + i
            lo = max(0, pos - window + 1) if window else 0
            keys, values = kv[0, lo : pos + 1], kv[1, lo : pos + 1]
            out[p.q_start + i] = _reference(q[p.q_start + i].float(), keys, values, d**-0.5, sinks)
    return out


@pytest.mark.parametrize("window", [None, 9])
def test_prefill_with_sinks_is_a_softmax_with_one_more_logit(
    window: int | None, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The PyTorch prefill (float32) and the bf16 tiled prefill (native softmax, several tiles) with sinks:
    a fresh prompt, one after a cached prefix, a one-token prompt."""
    d = 40
    q, k, v, cache, prefills = _case(HQ, HK, d, [(0, 45), (30, 20), (0, 1)], window, seed=7)
    sinks = SINKS * 4  # the scores here spread ~4x wider than in the decode case
    want = _prefill_reference(q, cache, prefills, window, sinks)
    paged = AttentionMetadata(slot_mapping=torch.zeros(1, dtype=torch.long), prefills=prefills)
    got = paged_attention(q.float(), k.float(), v.float(), cache.float(), paged, d**-0.5, window, sinks)
    torch.testing.assert_close(got.double(), want, rtol=1e-5, atol=1e-5)
    if not NATIVE:
        return
    monkeypatch.setattr(cpu_prefill, "SCORE_TILE_BYTES", 48 * 2 * HQ * 16)  # tiles of ~16 rows
    monkeypatch.setattr(cpu_prefill, "MIN_TILE", 8)
    bf16 = torch.full_like(q, float("nan"))
    cpu_prefill.prefill_attention_bf16(q, k, v, cache, prefills, d**-0.5, window, bf16, sinks)
    plain = torch.full_like(q, float("nan"))
    cpu_prefill.prefill_attention_bf16(q, k, v, cache, prefills, d**-0.5, window, plain)
    err = (bf16.double() - want).abs().max().item()
    # within the kernel's own bf16 error without sinks (measured: 0.029 with, 0.025 without, at values ~2)
    base = plain.double() - _prefill_reference(q, cache, prefills, window, torch.full((HQ,), -1e9))
    assert err < 1.5 * base.abs().max().item(), err
    assert (plain.double() - want).abs().max().item() > 10 * err  # without the sinks: far off


@needs_cc
@pytest.mark.parametrize(("kind", "bound"), [(torch.int8, 0.01), (torch.float8_e4m3fn, 0.04)])
def test_8bit_decode_with_sinks(kind: torch.dtype, bound: float) -> None:
    """The C decode over an 8-bit cache with sinks: equal to the PyTorch path over the same codes, and its
    RMS error against a float32 cache bounded as without sinks (tests/engine/test_kv_cache_8bit.py)."""
    d = 64
    cache, tables, lens, qkv = _decode_case(d, [3, 70, 200], seed=5)
    q = qkv[:, : HQ * d].reshape(-1, HQ, d)
    codes = kv_quant.quantize(cache, kind)
    meta = AttentionMetadata(slot_mapping=torch.zeros(3, dtype=torch.long), num_decode=3,
                             decode_block_tables=tables, decode_context_lens=lens)  # fmt: skip
    full = paged_attention(q, q, q, cache, meta, d**-0.5, None, SINKS)
    torch_8 = paged_attention(q, q, q, codes, meta, d**-0.5, None, SINKS)
    rot = RotaryEmbedding(d, 4, {"rope_theta": 1e4, "rope_type": "default"})
    out = torch.empty(3, HQ * d)
    cpu_ops.PagedAttention(
        HQ, codes, rot.tables(torch.float32), None, None, 0.0, d**-0.5, None, SINKS
    ).decode(qkv, tables, lens, out)
    torch.testing.assert_close(out.view(3, HQ, d), torch_8, rtol=1e-5, atol=1e-5)
    assert float((out.view(3, HQ, d) - full).pow(2).mean().sqrt()) < bound


# ---- the routed block against transformers' GptOssMLP -------------------------------------------------


def _blocks(limit: float = 1.5) -> tuple[Any, SparseMoeBlock]:
    import transformers as tf
    from transformers.models.gpt_oss.modeling_gpt_oss import GptOssMLP

    torch.manual_seed(0)
    hf_cfg = tf.GptOssConfig(hidden_size=64, intermediate_size=32, num_local_experts=8, num_experts_per_tok=2,
                             swiglu_limit=limit)  # fmt: skip
    hf = GptOssMLP(hf_cfg).float().eval()
    with torch.no_grad():
        for p in hf.parameters():
            p.normal_(0.0, 0.1)
    block = SparseMoeBlock(
        64, 8, 2, 32, "silu", False, router="topk_softmax", bias=True, swiglu=(1.702, limit)
    )
    with torch.no_grad():  # the checkpoint's transposed expert matrices (models/gpt_oss.py loads them so)
        block.gate.weight.copy_(hf.router.weight)
        block.gate.bias.copy_(hf.router.bias)
        ex, hx = block.experts, hf.experts
        ex.gate_up_proj.copy_(hx.gate_up_proj.transpose(1, 2))
        ex.down_proj.copy_(hx.down_proj.transpose(1, 2))
        ex.gate_up_proj_bias.copy_(hx.gate_up_proj_bias)  # type: ignore[union-attr]
        ex.down_proj_bias.copy_(hx.down_proj_bias)  # type: ignore[union-attr]
    return hf, block.eval()


def test_block_matches_transformers() -> None:
    hf, block = _blocks()
    x = torch.randn(37, 64) * 3
    with torch.no_grad():
        gate_up = torch.nn.functional.linear(
            x, block.experts.gate_up_proj[0], block.experts.gate_up_proj_bias[0]
        )  # type: ignore[index]
        assert (gate_up[:, ::2] > 1.5).any() and (gate_up[:, 1::2] < -1.5).any()  # both clamps bite
        want = hf(x[None])[0][0]
        torch.testing.assert_close(block(x), want, rtol=1e-5, atol=1e-5)
        w, ids = block.routing(x)
        for path in (block.experts.grouped, block.experts.dense, block.experts.reference):
            torch.testing.assert_close(path(x, ids, w), want, rtol=1e-5, atol=1e-5)
        # one row reads only its k experts: the others' weights as NaN leave it finite
        one = x[:1]
        _, ids = block.routing(one)
        for e in set(range(8)) - set(ids[0].tolist()):
            block.experts.gate_up_proj[e] = float("nan")
        torch.testing.assert_close(block(one), hf(one[None])[0][0], rtol=1e-5, atol=1e-5)


def test_bfloat16_packed_experts_keep_their_biases() -> None:
    from glassbox.quant.dense.onednn import packing_available

    _, block = _blocks()
    block = block.to(torch.bfloat16)
    x = torch.randn(9, 64, dtype=torch.bfloat16) * 3
    with torch.no_grad():
        w, ids = block.routing(x)
        ref = block.experts.reference(x, ids, w).float()
        if not packing_available(torch.bfloat16):
            pytest.skip("no oneDNN bf16 packing here")
        assert block.experts.pack_weights() == 16
        torch.testing.assert_close(block.experts(x, ids, w).float(), ref, rtol=0, atol=3e-2)
