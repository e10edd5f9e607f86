"""The tokenizer package against transformers' AutoTokenizer on the same directory, and by hand."""

from __future__ import annotations

import json
import random
from pathlib import Path
from typing import Any

import pytest
from tokenizer_factory import build_tokenizer_dir
from tokenizers import AddedToken, decoders, models, pre_tokenizers, processors
from tokenizers import Tokenizer as BackendTokenizer

from glassbox.tokenizer.detokenizer import IncrementalDetokenizer
from glassbox.tokenizer.hf_tokenizer import Tokenizer, validate_messages
from glassbox.tokenizer.stop_checker import StopChecker
from glassbox.tokenizer.training import BOS, EOS, EOT, MULTILINGUAL_TEXT

transformers = pytest.importorskip("transformers")

TEXTS = [
    "hello world",
    "def f(x):\n    return x + 1  # comment\n\n\tclass A: pass",
    "你好，世界！今天天气很好。こんにちは 안녕하세요",
    "😀 🚀🌍 👍🏽 ❤️ 🇩🇪 👩‍💻 🦜",
    f"{BOS}system prompt{EOT} user text {EOS} tail",
    "",
    "   leading and trailing spaces   ",
    "naïve café déjà vu Ωμέγα Привет",
]
CHAT = [
    {"role": "system", "content": "You are terse."},
    {"role": "user", "content": "Say 你好 😀"},
    {"role": "assistant", "content": "你好 😀"},
    {"role": "user", "content": "again"},
]


@pytest.fixture(scope="module")
def tok_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return build_tokenizer_dir(tmp_path_factory.mktemp("tok"))


@pytest.fixture(scope="module")
def tok(tok_dir: Path) -> Tokenizer:
    return Tokenizer.from_dir(tok_dir)


@pytest.fixture(scope="module")
def hf(tok_dir: Path) -> Any:
    return transformers.AutoTokenizer.from_pretrained(str(tok_dir))


def copy_dir(src: Path, dst: Path, config_update: dict[str, Any] | None = None) -> Path:
    dst.mkdir(parents=True, exist_ok=True)
    for f in src.iterdir():
        (dst / f.name).write_bytes(f.read_bytes())
    if config_update is not None:
        cfg = json.loads((dst / "tokenizer_config.json").read_text())
        cfg.update(config_update)
        (dst / "tokenizer_config.json").write_text(json.dumps(cfg))
    return dst


# ---- encode / decode / vocabulary ----


@pytest.mark.parametrize("text", TEXTS)
def test_encode_decode_match_transformers(tok: Tokenizer, hf: Any, text: str) -> None:
    for add_special in (True, False):
        assert tok.encode(text, add_special) == hf.encode(text, add_special_tokens=add_special)
    ids = hf.encode(text)
    for skip in (True, False):
        assert tok.decode(ids, skip) == hf.decode(ids, skip_special_tokens=skip)


def test_special_tokens_encode_as_one_id_and_are_skipped(tok: Tokenizer) -> None:
    ids = tok.encode(f"a{EOT}b")
    assert tok.token_to_id(EOT) in ids
    assert tok.decode(ids, skip_special_tokens=True) == "ab"
    assert tok.decode(ids, skip_special_tokens=False) == f"a{EOT}b"


def test_vocabulary_and_special_ids(tok: Tokenizer, hf: Any) -> None:
    assert tok.vocab_size == len(hf) == 512
    assert tok.bos_token_id == hf.bos_token_id == tok.token_to_id(BOS)
    assert set(hf.all_special_ids) <= tok.all_special_ids  # plus the template's special added tokens
    assert all(tok.decode([i]) == "" for i in tok.all_special_ids)
    assert tok.id_to_token(tok.token_to_id(EOT) or -1) == EOT
    assert tok.id_to_token(10**6) is None and tok.token_to_id("no such token here") is None
    assert tok.batch_encode(TEXTS) == [hf.encode(t) for t in TEXTS]


