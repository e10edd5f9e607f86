"""Gemma 3 GGUF files (synthetic, written with gguf.GGUFWriter as llama.cpp lays them out) read by glassbox:
names, the (1 + w) norm offset and the config against transformers reading the same file; the facts llama.cpp
hard-codes; a chat that ends at <end_of_turn>. The real Gemma 3 270M file: tests/models/test_real_gemma3.py."""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from gguf_factory import Spec, write_model
from test_gguf_reader import assert_same_logits, assert_tensors_match, hf_model

from glassbox import LLM, SamplingParams
from glassbox.models.config_reader import facts_from_config
from glassbox.models.gguf_config import build_config
from glassbox.models.gguf_reader import open_gguf
from glassbox.models.model_config import ModelConfig

transformers = pytest.importorskip("transformers")

# head_dim 256: transformers' GGUF loader keeps query_pre_attn_scalar at its default 256 whatever the file
# says, llama.cpp scales by head_dim; at 256 both agree. Six layers: the sixth is the global one. A window
# of 4 tokens, shorter than the prompt assert_same_logits runs.
SPEC = Spec(
    arch="gemma3",
    hidden=64,
    layers=6,
    heads=2,
    kv_heads=1,
    head_dim=256,
    ffn=96,
    vocab=64,
    tie=True,
    rope_theta=1_000_000.0,
    meta={"attention.sliding_window": 4},
)


@pytest.fixture(scope="module")
def synthetic(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, dict[str, np.ndarray]]:
    path = tmp_path_factory.mktemp("gemma3") / "gemma3.gguf"
    return path, write_model(path, SPEC)


def test_names_norm_offset_and_config_match_transformers(
    synthetic: tuple[Path, dict[str, np.ndarray]],
) -> None:
    path, original = synthetic
    checkpoint = open_gguf(path)
    ref_config, ref_state, ref_model = hf_model(path)
    ours = dict(checkpoint.tensors())
    # every tensor under its HF name, equal to transformers' (which also takes the 1 off the norms) and to
    # the weights drawn in HF layout: the norms come back as the (1 + w) norms' w, not w + 1
    assert_tensors_match(ours, ref_state, tied=True)
    assert set(ours) == set(original)
    for name, values in ours.items():
        np.testing.assert_array_equal(values, original[name], err_msg=name)
    assert "model.layers.0.pre_feedforward_layernorm.weight" in ours
    assert "model.layers.5.post_feedforward_layernorm.weight" in ours

    cfg = checkpoint.config
    assert cfg["architectures"] == ["Gemma3ForCausalLM"] and cfg["model_type"] == ref_config["model_type"]
    for key in (
        "hidden_size",
        "num_hidden_layers",
        "num_attention_heads",
        "num_key_value_heads",
        "head_dim",
        "intermediate_size",
        "vocab_size",
        "max_position_embeddings",
        "tie_word_embeddings",
        "sliding_window",
        "layer_types",
        "query_pre_attn_scalar",
        "hidden_activation",
        "final_logit_softcapping",
        "attn_logit_softcapping",
    ):
        assert cfg[key] == ref_config[key], key
    assert math.isclose(cfg["rms_norm_eps"], ref_config["rms_norm_eps"], rel_tol=1e-6)
    rope = ref_config["rope_parameters"]
    assert cfg["rope_theta"] == rope["full_attention"]["rope_theta"] == 1e6
    assert cfg["rope_local_base_freq"] == rope["sliding_attention"]["rope_theta"] == 1e4
    assert cfg["layer_types"] == ["sliding_attention"] * 5 + ["full_attention"]
    # transformers builds the same model from our config dict as from the file
    assert_same_logits(cfg, ours, ref_model)


