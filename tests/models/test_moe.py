"""Mixture-of-experts models (Mixtral, Qwen2-MoE, Qwen3-MoE): token-exact with transformers under every
scheduling regime, and the routed block (models/moe.py) against transformers' own block at its edges."""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Any

import pytest
import torch
from test_engine_parity import CPU_KERNELS, _check, _hf_logprobs, reference_runs
from tiny_models import MOE_ARCHS, build_tiny_model, hf_greedy

from glassbox import LLM, SamplingParams
from glassbox.models.config_reader import facts_from_config, facts_from_dir
from glassbox.models.llama import LlamaMLP
from glassbox.models.loader import build_model
from glassbox.models.model_config import ModelConfig
from glassbox.models.moe import MoEExperts, SparseMoeBlock, route
from glassbox.models.safetensors_files import safetensors_tensors
from glassbox.quant.dense.onednn import packing_available


@pytest.fixture(scope="module")
def models(tmp_path_factory: pytest.TempPathFactory) -> dict[str, tuple[Path, list[list[int]], list]]:
    return reference_runs(tmp_path_factory.mktemp("moe"), MOE_ARCHS)


# ---- the model description -------------------------------------------------------------------------


def test_facts_match_what_transformers_builds(models: dict) -> None:
    """Parameter counts, which layers are routed (decoder_sparse_step, mlp_only_layers), the routing rule."""
    import transformers as tf

    for arch in MOE_ARCHS:
        d = models[arch][0]
        hf = tf.AutoModelForCausalLM.from_pretrained(d, dtype=torch.float32)
        facts = facts_from_dir(d)
        assert facts.total_params == sum(p.numel() for p in hf.parameters()), arch
        routed = tuple(hasattr(layer.mlp, "experts") for layer in hf.model.layers)
        assert facts.layer_moe == routed and facts.moe_layers == sum(routed)
        assert facts.norm_topk_prob == {"mixtral": True, "qwen2_moe": False, "qwen3_moe": True}[arch]
        assert facts.shared_expert_gated == (arch == "qwen2_moe")
        assert 0 < facts.active_params < facts.total_params
    assert facts_from_dir(models["qwen2_moe"][0]).layer_moe == (True, False, True)  # mlp_only_layers [1]
    assert facts_from_dir(models["qwen3_moe"][0]).layer_moe == (False, True, False, True)  # sparse step 2


def test_norm_topk_prob_defaults() -> None:
    """A hub config without norm_topk_prob: Qwen2/3-MoE do not renormalize, Mixtral always does."""
    base = dict(hidden_size=64, num_hidden_layers=2, num_attention_heads=4, vocab_size=100,
                intermediate_size=32, num_experts_per_tok=2)  # fmt: skip
    assert not facts_from_config({**base, "model_type": "qwen3_moe", "num_experts": 8}).norm_topk_prob
    assert facts_from_config({**base, "model_type": "mixtral", "num_local_experts": 8}).norm_topk_prob
    dense = facts_from_config({**base, "model_type": "qwen3"})
    assert not dense.is_moe and dense.layer_moe == ()


def test_quantized_moe_checkpoints_are_refused() -> None:
    """Experts of a format with no reader (bitsandbytes) are refused at start, not as missing weights (GGUF,
    FP8, GPTQ/AWQ and compressed-tensors experts load: tests/models/test_gguf_moe.py, test_fp8_experts.py,
    test_int_experts.py)."""
    base = dict(hidden_size=64, num_hidden_layers=2, num_attention_heads=4, vocab_size=100,
                intermediate_size=32, num_experts_per_tok=2, num_experts=8, model_type="qwen3_moe",
                architectures=["Qwen3MoeForCausalLM"])  # fmt: skip
    ModelConfig.from_facts(facts_from_config(base))
    gptq = {**base, "quantization_config": {"quant_method": "gptq", "bits": 4, "group_size": 128}}
    ModelConfig.from_facts(facts_from_config(gptq))
    bnb = {**base, "quantization_config": {"quant_method": "bitsandbytes", "load_in_4bit": True}}
    with pytest.raises(ValueError, match=r"quantized \(bitsandbytes\) mixture-of-experts"):
        ModelConfig.from_facts(facts_from_config(bnb))


def test_fused_and_per_expert_checkpoints_load_alike(models: dict) -> None:
    """save_pretrained writes one tensor per expert (Mixtral: block_sparse_moe.experts.N.w1/w3/w2); a
    checkpoint in transformers 5's in-memory layout holds experts.gate_up_proj / experts.down_proj."""
    import transformers as tf

    for arch in MOE_ARCHS:
        d = models[arch][0]
        cfg = ModelConfig.from_facts(facts_from_dir(d))
        per_expert = build_model(cfg, safetensors_tensors(d), torch.float32, torch.device("cpu"))
        hf = tf.AutoModelForCausalLM.from_pretrained(d, dtype=torch.float32)
        fused_names = list(hf.state_dict().items())
        assert any(n.endswith("experts.gate_up_proj") for n, _ in fused_names)
        fused = build_model(cfg, fused_names, torch.float32, torch.device("cpu"))
        a, b = per_expert.state_dict(), fused.state_dict()
        assert a.keys() == b.keys()
        for name in a:
            assert torch.equal(a[name], b[name]), name


