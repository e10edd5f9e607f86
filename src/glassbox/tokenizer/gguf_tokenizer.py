"""A Tokenizer built from a GGUF file's vocabulary (``tokenizer.ggml.*`` metadata) and chat template.

GGUF files carry no tokenizer.json: they store the token strings, their types (normal, control,
user-defined, byte, ...), the BPE merges or the SentencePiece scores, the special token ids and the name of
the pre-tokenizer family. This module rebuilds the equivalent ``tokenizers.Tokenizer`` (the Rust library)
and wraps it in :class:`glassbox.tokenizer.hf_tokenizer.Tokenizer`:

* ``tokenizer.ggml.model == "gpt2"``: byte-level BPE; ``tokenizer.ggml.pre`` picks the split regexes
  (llama.cpp's names: smollm, llama-bpe, qwen2, ...).
* ``tokenizer.ggml.model == "llama"``: SentencePiece BPE with byte fallback; merges are rebuilt from the
  token scores when the file has none. ``"gemma4"`` (Gemma 4's files): the same, its merges in the file.

Control tokens become special added tokens and user-defined tokens plain added tokens, so both stay whole.
A file without a chat template gets its architecture's built-in one where glassbox has it
(:mod:`glassbox.tokenizer.builtin_templates`: Gemma 3, Gemma 4).
"""

from __future__ import annotations

import logging
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from gguf import GGUFReader
from tokenizers import AddedToken, Regex, decoders, models, normalizers, pre_tokenizers
from tokenizers import Tokenizer as BackendTokenizer

from glassbox.models.gguf_check import gguf_errors
from glassbox.models.gguf_reader import GGUFCheckpoint, gguf_shard_paths, read_gguf, read_metadata
from glassbox.tokenizer.builtin_templates import BUILTIN_CHAT_TEMPLATES
from glassbox.tokenizer.hf_tokenizer import Tokenizer

logger = logging.getLogger(__name__)

SUPPORTED_TOKENIZER_MODELS = ("gpt2", "llama", "gemma4")

# tokenizer.ggml.token_type values
TOKEN_NORMAL, TOKEN_UNKNOWN, TOKEN_CONTROL, TOKEN_USER_DEFINED, TOKEN_UNUSED, TOKEN_BYTE = 1, 2, 3, 4, 5, 6

# Split regexes of the byte-level BPE pre-tokenizer families, as the models' own tokenizer.json files
# spell them (Oniguruma syntax, which the tokenizers library uses).
_GPT2 = r"'s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+"
_LLAMA3 = (
    r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}"
    r"| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+"
)
_QWEN2 = (
    r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}"
    r"| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+"
)
_UPPER = r"[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}]"
_LOWER = r"[\p{Ll}\p{Lm}\p{Lo}\p{M}]"
_TEKKEN = (
    rf"[^\r\n\p{{L}}\p{{N}}]?{_UPPER}*{_LOWER}+|[^\r\n\p{{L}}\p{{N}}]?{_UPPER}+{_LOWER}*"
    r"|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n/]*|\s*[\r\n]+|\s+(?!\S)|\s+"
)
_CONTRACTION = r"(?i:'s|'t|'re|'ve|'m|'ll|'d)?"
_GPT4O = (
    rf"[^\r\n\p{{L}}\p{{N}}]?{_UPPER}*{_LOWER}+{_CONTRACTION}|[^\r\n\p{{L}}\p{{N}}]?{_UPPER}+{_LOWER}*{_CONTRACTION}"
    r"|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n/]*|\s*[\r\n]+|\s+(?!\S)|\s+"
)


def _family(regexes: tuple[str, ...], *names: str) -> dict[str, tuple[str, ...]]:
    return dict.fromkeys(names, regexes)