def test_engine_config_of_a_gemma3_gguf(synthetic: tuple[Path, dict[str, np.ndarray]]) -> None:
    cfg = ModelConfig.from_facts(facts_from_config(open_gguf(synthetic[0]).config))
    assert cfg.architecture == "Gemma3ForCausalLM" and cfg.tie_word_embeddings and cfg.qk_norm
    assert cfg.layer_windows == (4, 4, 4, 4, 4, None)
    assert cfg.attn_scale == 256**-0.5 and cfg.embed_scale == 8.0
    assert cfg.rope == {"rope_theta": 1e6, "rope_type": "default"}
    assert cfg.rope_local == {"rope_theta": 1e4, "rope_type": "default"}
    assert cfg.hidden_act == "gelu_pytorch_tanh" and cfg.final_logit_softcapping is None


# ---- what llama.cpp hard-codes for Gemma 3 (src/llama-model.cpp) ----


def _metadata(layers: int = 6, **extra: Any) -> dict[str, Any]:
    meta: dict[str, Any] = {
        "general.architecture": "gemma3",
        "gemma3.embedding_length": 128,
        "gemma3.block_count": layers,
        "gemma3.attention.head_count": 4,
        "gemma3.attention.head_count_kv": 2,
        "gemma3.attention.key_length": 64,
        "gemma3.attention.value_length": 64,
        "gemma3.feed_forward_length": 256,
        "gemma3.attention.layer_norm_rms_epsilon": 1e-6,
        "gemma3.rope.freq_base": 1_000_000.0,
        "gemma3.attention.sliding_window": 512,
    }
    return meta | {f"gemma3.{k}": v for k, v in extra.items()}


def _config(meta: dict[str, Any]) -> dict[str, Any]:
    return build_config(meta, {"token_embd.weight": (1000, 128)}, ["Q4_K", "F32"])


def test_every_sixth_layer_is_global_and_the_local_rope_is_fixed() -> None:
    cfg = _config(_metadata(layers=12))
    assert [i for i, t in enumerate(cfg["layer_types"]) if t == "full_attention"] == [5, 11]
    facts = facts_from_config(cfg)
    assert facts.sliding_window == 512 and facts.kv_layers == (2, 10)
    assert facts.rope_local == {"rope_theta": 10000.0, "rope_type": "default"}
    assert facts.query_pre_attn_scalar == 64  # head_dim
    # no sliding window in the file: llama.cpp runs every layer globally
    for window in (None, 0):
        meta = _metadata(layers=12)
        if window is None:
            del meta["gemma3.attention.sliding_window"]
        else:
            meta["gemma3.attention.sliding_window"] = window
        assert facts_from_config(_config(meta)).kv_layers == (12, 0)


def test_rope_scaling_applies_to_the_global_layers_only() -> None:
    """Gemma 3 4B-27B: linear rope scaling (factor 8) on the global layers; the local ones stay unscaled."""
    cfg = _config(_metadata(**{"rope.scaling.type": "linear", "rope.scaling.factor": 8.0}))
    assert cfg["rope_scaling"] == {"rope_type": "linear", "factor": 8.0}
    facts = facts_from_config(cfg)
    assert facts.rope == {"rope_type": "linear", "factor": 8.0, "rope_theta": 1e6}
    assert facts.rope_local == {"rope_theta": 10000.0, "rope_type": "default"}
    hf = transformers.AutoConfig.for_model(**cfg)  # transformers reads the dict the same way
    assert hf.rope_parameters["full_attention"] == {"rope_type": "linear", "factor": 8.0, "rope_theta": 1e6}
    assert hf.rope_parameters["sliding_attention"] == {"rope_type": "default", "rope_theta": 10000.0}


def test_27b_attention_scale_and_logit_softcapping() -> None:
    """llama.cpp scales the 62-layer (27B) model's attention by (hidden / heads) ** -0.5 (Gemma 3 27B's
    query_pre_attn_scalar, 168, is 5376 / 32), the others by head_dim ** -0.5; a final soft-cap is carried."""
    assert _config(_metadata(layers=62))["query_pre_attn_scalar"] == 128 // 4
    cfg = _config(_metadata(final_logit_softcapping=30.0))
    assert cfg["final_logit_softcapping"] == 30.0 and cfg["attn_logit_softcapping"] is None
    with pytest.raises(ValueError, match="value length 32 != key length 64"):
        _config(_metadata(**{"attention.value_length": 32}))