def test_missing_expert_is_named(models: dict) -> None:
    d = models["mixtral"][0]
    cfg = ModelConfig.from_facts(facts_from_dir(d))
    weights = [(n, t) for n, t in safetensors_tensors(d) if "experts.5.w3" not in n]
    with pytest.raises(ValueError, match=r"weights missing .*experts\.gate_up_proj"):
        build_model(cfg, weights, torch.float32, torch.device("cpu"))


# ---- the engine against transformers ----------------------------------------------------------------


@pytest.mark.parametrize("kernels", CPU_KERNELS)
@pytest.mark.parametrize("arch", MOE_ARCHS)
def test_greedy_parity_batched(
    models: dict, arch: str, kernels: str, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    """Ten prompts (1..300 tokens) through 3 sequence slots, on the C kernels and on the PyTorch ops: the
    MoE block runs inside the native forward, with no fallback."""
    monkeypatch.setenv("GLASSBOX_CPU_KERNELS", kernels)
    d, prompts, ref = models[arch]
    with caplog.at_level(logging.WARNING, logger="glassbox.engine.torch_executor"):
        llm = LLM(str(d), dtype="float32", max_num_seqs=3)
        _check(llm, prompts, ref)
    assert llm.engine.executor.attn_backend == kernels
    assert not [r for r in caplog.records if "CPU kernels cannot run this model" in r.getMessage()]


@pytest.mark.parametrize("arch", MOE_ARCHS)
def test_parity_chunked_prefill(models: dict, arch: str) -> None:
    d, prompts, ref = models[arch]
    llm = LLM(str(d), dtype="float32", max_num_seqs=5, max_num_batched_tokens=37)
    _check(llm, prompts, ref)
    assert any(r.phase == "mixed" for r in llm.engine.step_records), "chunks never shared a step with decodes"


@pytest.mark.parametrize("arch", MOE_ARCHS)
def test_parity_under_preemption(models: dict, arch: str) -> None:
    d, prompts, ref = models[arch]
    llm = LLM(str(d), dtype="float32", max_num_seqs=4, num_kv_blocks=24)  # the longest fits alone only
    _check(llm, prompts, ref)
    assert llm.engine.scheduler.num_preemptions > 0


@pytest.mark.parametrize("arch", MOE_ARCHS)
def test_parity_prefix_caching(models: dict, arch: str) -> None:
    d, prompts, ref = models[arch]
    llm = LLM(str(d), dtype="float32", max_num_seqs=4, enable_prefix_caching=True)
    _check(llm, prompts, ref)
    _check(llm, prompts, ref)  # the second round finds the prompts cached
    assert llm.engine.block_manager.stats.hits > 0


@pytest.mark.parametrize("arch", MOE_ARCHS)
def test_bfloat16_stays_close_to_float32_reference(models: dict, arch: str) -> None:
    """bf16 on the C kernels (bf16 expert GEMMs, the router in bf16 as in the checkpoint's dtype): each
    greedy pick is a top choice of transformers in float32, its logprob within bf16 rounding."""
    d, prompts, _ = models[arch]
    llm = LLM(str(d), dtype="bfloat16", max_num_seqs=4)
    experts = [m for m in llm.engine.executor.model.modules() if isinstance(m, MoEExperts)]
    assert experts and all(bool(m.linears) == packing_available(torch.bfloat16) for m in experts)
    outs = llm.generate(prompts[:6], SamplingParams(temperature=0, max_tokens=8, ignore_eos=True, logprobs=0))
    for prompt, out in zip(prompts[:6], outs, strict=True):
        ref = _hf_logprobs(d, prompt + out.token_ids, len(prompt))
        assert out.logprobs is not None
        for j, t in enumerate(out.token_ids):
            assert ref[j, t] >= ref[j].max() - 0.15, f"token {j}: bf16 pick is not a top choice"
            assert abs(out.logprobs[j][t] - float(ref[j, t])) < 0.15
    llm.engine.check_integrity()


# ---- the routed block at its edges, against transformers' block -------------------------------------


def _blocks(arch: str, seed: int = 0) -> tuple[Any, SparseMoeBlock]:
    """transformers' sparse MoE block of the tiny config and glassbox's with the same weights."""
    import transformers as tf

    torch.manual_seed(seed)
    hf_cfg = {
        "mixtral": tf.MixtralConfig(hidden_size=64, intermediate_size=32, num_local_experts=8),
        "qwen2_moe": tf.Qwen2MoeConfig(
            hidden_size=64, moe_intermediate_size=32, shared_expert_intermediate_size=48, num_experts=8
        ),
        "qwen3_moe": tf.Qwen3MoeConfig(hidden_size=64, moe_intermediate_size=32, num_experts=8),
    }[arch]
    hf_cfg.num_experts_per_tok = 2
    hf_cfg.norm_topk_prob = arch != "qwen2_moe"
    cls = {
        "mixtral": tf.models.mixtral.modeling_mixtral.MixtralSparseMoeBlock,
        "qwen2_moe": tf.models.qwen2_moe.modeling_qwen2_moe.Qwen2MoeSparseMoeBlock,
        "qwen3_moe": tf.models.qwen3_moe.modeling_qwen3_moe.Qwen3MoeSparseMoeBlock,
    }[arch]
    hf_block = cls(hf_cfg).float().eval()
    with torch.no_grad():
        for p in hf_block.parameters():
            p.normal_(0.0, 0.1)
    arch_name = {"mixtral": "MixtralForCausalLM", "qwen2_moe": "Qwen2MoeForCausalLM"}
    raw = {
        **hf_cfg.to_dict(),
        "num_hidden_layers": 1,
        "architectures": [arch_name.get(arch, "Qwen3MoeForCausalLM")],
    }
    cfg = ModelConfig.from_facts(facts_from_config(raw))
    shared = cfg.shared_expert_intermediate_size
    block = SparseMoeBlock(
        64, 8, 2, 32, "silu", cfg.norm_topk_prob, LlamaMLP(cfg, shared) if shared else None,
        cfg.shared_expert_gated,
    )  # fmt: skip
    block.load_state_dict(hf_block.state_dict())
    return hf_block, block.eval()


def _all_paths(block: SparseMoeBlock, x: torch.Tensor) -> list[torch.Tensor]:
    w, ids = block.routing(x)
    ex = block.experts
    return [ex.grouped(x, ids, w), ex.dense(x, ids, w), ex.reference(x, ids, w)]


@pytest.mark.parametrize("arch", MOE_ARCHS)
def test_block_matches_transformers(arch: str) -> None:
    hf_block, block = _blocks(arch)
    x = torch.randn(37, 64)
    with torch.no_grad():
        want = hf_block(x[None])[0]
        assert torch.allclose(block(x), want, atol=1e-6, rtol=1e-5)
        grouped, dense, ref = _all_paths(block, x)
        assert torch.allclose(grouped, dense, atol=1e-6) and torch.allclose(grouped, ref, atol=1e-6)


@pytest.mark.parametrize("arch", MOE_ARCHS)
def test_unchosen_experts_are_not_read(arch: str) -> None:
    """Expert 7 scores far below the rest for every row, and in a one-row step only k experts run: the
    others' weights set to NaN leave the output finite (and equal to transformers')."""
    hf_block, block = _blocks(arch)
    x = torch.rand(9, 64) + 0.1  # positive rows: a negative router row ranks last everywhere
    with torch.no_grad():
        for b in (hf_block, block):
            b.gate.weight[7] = -1.0
        _, ids = block.routing(x)
        assert 7 not in ids
        want = hf_block(x[None])[0]
        block.experts.gate_up_proj[7] = float("nan")
        block.experts.down_proj[7] = float("nan")
        assert torch.allclose(block(x), want, atol=1e-6, rtol=1e-5)

        one = x[:1]
        _, ids = block.routing(one)
        want = hf_block(one[None])[0]
        for e in set(range(8)) - set(ids[0].tolist()):
            block.experts.gate_up_proj[e] = float("nan")
        assert torch.allclose(block(one), want, atol=1e-6, rtol=1e-5)


@pytest.mark.parametrize("arch", MOE_ARCHS)
def test_one_expert_chosen_by_every_row(arch: str) -> None:
    hf_block, block = _blocks(arch)
    x = torch.rand(23, 64) + 0.1
    with torch.no_grad():
        for b in (hf_block, block):
            b.gate.weight[3] = 1.0
        _, ids = block.routing(x)
        assert (ids[:, 0] == 3).all()
        assert torch.allclose(block(x), hf_block(x[None])[0], atol=1e-6, rtol=1e-5)
        grouped, dense, ref = _all_paths(block, x)
        assert torch.allclose(grouped, dense, atol=1e-6) and torch.allclose(grouped, ref, atol=1e-6)


@pytest.mark.parametrize("arch", MOE_ARCHS)
def test_tied_router_scores_pick_as_torch_topk(arch: str) -> None:
    """A zero router: every expert scores the same. The picks are torch.topk's (as transformers'), the
    weights 1/k renormalized or 1/E not."""
    hf_block, block = _blocks(arch)
    x = torch.randn(5, 64)
    with torch.no_grad():
        for b in (hf_block, block):
            b.gate.weight.zero_()
        w, ids = block.routing(x)
        probs = torch.full((5, 8), 1 / 8)
        assert torch.equal(ids, torch.topk(probs, 2, dim=-1).indices)
        assert torch.allclose(w, torch.full((5, 2), 0.5 if block.renormalize else 1 / 8))
        assert torch.allclose(block(x), hf_block(x[None])[0], atol=1e-6, rtol=1e-5)
    w2, ids2 = route(torch.zeros(5, 8), 2, True)
    assert torch.equal(ids2, ids) and torch.equal(w2, torch.full((5, 2), 0.5))


def test_bfloat16_grouped_matches_reference() -> None:
    _, block = _blocks("qwen2_moe")
    block = block.to(torch.bfloat16)
    x = torch.randn(17, 64, dtype=torch.bfloat16)
    with torch.no_grad():
        grouped, dense, ref = _all_paths(block, x)
    assert torch.allclose(grouped.float(), ref.float(), atol=2e-2)
    assert torch.allclose(grouped.float(), dense.float(), atol=2e-2)
    if packing_available(torch.bfloat16):  # each expert's matrices in oneDNN's layout (the CPU bf16 engine)
        w, ids = block.routing(x)
        assert block.experts.pack_weights() == 16 and block.experts.gate_up_proj.numel() == 0
        with torch.no_grad():
            assert torch.allclose(block.experts(x, ids, w).float(), ref.float(), atol=2e-2)


# ---- the planner and trace ---------------------------------------------------------------------------


def test_plan_and_trace_on_a_moe_dir(models: dict, tmp_path: Path) -> None:
    """`glassbox plan DIR` costs the MoE shape from ModelFacts (k of E experts active); `trace` runs a
    request through the engine and holds it against the planner's roofline (bytes approximate)."""
    import json
    import os
    import subprocess
    import sys

    from glassbox.trace import run_trace

    d = models["qwen3_moe"][0]
    r = subprocess.run(
        [sys.executable, "-m", "glassbox.cli", "plan", str(d), "--hardware", "h100-sxm", "--json"],
        capture_output=True,
        text=True,
        timeout=120,
        env=dict(os.environ, GLASSBOX_CACHE_DIR=str(tmp_path)),
    )
    assert r.returncode == 0, r.stderr
    plan = json.loads(r.stdout)["model"]
    assert plan["moe"] == {"experts": 8, "top_k": 2, "moe_layers": 2}
    assert plan["active_params"] < plan["total_params"]

    llm = LLM(str(d), dtype="float32")
    # the distinct experts each step's router logits pick, counted apart from the MoE module's own counter
    picked: list[int] = []
    gates = [m.gate for m in llm.engine.executor.model.modules() if isinstance(m, SparseMoeBlock)]
    for g in gates:
        g.register_forward_hook(
            lambda _m, _x, y: picked.append(int(torch.topk(y, 2, dim=-1).indices.unique().numel()))
        )
    out = run_trace(llm.engine, "def fibonacci(n):", 6, None)
    assert out["phases"]["decode"]["tokens"] == 5 and out["finish_reason"] == "length"
    moe = out["moe"]
    layers = len(gates)
    prefill_reads = sum(picked[:layers])  # the prompt's one step, then a decode step per token
    assert moe["layers"] == layers and moe["prefill"]["experts_read_per_layer"] == prefill_reads / layers
    assert moe["decode"]["experts_read_per_layer_per_token"] == 2.0  # batch 1: exactly its top-2
    assert sum(picked[layers:]) == 2 * layers * 5
    inter, hidden = 32, 64  # tiny_models' qwen3_moe: moe_intermediate_size, hidden_size
    assert moe["expert_bytes"] == 3 * inter * hidden * 4  # float32 gate, up and down
    assert moe["decode"]["expert_bytes_per_token"] == 2 * layers * moe["expert_bytes"]


@pytest.mark.parametrize("kernels", CPU_KERNELS)
def test_mixtral_sliding_window(tmp_path: Path, kernels: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """Mixtral slides every layer when its config sets sliding_window (as Mistral does)."""
    monkeypatch.setenv("GLASSBOX_CPU_KERNELS", kernels)
    d = build_tiny_model("mixtral", tmp_path, sliding_window=24)
    prompts = [list(range(3, 70)), list(range(200, 210))]
    ref = hf_greedy(d, prompts, 8)
    llm = LLM(str(d), dtype="float32", max_num_batched_tokens=32)
    assert llm.engine.model_config.layer_windows == (24, 24)
    outs = llm.generate(prompts, SamplingParams(temperature=0, max_tokens=8, ignore_eos=True))
    assert [o.token_ids for o in outs] == [toks for toks, _ in ref]