def test_eos_ids_union_generation_config(tok_dir: Path, tok: Tokenizer, tmp_path: Path) -> None:
    assert tok.eos_token_ids == {tok.token_to_id(EOS)}
    d = copy_dir(tok_dir, tmp_path / "gen")
    eot = tok.token_to_id(EOT)
    (d / "generation_config.json").write_text(json.dumps({"eos_token_id": [eot, 7]}))
    assert Tokenizer.from_dir(d).eos_token_ids == {tok.token_to_id(EOS), eot, 7}
    # No generation_config.json: config.json's id is the fallback.
    (d / "generation_config.json").unlink()
    (d / "config.json").write_text(json.dumps({"eos_token_id": 9, "bos_token_id": 0}))
    assert Tokenizer.from_dir(d).eos_token_ids == {tok.token_to_id(EOS), 9}


def test_missing_tokenizer_json(tmp_path: Path) -> None:
    with pytest.raises(FileNotFoundError, match=r"tokenizer\.json.*" + tmp_path.name):
        Tokenizer.from_dir(tmp_path)


def test_special_token_given_as_added_token_dict(tok_dir: Path, tmp_path: Path) -> None:
    d = copy_dir(
        tok_dir, tmp_path / "d", {"eos_token": {"__type": "AddedToken", "content": EOT, "special": True}}
    )
    ours = Tokenizer.from_dir(d)
    theirs = transformers.AutoTokenizer.from_pretrained(str(d))
    assert ours.eos_token == EOT and ours.eos_token_id == theirs.eos_token_id
    assert ours.apply_chat_template(CHAT) == theirs.apply_chat_template(
        CHAT, tokenize=False, add_generation_prompt=True
    )


def test_bos_from_post_processor_is_added_once(tok_dir: Path, tmp_path: Path) -> None:
    d = copy_dir(tok_dir, tmp_path / "bos", {"add_bos_token": True})
    backend = BackendTokenizer.from_file(str(d / "tokenizer.json"))
    backend.post_processor = processors.TemplateProcessing(single=f"{BOS} $A", special_tokens=[(BOS, 0)])
    backend.save(str(d / "tokenizer.json"))
    ours, theirs = Tokenizer.from_dir(d), transformers.AutoTokenizer.from_pretrained(str(d))
    for text in TEXTS:
        assert ours.encode(text) == theirs.encode(text)
        if not text.startswith(BOS):  # (a BOS written in the text is encoded as well, as transformers does)
            assert ours.encode(text).count(0) == 1 and ours.encode(text)[0] == 0
    assert ours.batch_encode(["x"]) == [theirs.encode("x")]


def test_add_bos_token_without_post_processor_bos(tok_dir: Path, tmp_path: Path) -> None:
    # The config asks for a BOS the post-processor does not add: prepend it (by hand: [BOS] + plain ids).
    # transformers 5 ignores add_bos_token when tokenizer.json exists, so it is not the reference here.
    ours = Tokenizer.from_dir(copy_dir(tok_dir, tmp_path / "b", {"add_bos_token": True}))
    assert ours.encode("hi there") == [0, *ours.encode("hi there", add_special_tokens=False)]


# ---- chat templates ----

RICH_TEMPLATE = """{%- set ns = namespace(sys='') -%}
{% for m in messages %}
    {% if m['role'] == 'system' %}{% set ns.sys = m['content'] %}{% continue %}{% endif %}
    {% if m['role'] not in ['user', 'assistant'] %}{{ raise_exception('bad role ' + m['role']) }}{% endif %}
<{{ m['role'] }}>{% generation %}{{ m['content'] | trim }}{% endgeneration %}</s>
{% endfor %}
sys={{ ns.sys }} tools={{ tools | tojson }} year={{ strftime_now('%Y') }} {{ extra | default('none') }}
{% if add_generation_prompt %}<assistant>{% endif %}"""


def test_chat_template_matches_transformers(tok: Tokenizer, hf: Any) -> None:
    for gen in (True, False):
        assert tok.apply_chat_template(CHAT, gen) == hf.apply_chat_template(
            CHAT, tokenize=False, add_generation_prompt=gen
        )
    assert tok.encode_chat(CHAT) == hf.apply_chat_template(
        CHAT, tokenize=True, return_dict=False, add_generation_prompt=True
    )