# tokenizer.ggml.pre -> regexes applied in turn (each splits the pieces the previous one left).
PRE_TOKENIZER_SPLITS: dict[str, tuple[str, ...]] = {
    **_family((_GPT2,), "default", "gpt-2", "mpt", "olmo", "jais", "exaone4"),
    # StarCoder-style: every digit on its own, then GPT-2's regex.
    **_family(
        (r"\p{N}", _GPT2), "starcoder", "refact", "command-r", "smollm", "codeshell", "exaone", "minerva-7b"
    ),
    **_family(
        (_LLAMA3,),
        *("llama3", "llama-v3", "llama-bpe", "falcon3", "falcon-h1", "pixtral", "midm-2.0", "lfm2"),
        *("dbrx", "smaug-bpe"),
    ),
    **_family((_QWEN2,), "qwen2", "deepseek-r1-qwen", "megrez", "stablelm2", "hunyuan"),
    **_family((_TEKKEN,), "tekken"),
    **_family((_GPT4O,), "gpt-4o", "llama4", "minimax-m2"),
}
# Families whose tokenizer.json has ignore_merges (a piece that is a whole token is taken as it is), and
# for which llama.cpp adds BOS when the file does not say.
_IGNORE_MERGES = {
    "llama3",
    "llama-v3",
    "llama-bpe",
    "falcon3",
    "falcon-h1",
    "pixtral",
    "midm-2.0",
    "lfm2",
    "tekken",
}

# Control tokens that end a turn; like llama.cpp, generation also stops on these.
_END_OF_TURN_TEXTS = (
    "<|eot_id|>",
    "<|eom_id|>",
    "<|im_end|>",
    "<|end|>",
    "<end_of_turn>",
    "<turn|>",  # Gemma 4
    "<|endoftext|>",
    "<|end_of_text|>",
    "<EOT>",
)
_SPECIAL_ID_KEYS = {"bos_token": "bos", "eos_token": "eos", "unk_token": "unknown", "pad_token": "padding"}


def _pre_tokenizer_splits(pre: str | None) -> tuple[str, ...]:
    if pre in PRE_TOKENIZER_SPLITS:
        return PRE_TOKENIZER_SPLITS[pre]
    logger.warning("GGUF pre-tokenizer %r is not known; splitting text as GPT-2 does", pre)
    return (_GPT2,)


def _split_merge(merge: str) -> tuple[str, str]:
    """A merge "left right"; the separator is the first space after the first character."""
    cut = merge.find(" ", 1)
    if cut < 0:
        raise ValueError(f"GGUF merge {merge!r} is not two tokens separated by a space")
    return merge[:cut], merge[cut + 1 :]


def merges_from_scores(tokens: list[str], scores: list[float]) -> list[tuple[str, str]]:
    """BPE merges that reproduce SentencePiece's score-driven merging of a vocabulary.

    Every token that splits into two vocabulary tokens gives a merge per split; merges are ranked by the
    merged token's score (best first), then by longer left and right parts, then by vocabulary order.
    """
    vocab = set(tokens)
    ranked: list[tuple[float, int, int, int, str, str]] = []
    for index, (token, score) in enumerate(zip(tokens, scores, strict=True)):
        for cut in range(1, len(token)):
            left, right = token[:cut], token[cut:]
            if left in vocab and right in vocab:
                ranked.append((-score, -len(left), -len(right), index, left, right))
    ranked.sort()
    return [(left, right) for *_, left, right in ranked]


def _vocab(tokens: list[str]) -> dict[str, int]:
    vocab = {token: i for i, token in enumerate(tokens)}
    if len(vocab) != len(tokens):
        logger.warning(
            "GGUF vocabulary repeats %d token strings; the last id of each wins", len(tokens) - len(vocab)
        )
    return vocab


