"""Gemma 3's model description: what glassbox reads from a config against what transformers builds from it.

Greedy parity with transformers runs in tests/engine/test_engine_parity.py with the other architectures.
"""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Any

import pytest
import torch
from tiny_models import build_tiny_model, hf_greedy

from glassbox import LLM, SamplingParams
from glassbox.models.config_reader import facts_from_config
from glassbox.models.model_config import ModelConfig
from glassbox.perf.model_presets import PRESETS, load_model_facts


@pytest.fixture(scope="module")
def tiny_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return build_tiny_model("gemma3", tmp_path_factory.mktemp("gemma3"))


def test_plan_facts_count_the_parameters_transformers_builds(tiny_dir: Path) -> None:
    import transformers as tf

    hf = tf.AutoModelForCausalLM.from_pretrained(tiny_dir, dtype=torch.float32)
    facts = load_model_facts(str(tiny_dir))  # what `glassbox plan <dir>` reads
    assert facts.total_params == sum(p.numel() for p in hf.parameters())  # tied: the table counted once
    groups = {"attention": 0, "mlp": 0, "norms": 0, "embed": 0}  # q_norm, k_norm count as attention
    for name, p in hf.named_parameters():
        group = "attention" if ".self_attn." in name else "mlp" if ".mlp." in name else None
        groups[group or ("embed" if "embed_tokens" in name else "norms")] += p.numel()
    assert {k: facts.params[k] for k in groups} == groups
    assert facts.kv_layers == (1, 2) and facts.sliding_window == 40


def test_engine_config_of_the_tiny_model(tiny_dir: Path) -> None:
    cfg = ModelConfig.from_facts(load_model_facts(str(tiny_dir)))
    assert cfg.architecture == "Gemma3ForCausalLM" and cfg.tie_word_embeddings
    assert cfg.layer_windows == (40, None, 40)
    assert cfg.attn_scale == 24**-0.5  # query_pre_attn_scalar, not head_dim (32)
    assert cfg.embed_scale == 8.0  # sqrt(hidden_size)
    assert cfg.final_logit_softcapping == 5.0 and cfg.attn_logit_softcapping is None
    assert cfg.rope == {"rope_type": "linear", "factor": 4.0, "rope_theta": 100000.0}
    assert cfg.rope_local == {"rope_type": "default", "rope_theta": 10000.0}
    assert cfg.hidden_act == "gelu_pytorch_tanh" and cfg.qk_norm


def _text_config(**kw: Any) -> dict[str, Any]:
    """transformers' own rewrite of Gemma 3 text settings (it moves rope fields into rope_parameters)."""
    import transformers as tf

    base = dict(vocab_size=512, hidden_size=64, intermediate_size=128, num_hidden_layers=6,
                num_attention_heads=4, num_key_value_heads=2, head_dim=32)  # fmt: skip
    out: dict[str, Any] = tf.Gemma3TextConfig(**base, **kw).to_dict()
    return out


def test_both_rope_spellings_read_the_same() -> None:
    """Hub configs write rope_theta / rope_local_base_freq / rope_scaling; transformers 5 rewrites them as
    rope_parameters per layer type. Either way: scaled global rope, local rope at its own base."""
    old = PRESETS["gemma-3-27b"]
    new = {k: v for k, v in old.items() if k not in ("rope_theta", "rope_local_base_freq", "rope_scaling")}
    new["rope_parameters"] = {
        "full_attention": {"rope_type": "linear", "factor": 8.0, "rope_theta": 1000000.0},
        "sliding_attention": {"rope_type": "default", "rope_theta": 10000.0},
    }
    a, b = facts_from_config(old), facts_from_config(new)
    assert a.rope == b.rope == {"factor": 8.0, "rope_type": "linear", "rope_theta": 1000000.0}
    assert a.rope_local == b.rope_local == {"rope_theta": 10000.0, "rope_type": "default"}
    assert a.query_pre_attn_scalar == b.query_pre_attn_scalar == 168
    assert a.embed_scale == b.embed_scale == 5376**0.5

    legacy = dict(
        rope_theta=500000.0, rope_local_base_freq=20000.0, rope_scaling={"rope_type": "linear", "factor": 2.0}
    )
    raw = {**_text_config(), "rope_parameters": None, "layer_types": None, **legacy}
    converted = facts_from_config(_text_config(**legacy))
    assert (
        facts_from_config(raw).rope
        == converted.rope
        == {"rope_type": "linear", "factor": 2.0, "rope_theta": 500000.0}
    )
    assert (
        facts_from_config(raw).rope_local
        == converted.rope_local
        == {"rope_type": "default", "rope_theta": 20000.0}
    )


def test_defaults_follow_transformers() -> None:
    """A config naming no rope or scale: global theta 1e6, local base 1e4, query_pre_attn_scalar 256, one
    global layer in six (sliding_window_pattern), tied embeddings."""
    import transformers as tf

    bare = {k: v for k, v in _text_config().items() if v is not None}
    for key in ("rope_parameters", "query_pre_attn_scalar", "layer_types", "tie_word_embeddings"):
        bare.pop(key)
    facts = facts_from_config({**bare, "sliding_window_pattern": 6})
    hf = tf.Gemma3TextConfig(
        **{k: v for k, v in bare.items() if k in tf.Gemma3TextConfig.__dataclass_fields__}
    )
    assert facts.rope["rope_theta"] == hf.rope_parameters["full_attention"]["rope_theta"] == 1e6
    assert facts.rope_local["rope_theta"] == hf.rope_parameters["sliding_attention"]["rope_theta"] == 1e4
    assert facts.query_pre_attn_scalar == hf.query_pre_attn_scalar == 256
    assert [k == "sliding" for k in facts.layer_mixers] == [t == "sliding_attention" for t in hf.layer_types]
    assert facts.tie_word_embeddings and hf.tie_word_embeddings


def test_attn_logit_softcapping_is_ignored_as_transformers_does(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """transformers' Gemma 3 keeps attn_logit_softcapping in its config and never applies it; glassbox
    matches it (applied, a cap of 1.0 would change nearly every greedy pick) and says that it ignores it."""
    d = build_tiny_model("gemma3", tmp_path, attn_logit_softcapping=1.0)
    prompts = [list(range(3, 60)), list(range(100, 103))]
    ref = hf_greedy(d, prompts, 6)
    with caplog.at_level(logging.WARNING, logger="glassbox.models.gemma3"):
        llm = LLM(str(d), dtype="float32")
    assert any("attn_logit_softcapping" in r.getMessage() for r in caplog.records)
    outs = llm.generate(prompts, SamplingParams(temperature=0, max_tokens=6, ignore_eos=True))
    assert [o.token_ids for o in outs] == [toks for toks, _ in ref]