def test_rich_template_from_jinja_file(tok_dir: Path, tmp_path: Path) -> None:
    d = copy_dir(tok_dir, tmp_path / "jinja")
    (d / "chat_template.jinja").write_text(RICH_TEMPLATE)  # wins over tokenizer_config's template
    ours, theirs = Tokenizer.from_dir(d), transformers.AutoTokenizer.from_pretrained(str(d))
    tools = [{"type": "function", "function": {"name": "wetter", "description": "Wetter für Köln <b>"}}]
    cases: list[dict[str, Any]] = [{}, {"tools": tools, "extra": "x"}]
    for kwargs in cases:
        got = ours.apply_chat_template(CHAT, **kwargs)
        assert got == theirs.apply_chat_template(CHAT, tokenize=False, add_generation_prompt=True, **kwargs)
    assert "Köln <b>" in ours.apply_chat_template(CHAT, tools=tools)
    bad = [*CHAT, {"role": "tool", "content": "42"}]
    with pytest.raises(Exception, match="bad role tool"):
        ours.apply_chat_template(bad)


def test_template_list_takes_default(tok_dir: Path, tmp_path: Path) -> None:
    templates = [{"name": "tool_use", "template": "TOOLS"}, {"name": "default", "template": RICH_TEMPLATE}]
    d = copy_dir(tok_dir, tmp_path / "list", {"chat_template": templates})
    theirs = transformers.AutoTokenizer.from_pretrained(str(d))
    assert Tokenizer.from_dir(d).apply_chat_template(CHAT) == theirs.apply_chat_template(
        CHAT, tokenize=False, add_generation_prompt=True
    )


def test_no_template_is_a_value_error(tok_dir: Path, tmp_path: Path) -> None:
    d = copy_dir(tok_dir, tmp_path / "none")
    cfg = json.loads((d / "tokenizer_config.json").read_text())
    cfg.pop("chat_template")
    (d / "tokenizer_config.json").write_text(json.dumps(cfg))
    with pytest.raises(ValueError, match="no chat template"):
        Tokenizer.from_dir(d).apply_chat_template(CHAT)


@pytest.mark.parametrize(
    "messages, match",
    [
        ("hello", "must be a list"),
        ([], "at least one"),
        (["hi"], r"messages\[0\] must be a dict"),
        ([{"content": "x"}], r"messages\[0\]\.role"),
        ([{"role": "wizard", "content": "x"}], "role must be one of"),
        ([{"role": "user"}], "needs a 'content'"),
        ([{"role": "user", "content": 5}], "content must be a string"),
        ([{"role": "user", "content": [{"type": "image_url", "image_url": {}}]}], r"content\[0\]"),
    ],
)
def test_validate_messages_rejects(messages: Any, match: str) -> None:
    with pytest.raises(ValueError, match=match):
        validate_messages(messages)


def test_content_parts_are_joined(tok: Tokenizer) -> None:
    parts = [{"role": "user", "content": [{"type": "text", "text": "a"}, {"type": "text", "text": "b"}]}]
    assert tok.apply_chat_template(parts) == tok.apply_chat_template([{"role": "user", "content": "a\nb"}])
    Tokenizer.validate_messages([{"role": "assistant", "content": None, "tool_calls": [{"id": "1"}]}])


# ---- incremental detokenizer ----


def stream(det: IncrementalDetokenizer, chunks: list[list[int]]) -> list[str]:
    deltas = [det.add(c) for c in chunks]
    deltas.append(det.flush())
    return deltas


def test_multibyte_split_across_tokens_is_held_back(tok: Tokenizer) -> None:
    ids = tok.encode(MULTILINGUAL_TEXT, add_special_tokens=False)
    assert sum(tok.decode([i]) == "\ufffd" for i in ids) > 50  # the test data does split characters
    det = IncrementalDetokenizer(tok, [])
    deltas = stream(det, [[i] for i in ids])
    assert not any("\ufffd" in d for d in deltas)
    assert "".join(deltas) == tok.decode(ids) == MULTILINGUAL_TEXT
    assert det.elapsed_s > 0


