"""The GGUF tokenizer against transformers' AutoTokenizer reading the same GGUF files."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import gguf
import pytest
from gguf_factory import Spec, smollm2_path, write_model, write_vocab
from tokenizers import Tokenizer as BackendTokenizer
from tokenizers import decoders, models, pre_tokenizers

from glassbox.models.gguf_reader import open_gguf, read_metadata
from glassbox.tokenizer import training
from glassbox.tokenizer.gguf_tokenizer import (
    merges_from_scores,
    tokenizer_from_gguf,
    tokenizer_from_gguf_path,
)
from glassbox.tokenizer.hf_tokenizer import Tokenizer

transformers = pytest.importorskip("transformers")

PROMPTS = [
    "Hello, we can use",
    "The capital of France is Paris. It has 2,165,423 inhabitants (2019).",
    "   leading and trailing spaces   ",
    "line one\nline two\n\n\ttabbed\r\nwindows\n",
    "def f(x: int) -> int:\n    return x ** 2  # square\n\nprint(f(12345))",
    "你好，世界！今天天气很好。こんにちは 안녕하세요",
    "😀 🚀🌍 👍🏽 ❤️ 🇩🇪 👩‍💻 🦜",
    "naïve café déjà vu Ωμέγα Привет Ærøskøbing",
    "<|im_start|>user\nWhat's 2+2?<|im_end|>\n<|im_start|>assistant\n",
    "I'M DONE, isn't it? they'll've",
    "",
    " ",
]
CHATS = [
    [{"role": "user", "content": "What is the capital of France?"}],
    [
        {"role": "system", "content": "You are terse. Answer in one word."},
        {"role": "user", "content": "Say hi 👋 in 中文"},
        {"role": "assistant", "content": "你好"},
        {"role": "user", "content": "  and again?  "},
    ],
]


def reference(path: Path) -> Any:
    return transformers.AutoTokenizer.from_pretrained(path.parent, gguf_file=path.name)


def ref_chat_ids(ref: Any, chat: list[dict[str, Any]]) -> list[int]:
    ids = ref.apply_chat_template(chat, add_generation_prompt=True, tokenize=True, return_dict=False)
    return list(ids)


# ---- the real model ----


@pytest.fixture(scope="module")
def smollm2(smollm2_reference: tuple[Any, Any]) -> tuple[Tokenizer, Any]:
    path = smollm2_path()
    assert path is not None  # else smollm2_reference skipped
    return tokenizer_from_gguf_path(path), smollm2_reference[1]  # conftest's transformers tokenizer


@pytest.mark.parametrize("text", PROMPTS)
def test_smollm2_ids_and_decode_match_transformers(text: str, smollm2: tuple[Tokenizer, Any]) -> None:
    ours, ref = smollm2
    ids = ours.encode(text)
    assert ids == ref(text).input_ids
    assert ours.decode(ids, skip_special_tokens=False) == text  # round trip
    for skip in (True, False):
        assert ours.decode(ids, skip_special_tokens=skip) == ref.decode(ids, skip_special_tokens=skip)


@pytest.mark.parametrize("chat", CHATS, ids=["one-turn", "multi-turn"])
def test_smollm2_chat_template_matches_transformers(chat: list[dict[str, Any]], smollm2: Any) -> None:
    ours, ref = smollm2
    text = ref.apply_chat_template(chat, add_generation_prompt=True, tokenize=False)
    assert ours.apply_chat_template(chat, add_generation_prompt=True) == text
    assert ours.encode_chat(chat, add_generation_prompt=True) == ref_chat_ids(ref, chat)


def test_smollm2_special_tokens(smollm2: tuple[Tokenizer, Any]) -> None:
    ours, ref = smollm2
    im_end = ref.convert_tokens_to_ids("<|im_end|>")
    assert ours.bos_token_id == ref.bos_token_id and ours.eos_token_id == ref.eos_token_id == im_end
    assert {ref.eos_token_id, im_end} <= ours.eos_token_ids
    assert ours.eos_token_ids <= {im_end, ref.convert_tokens_to_ids("<|endoftext|>")}
    assert ours.all_special_ids == {i for i, t in ref.added_tokens_decoder.items() if t.special}
    assert set(ref.all_special_ids) <= ours.all_special_ids
    assert ours.vocab_size == len(ref) == 49152
    assert ours.encode("<|im_start|>") == [1]


# ---- a trained byte-level BPE vocabulary in synthetic files ----

TEXTS = [t for t in PROMPTS if "<|im_" not in t] + [
    f"{training.BOS}system prompt{training.EOT} user text {training.EOS} tail",
    "a <think>x</think> b",
]


@pytest.fixture(scope="module")
def bpe_vocab() -> dict[str, Any]:
    """tokenizer.* metadata of a small byte-level BPE, trained once, with one user-defined token."""
    tok = training.train_bpe(training.iter_texts(training.stdlib_python_files(40)), 800)
    model = json.loads(tok.to_str())["model"]
    tokens = [""] * len(model["vocab"])
    for token, index in model["vocab"].items():
        tokens[index] = token
    merges = [m if isinstance(m, str) else " ".join(m) for m in model["merges"]]
    return {
        "tokenizer.ggml.model": "gpt2",
        "tokenizer.ggml.tokens": [*tokens, "<think>"],
        "tokenizer.ggml.token_type": [3 if t in training.SPECIAL_TOKENS else 1 for t in tokens] + [4],
        "tokenizer.ggml.merges": merges,
        "tokenizer.ggml.bos_token_id": tokens.index(training.BOS),
        "tokenizer.ggml.eos_token_id": tokens.index(training.EOS),
        "tokenizer.chat_template": training.CHAT_TEMPLATE,
    }


@pytest.mark.parametrize("pre", ["qwen2", "llama-bpe", "gpt-2", "tekken", "gpt-4o"])
def test_byte_level_matches_transformers(pre: str, bpe_vocab: dict[str, Any], tmp_path: Path) -> None:
    path = write_vocab(tmp_path / f"{pre}.gguf", {**bpe_vocab, "tokenizer.ggml.pre": pre})
    ours, ref = tokenizer_from_gguf_path(path), reference(path)
    for text in TEXTS:
        ids = ours.encode(text, add_special_tokens=False)
        assert ids == ref(text, add_special_tokens=False).input_ids, text
        assert ours.decode(ids, skip_special_tokens=False) == text
    think = ours.token_to_id("<think>")
    assert think is not None and think not in ours.all_special_ids  # user-defined: whole, not special
    assert think in ours.encode("a<think>b") and "<think>" in ours.decode(ours.encode("<think>"))
    # llama.cpp adds BOS for the llama3 family when the file does not say
    assert (ours.encode("hi")[0] == ours.bos_token_id) is (pre in ("llama-bpe", "tekken"))
    chat = CHATS[1]
    assert ours.encode_chat(chat) == ref_chat_ids(ref, chat)
    assert ours.eos_token_ids == {bpe_vocab["tokenizer.ggml.eos_token_id"]}


def test_byte_level_smollm_splits_digits(bpe_vocab: dict[str, Any], tmp_path: Path) -> None:
    """smollm (StarCoder family): digits one by one, as its tokenizer.json's Digits pre-tokenizer does.

    transformers' GGUF reader splits this family as GPT-2 does, so the reference is that tokenizer.json
    rebuilt: BPE over the same vocabulary with Digits(individual) then GPT-2's byte-level split.
    """
    path = write_vocab(tmp_path / "smollm.gguf", {**bpe_vocab, "tokenizer.ggml.pre": "smollm"})
    ours = tokenizer_from_gguf_path(path)
    tokens = bpe_vocab["tokenizer.ggml.tokens"]
    merges = [tuple(m.split(" ")) for m in bpe_vocab["tokenizer.ggml.merges"]]
    ref = BackendTokenizer(models.BPE({t: i for i, t in enumerate(tokens)}, merges))
    ref.pre_tokenizer = pre_tokenizers.Sequence(
        [pre_tokenizers.Digits(individual_digits=True), pre_tokenizers.ByteLevel(add_prefix_space=False)]
    )
    ref.decoder = decoders.ByteLevel()
    for text in TEXTS:
        if "<" not in text:
            assert ours.encode(text) == ref.encode(text).ids, text
    assert len(ours.encode(" 2025")) == 5


# ---- a SentencePiece ("llama") vocabulary ----

PIECES = [
    "▁",
    "e",
    "h",
    "l",
    "o",
    "t",
    "w",
    "r",
    "d",
    "a",
    "n",
    "i",
    "s",
    "\n",
    "▁t",
    "he",
    "▁the",
    "ll",
    "▁he",
]
PIECES += ["llo", "▁hello", "▁w", "or", "▁wor", "ld", "▁world", "in", "▁in", "an", "▁an", "▁a", "is", "▁is"]
PIECES += ["▁▁", "▁▁▁▁", "er", "▁s"]


def spm_meta(space_prefix: bool = True) -> dict[str, Any]:
    tokens = ["<unk>", "<s>", "</s>", *(f"<0x{b:02X}>" for b in range(256)), *PIECES, "<|user|>", "<think>"]
    return {
        "tokenizer.ggml.model": "llama",
        "tokenizer.ggml.tokens": tokens,
        "tokenizer.ggml.scores": [0.0] * 259 + [-float(i) for i in range(len(PIECES))] + [0.0, 0.0],
        "tokenizer.ggml.token_type": [2, 3, 3] + [6] * 256 + [1] * len(PIECES) + [3, 4],
        "tokenizer.ggml.bos_token_id": 1,
        "tokenizer.ggml.eos_token_id": 2,
        "tokenizer.ggml.unknown_token_id": 0,
        "tokenizer.ggml.add_space_prefix": space_prefix,
        "tokenizer.chat_template": "{% for m in messages %}{{ bos_token }}<|user|>{{ m['content'] }}{{ eos_token }}{% endfor %}",
    }


SPM_TEXTS = [
    "hello world",
    "the world is in an hello",
    "héllo wörld ☃",
    "hello\nworld\n  ",
    "",
    "a",
    "shell is the hell",
]


def test_sentencepiece_matches_transformers(tmp_path: Path) -> None:
    path = write_vocab(tmp_path / "spm.gguf", spm_meta())
    ours, ref = tokenizer_from_gguf_path(path), reference(path)
    for text in SPM_TEXTS:
        ids = ours.encode(text)
        assert ids == ref(text).input_ids, text  # BOS added: add_bos_token defaults to true for "llama"
        assert ours.decode(ids) == ref.decode(ids, skip_special_tokens=True) == text
    byte_ids = [ours.token_to_id(f"<0x{b:02X}>") for b in "☃".encode()]  # byte fallback
    assert ours.encode("☃", add_special_tokens=False) == [ours.token_to_id("▁"), *byte_ids]
    chat = [{"role": "user", "content": "hello world"}]
    assert ours.apply_chat_template(chat) == ref.apply_chat_template(chat, tokenize=False)


def test_sentencepiece_spaces_follow_llama_cpp(tmp_path: Path) -> None:
    """Where transformers' GGUF reader differs from llama.cpp (and from Llama 2's own tokenizer.json), we
    follow llama.cpp: the prefix space goes before every stretch of text, also after a special token, and
    also when the text starts with a space; add_space_prefix=false turns it off."""
    ours = tokenizer_from_gguf_path(write_vocab(tmp_path / "spm.gguf", spm_meta()))
    ids = ours.token_to_id
    assert ours.encode("<|user|>hello world", add_special_tokens=False) == [
        ids("<|user|>"),
        ids("▁hello"),
        ids("▁world"),
    ]
    expected = [ids("<s>"), ids("<|user|>"), ids("▁hello"), ids("▁world"), ids("</s>")]
    assert ours.encode_chat([{"role": "user", "content": "hello world"}]) == expected
    assert ours.encode(" hello", add_special_tokens=False) == [
        ids("▁"),
        ids("▁hello"),
    ]  # Llama 2: [29871, ...]
    for text in (" hello", "  two  spaces  "):
        assert ours.decode(ours.encode(text)) == text  # the decoder drops the one prefix space
    bare = tokenizer_from_gguf_path(write_vocab(tmp_path / "bare.gguf", spm_meta(space_prefix=False)))
    assert bare.encode("hello world") == [1, ids("he"), ids("llo"), ids("▁world")]
    assert bare.decode(bare.encode(" hello world")) == " hello world"


def test_merges_from_scores() -> None:
    tokens = ["a", "b", "c", "ab", "bc", "abc"]
    merges = merges_from_scores(tokens, [0.0, 0.0, 0.0, -2.0, -1.0, -3.0])
    assert merges == [("b", "c"), ("a", "b"), ("ab", "c"), ("a", "bc")]


# ---- sources and errors ----


def test_sources_and_checkpoint(bpe_vocab: dict[str, Any], tmp_path: Path) -> None:
    path = write_vocab(tmp_path / "v.gguf", {**bpe_vocab, "tokenizer.ggml.pre": "qwen2"})
    reader = gguf.GGUFReader(path)
    texts = TEXTS[:6]
    expected = [tokenizer_from_gguf_path(path).encode(t) for t in texts]
    for source in (reader, read_metadata(reader)):
        assert [tokenizer_from_gguf(source).encode(t) for t in texts] == expected
    model = tmp_path / "model.gguf"
    write_model(model, Spec(layers=1))
    tok = tokenizer_from_gguf(open_gguf(model))
    assert tok.eos_token_id == 0 and tok.encode("<|endoftext|>") == [0] and tok.chat_template is None


def test_unsupported_tokenizer_model(tmp_path: Path) -> None:
    meta = {"tokenizer.ggml.model": "bert", "tokenizer.ggml.tokens": ["[PAD]", "a"]}
    with pytest.raises(ValueError, match=r"'bert' is not supported; supported: gpt2, llama"):
        tokenizer_from_gguf_path(write_vocab(tmp_path / "bert.gguf", meta))
    with pytest.raises(ValueError, match="token types"):
        tokenizer_from_gguf({**spm_meta(), "tokenizer.ggml.token_type": [1, 1]})
