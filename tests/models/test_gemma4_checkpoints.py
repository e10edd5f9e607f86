"""Gemma 4 checkpoints as published: what glassbox reads from a config against what transformers builds from
it, and a multimodal checkpoint (Gemma4ForConditionalGeneration) run as its text model."""

from __future__ import annotations

import logging
from pathlib import Path

import pytest
import torch
from gemma4_models import KINDS, build_gemma4
from tiny_models import hf_greedy

from glassbox import LLM, SamplingParams
from glassbox.models.config_reader import facts_from_config, facts_from_dir
from glassbox.models.gemma4_facts import with_defaults

LP_TOL = 1e-4  # float32 on both sides, as tests/models/test_gemma4.py derives it


@pytest.fixture(scope="module")
def root(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("gemma4-ckpt")


def _group(name: str) -> str:
    """transformers' parameter name -> the planner's group."""
    if "embed_tokens" in name:
        return "embed"
    if name.startswith("lm_head"):
        return "lm_head"
    if ".experts." in name:
        return "experts"
    if ".router." in name:
        return "moe_shared"
    if "norm" in name:
        return "attention" if ".self_attn." in name else "norms"
    return "attention" if ".self_attn." in name else "mlp"


@pytest.mark.parametrize("kind", KINDS)
def test_facts_count_the_parameters_transformers_builds(root: Path, kind: str) -> None:
    import transformers as tf

    d = build_gemma4(kind, root)
    hf = tf.AutoModelForCausalLM.from_pretrained(d, dtype=torch.float32)
    facts = facts_from_dir(d)
    assert facts.total_params == sum(p.numel() for p in hf.parameters())  # tied: the table counted once
    groups = dict.fromkeys(facts.params, 0)
    for name, p in hf.named_parameters():
        groups[_group(name)] += p.numel()
    groups["lm_head"] = facts.params["lm_head"]  # tied: transformers lists it once, as the embedding
    assert groups == facts.params


def test_engine_reads_the_layer_geometry_transformers_builds(root: Path) -> None:
    """Per layer: KV heads and head dim of its k projection (or its owner's), and which layers share."""
    import transformers as tf

    d = build_gemma4("dense", root)
    hf = tf.AutoModelForCausalLM.from_pretrained(d, dtype=torch.float32)
    facts = facts_from_dir(d)
    sharing = hf.config.kv_sharing_modes  # [None, store, store, reuse, ...]: the owners' own caches
    for i, layer in enumerate(hf.model.layers):
        attn = layer.self_attn
        owner = facts.kv_owner(i)
        assert (owner != i) == (sharing[i] == "reuse")
        k_proj = hf.model.layers[owner].self_attn.k_proj
        assert facts.kv_shape(i) == (k_proj.out_features // attn.head_dim, attn.head_dim)
        assert (hf.model.layers[owner].self_attn.v_proj is None) == (
            facts.attention_k_eq_v and attn.layer_type == "full_attention"
        )
        assert layer.mlp.intermediate_size == (facts.layer_intermediate or [facts.intermediate_size] * 6)[i]


def test_both_spellings_of_the_full_layers_read_the_same() -> None:
    """Hub configs write global_head_dim / num_global_key_value_heads; transformers 5 per_layer_config."""
    import transformers as tf

    old = {"model_type": "gemma4_text", "hidden_size": 64, "intermediate_size": 96, "num_hidden_layers": 6,
           "num_attention_heads": 4, "num_key_value_heads": 2, "head_dim": 16, "global_head_dim": 32,
           "num_global_key_value_heads": 1, "attention_k_eq_v": True, "vocab_size": 100,
           "vocab_size_per_layer_input": 100}  # fmt: skip
    new = tf.Gemma4TextConfig(**old).to_dict()
    assert "per_layer_config" in new and "global_head_dim" not in new
    a, b = facts_from_config(old), facts_from_config(new)
    assert a.layer_kv_heads == b.layer_kv_heads == (2, 2, 2, 2, 2, 1)
    assert a.layer_head_dims == b.layer_head_dims == (16, 16, 16, 16, 16, 32)
    assert a.params == b.params
    # transformers' defaults where a config is silent: 512-wide full layers, 5 sliding to 1 full
    bare = facts_from_config(
        {k: v for k, v in old.items() if k not in ("global_head_dim", "num_global_key_value_heads")}
    )
    hf = tf.Gemma4TextConfig(
        **{k: v for k, v in old.items() if k not in ("global_head_dim", "num_global_key_value_heads")}
    )
    assert bare.layer_head_dims[-1] == hf.per_layer_config[5].head_dim == 512
    assert [k == "sliding" for k in bare.layer_mixers] == [t == "sliding_attention" for t in hf.layer_types]


def test_settings_glassbox_does_not_run_are_refused() -> None:
    base = {"model_type": "gemma4_text", "hidden_size": 64, "num_hidden_layers": 2, "num_attention_heads": 4}
    with pytest.raises(ValueError, match="num_kv_shared_layers=2 must be below the 2 layers"):
        facts_from_config({**base, "num_kv_shared_layers": 2})
    with pytest.raises(ValueError, match="use_bidirectional_attention"):
        with_defaults({**base, "use_bidirectional_attention": "all"})
    with pytest.raises(ValueError, match="per_layer_config sets \\['intermediate_size'\\]"):
        facts_from_config({**base, "per_layer_config": {"0": {"intermediate_size": 8}}})


def test_multimodal_checkpoint_runs_its_text_model(root: Path, caplog: pytest.LogCaptureFixture) -> None:
    """Gemma4ForConditionalGeneration with vision and audio towers: glassbox runs its text model (the
    towers' tensors left out, said once) and gives transformers' tokens for text prompts."""
    d = build_gemma4("dense", root, multimodal=True)
    prompts = [list(range(3, 70)), [9, 8, 7]]
    ref = hf_greedy(d, prompts, 8)  # transformers' Gemma4ForConditionalGeneration
    with caplog.at_level(logging.INFO, logger="glassbox.models.multimodal"):
        llm = LLM(str(d), dtype="float32")
    said = [r.getMessage() for r in caplog.records if "text model only" in r.getMessage()]
    assert len(said) == 1 and "model.audio_tower" in said[0] and "model.vision_tower" in said[0]
    assert llm.engine.model_config.architecture == "Gemma4ForCausalLM"
    outs = llm.generate(prompts, SamplingParams(temperature=0, max_tokens=8, ignore_eos=True, logprobs=1))
    for out, (toks, lps) in zip(outs, ref, strict=True):
        assert out.token_ids == toks
        assert out.logprobs is not None
        assert max(abs(out.logprobs[j][t] - lps[j]) for j, t in enumerate(toks)) < LP_TOL