# ---- a chat ends at <end_of_turn> ----

# A SentencePiece vocabulary with Gemma's control tokens (merges come from the scores, longer tokens first).
_PIECES = ["u", "s", "e", "r", "us", "er", "user", "m", "o", "d", "l", "mo", "el", "del", "model"]
_PIECES += ["H", "i", "Hi", "P", "a", "Pa", "is", "ris", "Paris"]
_TOKENS = ["<pad>", "<eos>", "<bos>", "<unk>", "<start_of_turn>", "<end_of_turn>", "\n", *_PIECES]
_TYPES = [3, 3, 3, 3, 3, 3, 4] + [1] * len(_PIECES)
GEMMA_VOCAB: dict[str, Any] = {
    "tokenizer.ggml.model": "llama",
    "tokenizer.ggml.pre": "default",
    "tokenizer.ggml.tokens": _TOKENS,
    "tokenizer.ggml.scores": [0.0] * 7 + [-float(len(_PIECES) - len(p)) for p in _PIECES],
    "tokenizer.ggml.token_type": _TYPES,
    "tokenizer.ggml.bos_token_id": 2,
    "tokenizer.ggml.eos_token_id": 1,
    "tokenizer.ggml.unknown_token_id": 3,
    "tokenizer.ggml.padding_token_id": 0,
    "tokenizer.ggml.add_bos_token": True,
    "tokenizer.ggml.add_space_prefix": False,
}


def scripted_weights(spec: Spec, script: dict[int, int], seed: int = 0) -> dict[str, np.ndarray]:
    """Weights under which greedy decoding follows ``script`` (last token id -> next token id).

    Attention and MLP write nothing back (o_proj, down_proj zero), so the final hidden state is the last
    token's one-hot embedding scaled; lm_head row ``next`` picks out ``last``'s dimension."""
    from gguf_factory import hf_weights

    weights = hf_weights(spec, seed)
    for name in weights:
        if name.endswith(("o_proj.weight", "down_proj.weight")):
            weights[name] = np.zeros_like(weights[name])
    weights["model.embed_tokens.weight"] = np.eye(spec.vocab, spec.hidden, dtype=np.float32)
    weights["model.norm.weight"] = np.zeros(spec.hidden, np.float32)  # scale 1 + 0
    head = np.zeros((spec.vocab, spec.hidden), np.float32)
    for last, following in script.items():
        head[following, last] = 1.0
    weights["lm_head.weight"] = head
    return weights


def test_chat_answer_ends_at_end_of_turn(tmp_path: Path) -> None:
    """A Gemma GGUF without a chat template is prompted in Gemma's turn format, and an answer ends where the
    model emits <end_of_turn> (finish_reason "stop"), as Gemma's instruction-tuned models end theirs."""
    tokens = {t: i for i, t in enumerate(_TOKENS)}
    spec = Spec(arch="gemma3", hidden=64, layers=2, heads=2, kv_heads=1, head_dim=32, vocab=len(_TOKENS))
    # after the generation prompt's "\n": "Paris", then <end_of_turn>, then (never reached) "Hi"
    script = {tokens["\n"]: tokens["Paris"], tokens["Paris"]: tokens["<end_of_turn>"]}
    script[tokens["<end_of_turn>"]] = tokens["Hi"]
    path = tmp_path / "scripted-gemma3.gguf"
    write_model(path, spec, weights=scripted_weights(spec, script), vocab=GEMMA_VOCAB)
    llm = LLM(str(path), dtype="float32")
    chat = [{"role": "user", "content": "Hi"}]
    assert llm.tokenizer.apply_chat_template(chat) == (
        "<bos><start_of_turn>user\nHi<end_of_turn>\n<start_of_turn>model\n"
    )
    out = llm.chat(chat, SamplingParams(temperature=0, max_tokens=8))[0]
    assert out.token_ids == [tokens["Paris"], tokens["<end_of_turn>"]]
    assert out.text == "Paris" and out.finish_reason == "stop"