def _byte_level_backend(meta: Mapping[str, Any], tokens: list[str]) -> BackendTokenizer:
    merges = [_split_merge(m) for m in meta.get("tokenizer.ggml.merges") or []]
    pre = meta.get("tokenizer.ggml.pre")
    model = models.BPE(vocab=_vocab(tokens), merges=merges, ignore_merges=pre in _IGNORE_MERGES)
    backend = BackendTokenizer(model)
    splits = [pre_tokenizers.Split(Regex(r), behavior="isolated") for r in _pre_tokenizer_splits(pre)]
    backend.pre_tokenizer = pre_tokenizers.Sequence(
        [*splits, pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)]
    )
    backend.decoder = decoders.ByteLevel()
    return backend


def _sentencepiece_backend(meta: Mapping[str, Any], tokens: list[str]) -> BackendTokenizer:
    if meta.get("tokenizer.ggml.merges"):
        merges = [_split_merge(m) for m in meta["tokenizer.ggml.merges"]]
    else:
        scores = meta.get("tokenizer.ggml.scores") or [0.0] * len(tokens)
        if len(scores) != len(tokens):
            raise ValueError(f"GGUF tokenizer lists {len(tokens)} tokens but {len(scores)} scores")
        merges = merges_from_scores(tokens, [float(s) for s in scores])
    unk_id = meta.get("tokenizer.ggml.unknown_token_id")
    unk = tokens[unk_id] if isinstance(unk_id, int) and 0 <= unk_id < len(tokens) else None
    model = models.BPE(vocab=_vocab(tokens), merges=merges, unk_token=unk, fuse_unk=True, byte_fallback=True)
    backend = BackendTokenizer(model)
    space_prefix = bool(meta.get("tokenizer.ggml.add_space_prefix", True))
    # As llama.cpp (and SentencePiece) do: spaces become U+2581 "▁" and, with the prefix, every stretch of
    # text between special tokens gets one more in front ("hi" -> "▁hi", " hi" -> "▁▁hi").
    replace = normalizers.Replace(" ", "\u2581")
    backend.normalizer = (
        normalizers.Sequence([normalizers.Prepend("\u2581"), replace]) if space_prefix else replace
    )
    steps = [decoders.Replace("\u2581", " "), decoders.ByteFallback(), decoders.Fuse()]
    if space_prefix:
        steps.append(decoders.Strip(" ", 1, 0))
    backend.decoder = decoders.Sequence(steps)
    if meta.get("tokenizer.ggml.remove_extra_whitespaces"):
        logger.warning("GGUF tokenizer asks to remove extra whitespace; this tokenizer keeps it")
    return backend


def build_backend(meta: Mapping[str, Any]) -> BackendTokenizer:
    """The ``tokenizers.Tokenizer`` a GGUF vocabulary describes, with its control/user-defined added tokens."""
    kind = meta.get("tokenizer.ggml.model")
    tokens = meta.get("tokenizer.ggml.tokens")
    if kind not in SUPPORTED_TOKENIZER_MODELS:
        raise ValueError(
            f"GGUF tokenizer model {kind!r} is not supported; supported: {', '.join(SUPPORTED_TOKENIZER_MODELS)}"
        )
    if not isinstance(tokens, list) or not tokens:
        raise ValueError("GGUF metadata has no tokenizer.ggml.tokens")
    # gemma4: BPE over the text with spaces as U+2581 and byte fallback, merges in the file (llama.cpp's
    # llama-vocab.cpp reads it so): the SentencePiece path with the file's merges
    backend = _byte_level_backend(meta, tokens) if kind == "gpt2" else _sentencepiece_backend(meta, tokens)
    types = _token_types(meta, tokens)
    control = [t for t, k in zip(tokens, types, strict=True) if k == TOKEN_CONTROL]
    user = [t for t, k in zip(tokens, types, strict=True) if k == TOKEN_USER_DEFINED]
    backend.add_special_tokens([AddedToken(t, special=True, normalized=False) for t in control])
    backend.add_tokens([AddedToken(t, special=False, normalized=False) for t in user])
    size = backend.get_vocab_size(with_added_tokens=True)
    if size != len(tokens):
        logger.warning(
            "GGUF tokenizer has %d ids after adding its special tokens; the file lists %d", size, len(tokens)
        )
    return backend


