"""Phi-3 / Phi-4-mini (Phi3ForCausalLM, GGUF phi3): a tiny random model with Phi-4-mini's kinds of settings
(LongRoPE, 3/4 of each head rotated, a sliding window, tied embeddings) token-exact with transformers in
float32 on both CPU paths, batched and chunked; LongRoPE's long factors where the engine's context passes the
pre-training length; GGUF files as llama.cpp's converter writes them, against transformers on the same
weights and, for a plain-rope model, transformers' own GGUF reader."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from gguf import GGMLQuantizationType as Q
from gguf_factory import write_phi3_model
from test_engine_parity import CPU_KERNELS, _check
from tiny_models import build_tiny_model, greedy_continuation, hf_greedy

from glassbox import LLM, SamplingParams
from glassbox.layers.rotary import inv_frequencies
from glassbox.models.config_reader import facts_from_config, facts_from_dir
from glassbox.models.fused_parts import fused_rows
from glassbox.models.gguf_reader import open_gguf
from glassbox.models.model_config import ModelConfig
from glassbox.perf.model_presets import load_model_facts
from glassbox.quant.blocks.linear import BlockQuantLinear
from glassbox.tokenizer.hf_tokenizer import Tokenizer

ORIGINAL = 64  # the tiny model's pre-training length (original_max_position_embeddings)


@pytest.fixture(scope="module")
def phi3(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, list[list[int]]]:
    d = build_tiny_model("phi3", tmp_path_factory.mktemp("phi3"))
    text = "import os\nimport sys\n\nclass Foo:\n    def __init__(self):\n        self.x = 1\n" * 8
    ids = Tokenizer.from_dir(d).encode(text)
    return d, [ids[:1], ids[:17], ids[:45], ids[:70], ids[:130]]


def test_facts_and_rope_match_transformers(phi3: tuple) -> None:
    import transformers as tf
    from transformers.modeling_rope_utils import ROPE_INIT_FUNCTIONS

    d = phi3[0]
    facts = facts_from_dir(d)
    hf = tf.AutoModelForCausalLM.from_pretrained(d, dtype=torch.float32)
    assert facts.total_params == sum(p.numel() for p in hf.parameters())
    assert facts.layer_windows == (40, 40) and facts.tie_word_embeddings
    for max_len, long in ((ORIGINAL, False), (ORIGINAL + 1, True)):
        cfg = ModelConfig.from_facts(facts, max_len)
        assert cfg.architecture == "Phi3ForCausalLM" and cfg.rope["use_long_factor"] is long
        inv, attn = inv_frequencies(cfg.head_dim, cfg.rope)
        want_inv, want_attn = ROPE_INIT_FUNCTIONS["longrope"](hf.config, seq_len=max_len)
        assert torch.equal(inv, want_inv) and attn == pytest.approx(want_attn, rel=1e-12)
    assert len(inv) == 6  # 3/4 of a 16-wide head rotated: 6 frequencies


@pytest.mark.parametrize("kernels", CPU_KERNELS)
def test_greedy_parity_short_factors(phi3: tuple, kernels: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """Within the pre-training length (transformers' short factors): batched and chunked, past the window."""
    monkeypatch.setenv("GLASSBOX_CPU_KERNELS", kernels)
    d, prompts = phi3
    short = prompts[:3]  # up to 45 + 12 tokens: under 64, past the window of 40
    llm = LLM(str(d), dtype="float32", max_num_seqs=2, max_model_len=ORIGINAL, max_num_batched_tokens=24)
    assert not llm.engine.model_config.rope["use_long_factor"]
    _check(llm, short, hf_greedy(d, short, 12))
    assert llm.engine.executor.attn_backend == kernels


def test_long_factors_past_the_pretraining_length(phi3: tuple) -> None:
    """A context longer than 64: the long factors from the first token (as vLLM and llama.cpp choose
    them), which transformers uses once a sequence passes 64; prompts past 64 then agree token for token,
    and a short prompt differs from transformers' short-factor run (the factors really are applied)."""
    d, prompts = phi3
    llm = LLM(str(d), dtype="float32", max_num_seqs=3, max_model_len=256)
    assert llm.engine.model_config.rope["use_long_factor"]
    _check(llm, prompts[3:], hf_greedy(d, prompts[3:], 12))
    params = SamplingParams(temperature=0, max_tokens=12, ignore_eos=True, logprobs=0)
    out = llm.generate([prompts[2]], params)[0]
    ((toks, lps),) = hf_greedy(d, [prompts[2]], 12)
    assert out.token_ids != toks or max(abs(out.logprobs[j][t] - lps[j]) for j, t in enumerate(toks)) > 1e-3


def test_gguf_file_as_llama_cpp_writes_it(phi3: tuple, tmp_path: Path) -> None:
    """F32: the fused tensors cut as read, LongRoPE from the factor tensors, the partial rotation from
    rope.dimension_count; token-exact with transformers on the checkpoint the file was written from."""
    d, prompts = phi3
    path = tmp_path / "phi3-f32.gguf"
    write_phi3_model(path, d, Q.F32)
    gguf = open_gguf(path)
    hf_cfg = json.loads((d / "config.json").read_text())
    rope = gguf.config["rope_scaling"]
    assert rope["short_factor"] == pytest.approx(hf_cfg["rope_parameters"]["short_factor"], rel=1e-6)
    assert gguf.config["partial_rotary_factor"] == 0.75 and gguf.config["sliding_window"] == 40
    assert "model.layers.0.self_attn.k_proj.weight" in gguf.tensor_types
    llm = LLM(str(path), dtype="float32", max_num_seqs=3, max_model_len=ORIGINAL)
    _check(llm, prompts[:3], hf_greedy(d, prompts[:3], 12))


def test_q8_0_file_kept_in_blocks(phi3: tuple, tmp_path: Path) -> None:
    """Q8_0 in bf16: q/k/v and gate/up cut from the fused blocks and kept packed (the C kernels); each
    greedy pick a top choice of transformers in float32 on the file's dequantized weights."""
    import transformers as tf

    d, prompts = phi3
    path = tmp_path / "phi3-q8.gguf"
    write_phi3_model(path, d, Q.Q8_0)
    gguf = open_gguf(path)
    ref_model = tf.AutoModelForCausalLM.from_pretrained(d, dtype=torch.float32).eval()
    state = {}
    for name, values in gguf.tensors():  # the format's own dequantization (gguf.quants), fused again
        state[name] = torch.from_numpy(values)
    for layer in range(ref_model.config.num_hidden_layers):
        p = f"model.layers.{layer}."
        state[p + "self_attn.qkv_proj.weight"] = torch.cat(
            [state.pop(p + f"self_attn.{x}_proj.weight") for x in "qkv"]
        )
        state[p + "mlp.gate_up_proj.weight"] = torch.cat(
            [state.pop(p + f"mlp.{x}_proj.weight") for x in ("gate", "up")]
        )
    state["lm_head.weight"] = state["model.embed_tokens.weight"]
    ref_model.load_state_dict(state, strict=True)
    llm = LLM(str(path), dtype="bfloat16", max_num_seqs=2, max_model_len=ORIGINAL)
    layer0 = llm.engine.executor.model.model.layers[0]
    assert isinstance(layer0.self_attn.qkv_proj, BlockQuantLinear)
    assert isinstance(layer0.mlp.gate_up_proj, BlockQuantLinear)
    params = SamplingParams(temperature=0, max_tokens=6, ignore_eos=True, logprobs=0)
    for ids, out in zip(prompts[1:3], llm.generate(prompts[1:3], params), strict=True):
        with torch.no_grad():
            logits = ref_model(torch.tensor([ids + out.token_ids])).logits[0].float()
        ref = torch.log_softmax(logits, -1)[len(ids) - 1 : -1]
        for j, t in enumerate(out.token_ids):
            assert ref[j, t] >= ref[j].max() - 0.15, f"token {j}: bf16 pick is not a top choice"


def test_plain_rope_file_against_transformers_gguf_reader(tmp_path: Path) -> None:
    """transformers' own GGUF reader (which reads neither the rope factors nor a partial rotation) on a
    Phi-3 with default rope, in Q8_0: token-exact in float32."""
    import transformers as tf

    d = build_tiny_model(
        "phi3", tmp_path, seed=1, rope_scaling=None, partial_rotary_factor=1.0, sliding_window=None
    )
    path = tmp_path / "plain.gguf"
    write_phi3_model(path, d, Q.Q8_0)
    ref = tf.AutoModelForCausalLM.from_pretrained(
        path.parent, gguf_file=path.name, dtype=torch.float32
    ).eval()
    llm = LLM(str(path), dtype="float32", max_num_seqs=2)
    prompts = [[5, 9, 33, 2, 7, 100, 41], list(range(3, 60))]
    params = SamplingParams(temperature=0, max_tokens=10, ignore_eos=True, logprobs=0)
    for ids, out in zip(prompts, llm.generate(prompts, params), strict=True):
        toks, lps = greedy_continuation(ref, ids, 10)
        assert out.token_ids == toks
        assert [s[t] for s, t in zip(out.logprobs or [], toks, strict=True)] == pytest.approx(lps, abs=1e-4)


def test_fused_rows_cut_and_refusals() -> None:
    cfg = {"model_type": "phi3", "hidden_size": 64, "num_attention_heads": 4, "num_key_value_heads": 2,
           "intermediate_size": 96}  # fmt: skip
    assert fused_rows("model.layers.3.self_attn.qkv_proj.weight", cfg) == [
        ("model.layers.3.self_attn.q_proj.weight", 0, 64),
        ("model.layers.3.self_attn.k_proj.weight", 64, 96),
        ("model.layers.3.self_attn.v_proj.weight", 96, 128),
    ]
    assert fused_rows("model.layers.0.mlp.gate_up_proj.weight", cfg) == [
        ("model.layers.0.mlp.gate_proj.weight", 0, 96),
        ("model.layers.0.mlp.up_proj.weight", 96, 192),
    ]
    assert fused_rows("model.layers.0.mlp.down_proj.weight", cfg) is None
    assert fused_rows("model.layers.0.mlp.gate_up_proj.weight", {**cfg, "model_type": "llama"}) is None


def test_phi4_mini_preset() -> None:
    """Phi-4-mini-instruct (3.8B) as published: tied embeddings, 3/4 of each 128-wide head rotated."""
    facts = load_model_facts("phi-4-mini")
    assert facts.architecture == "Phi3ForCausalLM" and facts.tie_word_embeddings
    assert 3.83e9 < facts.total_params < 3.84e9
    cfg = ModelConfig.from_facts(facts, 8192)
    assert cfg.head_dim == 128 and cfg.rope["partial_rotary_factor"] == 0.75
    assert inv_frequencies(cfg.head_dim, cfg.rope)[0].numel() == 48


def test_tensor_parallel_cuts_each_fused_part(phi3: tuple, tmp_path: Path) -> None:
    """TP=2: each rank reads its heads of q, k and v and its rows of gate and up out of the fused tensors,
    from safetensors (token-exact with transformers) and from a Q8_0 GGUF kept in blocks (as TP=1)."""
    from test_tensor_parallel import _check as tp_check

    from glassbox.engine import tp_runtime

    d, prompts = phi3
    greedy = SamplingParams(temperature=0, max_tokens=8, ignore_eos=True, logprobs=1)
    path = tmp_path / "phi3-q8.gguf"
    write_phi3_model(path, d, Q.Q8_0)
    one = LLM(str(path), dtype="float32", max_model_len=ORIGINAL).generate(prompts[1:3], greedy)
    try:
        llm = LLM(str(d), dtype="float32", tensor_parallel_size=2, max_num_seqs=2, max_model_len=ORIGINAL)
        tp_check(llm.generate(prompts[1:3], greedy), hf_greedy(d, prompts[1:3], 8), 1e-4)
        tp_runtime.shutdown()
        two = LLM(str(path), dtype="float32", tensor_parallel_size=2, max_num_seqs=2, max_model_len=ORIGINAL)
        ref = [(o.token_ids, [s[t] for s, t in zip(o.logprobs or [], o.token_ids, strict=True)]) for o in one]
        tp_check(two.generate(prompts[1:3], greedy), ref, 1e-4)
        assert two.engine.executor.block_formats == ["Q8_0"]
    finally:
        tp_runtime.shutdown()


def test_quantized_checkpoints_refused(phi3: tuple) -> None:
    raw = json.loads((phi3[0] / "config.json").read_text())
    raw["quantization_config"] = {"quant_method": "gptq", "bits": 4, "group_size": 128}
    with pytest.raises(ValueError, match="gptq-quantized phi3 checkpoints are not read yet"):
        ModelConfig.from_facts(facts_from_config(raw))
