"""The planner's Gemma 4: presets against transformers' own parameter count and the model cards, KV bytes per
token with full layers of their own geometry and shared KV counted by hand, and the per-layer input
embeddings read per token."""

from __future__ import annotations

import pytest
import torch

from glassbox.models.config_reader import facts_from_config
from glassbox.perf.cost_model import step_cost
from glassbox.perf.engine_profiles import get_engine
from glassbox.perf.hardware import PRESETS as HARDWARE
from glassbox.perf.model_presets import PRESETS, load_model_facts
from glassbox.perf.quant import resolve_scheme

GEMMA4 = ("gemma-4-31b", "gemma-4-26b-a4b")


@pytest.mark.parametrize("name", GEMMA4)
def test_presets_count_the_parameters_transformers_builds(name: str) -> None:
    """transformers' Gemma4ForCausalLM of the preset's text config, built on the meta device (no memory)."""
    import transformers as tf

    cfg = {k: v for k, v in PRESETS[name].items() if k not in ("architectures", "model_type", "torch_dtype")}
    with torch.device("meta"):
        model = tf.Gemma4ForCausalLM(tf.Gemma4TextConfig(**cfg))
    assert load_model_facts(name).total_params == sum(p.numel() for p in model.parameters())


def test_presets_match_the_model_cards() -> None:
    """Gemma 4 31B: 30.7B parameters; 26B-A4B: 25.2B, 3.8B active (the text models: no vision tower)."""
    assert load_model_facts("gemma-4-31b").total_params == pytest.approx(30.7e9, rel=0.005)
    moe = load_model_facts("gemma-4-26b-a4b")
    assert moe.total_params == pytest.approx(25.2e9, rel=0.005)
    assert moe.active_params == pytest.approx(3.8e9, rel=0.01)


def test_kv_bytes_per_token_by_hand() -> None:
    """31B (bf16): 50 sliding layers x K and V x 16 heads x 256 + 10 full layers x K and V x 4 heads x 512
    (their V is their K projection, but the cache holds both); sliding layers keep at most the window."""
    f = load_model_facts("gemma-4-31b")
    sliding, full = 50 * 2 * 16 * 256 * 2, 10 * 2 * 4 * 512 * 2
    assert f.kv_bytes_per_token(2.0) == sliding + full == 901_120
    assert f.kv_bytes(4096, 2.0) == sliding * 1024 + full * 4096
    moe = load_model_facts("gemma-4-26b-a4b")
    assert moe.kv_bytes_per_token(2.0) == 25 * 2 * 8 * 256 * 2 + 5 * 2 * 2 * 512 * 2 == 225_280


def test_shared_kv_is_counted_once() -> None:
    """E2B's shape: 35 layers (five sliding to one full, the last full), one KV head of 256 (full: 512), the
    last 20 layers reusing the KV of layers 14 (sliding) and 11 (full): only layers 0-14 hold a cache, 13
    sliding and 2 full (5 and 11); per-layer inputs of 256 per layer."""
    cfg = {"model_type": "gemma4_text", "hidden_size": 1536, "intermediate_size": 6144, "num_hidden_layers": 35,
           "num_attention_heads": 8, "num_key_value_heads": 1, "head_dim": 256, "global_head_dim": 512,
           "num_kv_shared_layers": 20, "hidden_size_per_layer_input": 256, "use_double_wide_mlp": True}  # fmt: skip
    f = facts_from_config(cfg)
    assert f.kv_bytes_per_token(2.0) == 13 * 2 * 1 * 256 * 2 + 2 * 2 * 1 * 512 * 2 == 17_408
    assert [f.kv_owner(i) for i in (15, 16, 17, 34)] == [14, 14, 11, 11]
    assert f.embedding_row_params == 1536 + 35 * 256
    unshared = facts_from_config({**cfg, "num_kv_shared_layers": 0})
    assert unshared.kv_bytes_per_token(2.0) == 29 * 2 * 256 * 2 + 6 * 2 * 512 * 2


def test_a_decode_step_reads_each_tokens_per_layer_inputs() -> None:
    """A step gathers, per token, its row of the embedding table and its row of the per-layer input table
    (num_layers x P wide): both in the bytes a decode step reads."""
    cfg = {"model_type": "gemma4_text", "hidden_size": 1536, "intermediate_size": 6144, "num_hidden_layers": 35,
           "num_attention_heads": 8, "num_key_value_heads": 1, "head_dim": 256, "hidden_size_per_layer_input": 256}  # fmt: skip
    with_ple, without = facts_from_config(cfg), facts_from_config({**cfg, "hidden_size_per_layer_input": 0})
    hw, engine = HARDWARE["dgx-spark"], get_engine("ideal")
    scheme = resolve_scheme("bf16", None, "bf16", False, None)
    a, b = (
        step_cost(f, scheme, hw, engine, [(1, 100)] * 4).terms["weight_bytes"] for f in (with_ple, without)
    )
    per_layer = (
        with_ple.params["mlp"] - without.params["mlp"] + with_ple.params["norms"] - without.params["norms"]
    )
    assert a - b == pytest.approx(2.0 * (4 * 35 * 256 + per_layer))  # 4 tokens' rows + the per-layer linears