def _token_types(meta: Mapping[str, Any], tokens: list[str]) -> list[int]:
    """tokenizer.ggml.token_type (all normal when absent); ValueError when its length differs from the tokens'."""
    types = meta.get("tokenizer.ggml.token_type")
    if types is None:
        return [TOKEN_NORMAL] * len(tokens)
    if len(types) != len(tokens):
        raise ValueError(f"GGUF tokenizer lists {len(tokens)} tokens but {len(types)} token types")
    return [int(k) for k in types]


def _token_id(meta: Mapping[str, Any], key: str, count: int) -> int | None:
    value = meta.get(f"tokenizer.ggml.{key}_token_id")
    return int(value) if isinstance(value, int) and 0 <= value < count else None


def end_of_generation_ids(meta: Mapping[str, Any]) -> set[int]:
    """Ids that end generation: eos, eot and eom, plus control tokens named like an end of turn."""
    tokens: list[str] = meta["tokenizer.ggml.tokens"]
    types = _token_types(meta, tokens)
    ids = {i for key in ("eos", "eot", "eom") if (i := _token_id(meta, key, len(tokens))) is not None}
    special = {TOKEN_CONTROL, TOKEN_USER_DEFINED}
    ids |= {
        i
        for i, (t, k) in enumerate(zip(tokens, types, strict=True))
        if k in special and t in _END_OF_TURN_TEXTS
    }
    return ids


def _metadata(source: GGUFCheckpoint | GGUFReader | Mapping[str, Any]) -> Mapping[str, Any]:
    if isinstance(source, GGUFCheckpoint):
        return source.metadata
    if isinstance(source, GGUFReader):
        return read_metadata(source)
    return source


def tokenizer_from_gguf(source: GGUFCheckpoint | GGUFReader | Mapping[str, Any]) -> Tokenizer:
    """The Tokenizer of a GGUF checkpoint, reader, or metadata dict (see :func:`read_metadata`).

    Raises ValueError for a tokenizer model other than gpt2 (byte-level BPE) or llama (SentencePiece).
    """
    meta = _metadata(source)
    backend = build_backend(meta)
    tokens: list[str] = meta["tokenizer.ggml.tokens"]
    special = {
        name: tokens[i]
        for name, key in _SPECIAL_ID_KEYS.items()
        if (i := _token_id(meta, key, len(tokens))) is not None
    }
    kind = meta.get("tokenizer.ggml.model")
    default_bos = kind in ("llama", "gemma4") or meta.get("tokenizer.ggml.pre") in _IGNORE_MERGES
    return Tokenizer(
        backend,
        special_tokens=special,
        chat_template=chat_template(meta),
        extra_eos_token_ids=sorted(end_of_generation_ids(meta)),
        fallback_bos_token_id=_token_id(meta, "bos", len(tokens)),
        add_bos_token=bool(meta.get("tokenizer.ggml.add_bos_token", default_bos)),
        add_eos_token=bool(meta.get("tokenizer.ggml.add_eos_token", False)),
    )


def chat_template(meta: Mapping[str, Any]) -> str | None:
    """The file's ``tokenizer.chat_template``, else its architecture's built-in template, else None."""
    template = meta.get("tokenizer.chat_template")
    if isinstance(template, str):
        return template
    builtin = BUILTIN_CHAT_TEMPLATES.get(str(meta.get("general.architecture")))
    if builtin is not None:
        logger.info("GGUF file has no chat template; using glassbox's %s one", meta["general.architecture"])
    return builtin


def tokenizer_from_gguf_path(path: str | Path) -> Tokenizer:
    """The Tokenizer of the GGUF checkpoint at ``path`` (a file, any shard, or a directory holding one)."""
    first = gguf_shard_paths(path)[0]
    reader = read_gguf(first)
    with gguf_errors(first):
        return tokenizer_from_gguf(reader)