@pytest.mark.parametrize("seed", range(5))
def test_random_chunks_with_prompt_context(tok: Tokenizer, seed: int) -> None:
    rng = random.Random(seed)
    prompt = tok.encode("Translate: 你好 ")
    ids = tok.encode(f" 世界 😀{EOT} ok 👩‍💻 done{EOS}", add_special_tokens=False)
    chunks, i = [], 0
    while i < len(ids):
        n = rng.randint(1, 4)
        chunks.append(ids[i : i + n])
        i += n
    for skip in (True, False):
        deltas = stream(IncrementalDetokenizer(tok, prompt, skip_special_tokens=skip), chunks)
        assert not any("\ufffd" in d for d in deltas)
        assert "".join(deltas) == tok.decode(ids, skip_special_tokens=skip)


def test_truncated_character_released_by_flush(tok: Tokenizer) -> None:
    ids = tok.encode("ab😀", add_special_tokens=False)
    cut = next(k for k in range(len(ids), 0, -1) if tok.decode(ids[:k]).endswith("\ufffd"))
    det = IncrementalDetokenizer(tok, [])
    deltas = [det.add([i]) for i in ids[:cut]]
    assert "".join(deltas) == "ab"
    assert det.flush() == tok.decode(ids[:cut])[2:]  # the incomplete bytes, rendered as U+FFFD


def gpt2_byte_char(b: int) -> str:
    """The byte-level alphabet: printable bytes map to themselves, the rest to 256, 257, ... in order."""
    printable = [*range(33, 127), *range(161, 173), *range(174, 256)]
    if b in printable:
        return chr(b)
    return chr(256 + [x for x in range(256) if x not in printable].index(b))


def test_long_invalid_run_and_bounded_window(tok: Tokenizer) -> None:
    cont = tok.token_to_id(gpt2_byte_char(0x80))  # a lone UTF-8 continuation byte: always invalid
    assert cont is not None
    ids = [cont] * 40 + tok.encode(" 你好" * 300, add_special_tokens=False)
    det = IncrementalDetokenizer(tok, tok.encode("x"))
    deltas = stream(det, [[i] for i in ids])
    assert "".join(deltas) == tok.decode(ids)
    assert sum(d != "" for d in deltas[:40]) >= 2  # the junk run was not held back until the end
    assert len(det._ids) < 100  # the decode window stays short however long the output is


def build_sentencepiece_style_dir(root: Path) -> Path:
    """A Llama-2-style tokenizer: Metaspace, byte fallback, a decoder that strips one leading space."""
    vocab = {"<unk>": 0, "<s>": 1, "</s>": 2}
    vocab.update({f"<0x{b:02X}>": 3 + b for b in range(256)})
    vocab.update({c: len(vocab) + i for i, c in enumerate("▁abcdefghijklmnopqrstuvwxyz")})
    backend = BackendTokenizer(models.BPE(vocab=vocab, merges=[], byte_fallback=True, unk_token="<unk>"))
    backend.pre_tokenizer = pre_tokenizers.Metaspace(replacement="▁", prepend_scheme="first", split=False)
    steps = [decoders.Replace("▁", " "), decoders.ByteFallback(), decoders.Fuse(), decoders.Strip(" ", 1, 0)]
    backend.decoder = decoders.Sequence(steps)
    backend.add_special_tokens(
        [AddedToken(t, special=True, normalized=False) for t in ("<unk>", "<s>", "</s>")]
    )
    backend.post_processor = processors.TemplateProcessing(single="<s> $A", special_tokens=[("<s>", 1)])
    root.mkdir(parents=True, exist_ok=True)
    backend.save(str(root / "tokenizer.json"))
    cfg = {"bos_token": "<s>", "eos_token": "</s>", "unk_token": "<unk>", "add_bos_token": True}
    (root / "tokenizer_config.json").write_text(json.dumps(cfg))
    return root


