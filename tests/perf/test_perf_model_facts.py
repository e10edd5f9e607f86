"""Model facts vs published parameter counts and hand-computed shapes."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from glassbox.models.config_reader import facts_from_config
from glassbox.models.facts import sliding_keys
from glassbox.perf.model_presets import PRESETS, load_model_facts

# Published totals (model cards / safetensors headers), in parameters.
PUBLISHED_TOTAL = {
    "llama-3.1-8b": 8_030_261_248,
    "llama-3.3-70b": 70_553_706_496,
    "gpt-oss-20b": 20.91e9,
    "gpt-oss-120b": 116.83e9,
    "mixtral-8x7b": 46_702_792_704,
    "qwen3-30b-a3b": 30.5e9,
    "qwen2.5-coder-7b": 7.61e9,
    "gemma-3-27b": 27.0e9,  # 27.4B with the 0.4B vision tower, which is not counted here
    # 123,611,033,088 in the BF16 checkpoint minus the 2,942,324,736-parameter MTP layer
    "nemotron-3-super-120b-a12b": 123_611_033_088 - 2_942_324_736,
}


@pytest.mark.parametrize("name", sorted(PUBLISHED_TOTAL))
def test_total_params_match_published(name: str) -> None:
    assert load_model_facts(name).total_params == pytest.approx(PUBLISHED_TOTAL[name], rel=0.005)


def test_active_params_match_published() -> None:
    # gpt-oss model card: 3.61B / 5.13B active (unembedding counted, embedding not).
    assert load_model_facts("gpt-oss-20b").active_params == pytest.approx(3.61e9, rel=0.005)
    assert load_model_facts("gpt-oss-120b").active_params == pytest.approx(5.13e9, rel=0.005)
    # Mixtral 12.9B and Qwen3-30B-A3B 3.3B are quoted with the embedding table included.
    mixtral = load_model_facts("mixtral-8x7b")
    assert mixtral.active_params + mixtral.params["embed"] == pytest.approx(12.9e9, rel=0.01)
    qwen = load_model_facts("qwen3-30b-a3b")
    assert qwen.active_params + qwen.params["embed"] == pytest.approx(3.3e9, rel=0.02)
    # Nemotron 3 Super "A12B".
    assert load_model_facts("nemotron-3-super-120b-a12b").active_params == pytest.approx(12e9, rel=0.03)
    # Qwen3-0.6B model card: 0.44B non-embedding parameters (tied embeddings).
    small = load_model_facts("qwen3-0.6b")
    assert small.total_params - small.params["embed"] == pytest.approx(0.44e9, rel=0.01)
    dense = load_model_facts("llama-3.1-8b")
    assert dense.active_params == dense.total_params - dense.params["embed"]


def test_llama_8b_hand_count() -> None:
    f = load_model_facts("llama-3.1-8b")
    attn = 32 * (4096 * 4096 * 2 + 4096 * 1024 * 2)
    mlp = 32 * 3 * 4096 * 14336
    assert f.params["attention"] == attn
    assert f.params["mlp"] == mlp
    assert f.params["embed"] == f.params["lm_head"] == 128256 * 4096


def test_kv_bytes_per_token_hand_computed() -> None:
    # layers x 2 (K and V) x kv_heads x head_dim x 2 bytes
    assert load_model_facts("llama-3.3-70b").kv_bytes_per_token() == 80 * 2 * 8 * 128 * 2
    assert load_model_facts("qwen2.5-coder-7b").kv_bytes_per_token(1.0) == 28 * 2 * 4 * 128
    # Nemotron: only the 8 attention layers hold KV (2 KV heads).
    assert load_model_facts("nemotron-3-super-120b-a12b").kv_bytes_per_token() == 8 * 2 * 2 * 128 * 2


def test_layer_patterns() -> None:
    oss = load_model_facts("gpt-oss-20b")
    assert oss.kv_layers == (12, 12) and oss.sliding_window == 128
    assert oss.layer_mixers[:2] == ("sliding", "full")  # even layers slide
    gemma = load_model_facts("gemma-3-27b")
    assert gemma.kv_layers == (10, 52) and gemma.sliding_window == 1024  # 5 local : 1 global
    assert gemma.layer_mixers[5] == "full" and gemma.layer_mixers[0] == "sliding"
    nemo = load_model_facts("nemotron-3-super-120b-a12b")
    assert nemo.layer_mixers.count("mamba") == 40 and nemo.moe_layers == 40
    assert load_model_facts("qwen2.5-coder-7b").kv_layers == (28, 0)  # use_sliding_window false


def test_sliding_window_caps_kv() -> None:
    oss = load_model_facts("gpt-oss-20b")
    per_layer_token = 2 * 8 * 64 * 2
    assert oss.kv_bytes(100) == per_layer_token * (12 * 100 + 12 * 100)
    assert oss.kv_bytes(10_000) == per_layer_token * (12 * 10_000 + 12 * 128)


@pytest.mark.parametrize("n,c,w", [(5, 0, 3), (10, 2, 8), (4, 20, 8), (1, 7, 8), (9, 0, 100)])
def test_sliding_keys_brute_force(n: int, c: int, w: int) -> None:
    assert sliding_keys(n, c, w) == sum(min(c + i, w) for i in range(1, n + 1))


def test_attention_flops_quadratic_in_prefill_linear_in_decode() -> None:
    f = load_model_facts("llama-3.1-8b")
    per_key = 4 * 32 * 128 * 32  # 4 x heads x head_dim, over 32 layers
    assert f.attention_flops(3, 0) == per_key * (1 + 2 + 3)
    assert f.attention_flops(1, 1000) == per_key * 1001
    assert f.attention_flops(2048, 0) / f.attention_flops(1024, 0) == pytest.approx(4.0, rel=0.01)


def test_moe_facts() -> None:
    q = load_model_facts("qwen3-30b-a3b")
    assert (q.num_experts, q.experts_per_token, q.moe_layers) == (128, 8, 48)
    assert q.params_per_expert == 3 * 2048 * 768
    assert load_model_facts("mixtral-8x7b").params_per_expert == 3 * 4096 * 14336


def test_config_path_and_text_config(tmp_path: Path) -> None:
    cfg = {
        "architectures": ["Gemma3ForConditionalGeneration"],
        "model_type": "gemma3",
        "text_config": {k: v for k, v in PRESETS["gemma-3-27b"].items() if k != "model_type"},
    }
    (tmp_path / "config.json").write_text(json.dumps(cfg))
    facts = load_model_facts(str(tmp_path))
    assert facts.total_params == load_model_facts("gemma-3-27b").total_params
    assert load_model_facts(str(tmp_path / "config.json")).model_type == "gemma3_text"


def test_modelopt_quant_file(tmp_path: Path) -> None:
    (tmp_path / "config.json").write_text(json.dumps(PRESETS["llama-3.1-8b"]))
    (tmp_path / "hf_quant_config.json").write_text(json.dumps({"quantization": {"quant_algo": "NVFP4"}}))
    native = load_model_facts(str(tmp_path)).native_quant
    assert native is not None and native.main == "nvfp4" and native.lm_head == "bf16"


def test_errors_name_the_argument() -> None:
    with pytest.raises(ValueError, match="MODEL"):
        load_model_facts("no-such-model")
    with pytest.raises(ValueError, match="model_type 'bert'"):
        facts_from_config({"model_type": "bert"})