def test_sentencepiece_style_tokenizer(tmp_path: Path) -> None:
    d = build_sentencepiece_style_dir(tmp_path / "sp")
    ours, theirs = Tokenizer.from_dir(d), transformers.AutoTokenizer.from_pretrained(str(d))
    for text in ("hello world", "你好 world 😀", " lead", ""):
        assert ours.encode(text) == theirs.encode(text)
        assert ours.decode(ours.encode(text)) == theirs.decode(theirs.encode(text), skip_special_tokens=True)
    prompt = ours.encode("say")
    out = ours.encode("hi 你好 😀 there", add_special_tokens=False)  # CJK/emoji as 3-4 byte tokens each
    deltas = stream(IncrementalDetokenizer(ours, prompt), [[i] for i in out])
    assert not any("\ufffd" in x for x in deltas)
    # The first output token keeps the space it has after the prompt (decode(out) alone strips it).
    assert "".join(deltas) == ours.decode(prompt + out)[len(ours.decode(prompt)) :] == " hi 你好 😀 there"


# ---- stop strings ----


def run_stop(stop: list[str], chunks: list[str], include: bool = False) -> tuple[str, str | None]:
    checker = StopChecker(stop, include)
    out, matched = "", None
    for c in chunks:
        emitted, m = checker.feed(c)
        out += emitted
        matched = matched or m
    return out + checker.flush(), matched


def reference_stop(stop: list[str], text: str, include: bool) -> tuple[str, str | None]:
    # Brute force: the first prefix of text that contains a stop string; the one ending there wins
    # (earliest start on a tie).
    for n in range(1, len(text) + 1):
        hits = [(n - len(s), s) for s in stop if text[:n].endswith(s)]
        if hits:
            start, s = min(hits)
            return text[: n if include else start], s
    return text, None


def test_stop_spanning_deltas_cut_exactly() -> None:
    assert run_stop(["STOP"], ["Hello S", "TO", "P and more"]) == ("Hello ", "STOP")
    assert run_stop(["STOP"], ["Hello S", "TO", "P and more"], include=True) == ("Hello STOP", "STOP")


def test_stop_holds_back_possible_prefix_only() -> None:
    checker = StopChecker(["</end>"], False)
    assert checker.feed("text </e") == ("text ", None)  # "</e" may still become the stop string
    assert checker.feed("x") == ("</ex", None)  # it did not
    assert checker.feed("tail </") == ("tail ", None)
    assert checker.flush() == "</"  # no stop: held text is released
    assert checker.feed("more") == ("more", None)


def test_earliest_of_several_stops_and_nothing_after() -> None:
    checker = StopChecker(["world", "lo w"], True)
    assert checker.feed("hello world, bye") == ("hello w", "lo w")
    assert checker.feed("more") == ("", None) and checker.flush() == ""
    assert run_stop(["b", "xyz"], ["xy", "b"]) == ("xy", "b")


def test_prefix_overlap_stop() -> None:
    assert run_stop(["aab"], ["a", "a", "a", "b", "c"]) == ("a", "aab")
    assert run_stop(["aab"], ["aaa", "bc"], include=True) == ("aaab", "aab")


@pytest.mark.parametrize("seed", range(20))
def test_stop_chunking_invariant(seed: int) -> None:
    rng = random.Random(seed)
    text = "".join(rng.choice("ab😀") for _ in range(30))
    stop = ["".join(rng.choice("ab😀") for _ in range(rng.randint(1, 4))) for _ in range(rng.randint(1, 3))]
    cuts = sorted(rng.sample(range(1, len(text)), 6))
    chunks = [text[i:j] for i, j in zip([0, *cuts], [*cuts, len(text)], strict=True)]
    for include in (False, True):
        assert run_stop(stop, chunks, include) == reference_stop(stop, text, include)
        assert run_stop(stop, list(text), include) == reference_stop(stop, text, include)


def test_stop_rejects_empty_string() -> None:
    with pytest.raises(ValueError, match="stop"):
        StopChecker([""], False)
