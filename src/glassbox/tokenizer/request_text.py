"""A request's text tokenized as text: special-token strings a client typed stay characters.

A chat template writes control tokens (``<|im_start|>system``) around the messages; the messages' text is
the client's. ``encode_chat_as_text`` renders the chat so that only the template's own markup becomes
control tokens: every special-token string in the request's data (message fields, tools, template variables)
is swapped for a private-use character before rendering, the rendered text is cut at the template's special
tokens (honouring their lstrip/rstrip), and each stretch between them, its swapped strings restored, is
encoded with special-token matching off (``Tokenizer.encode(split_special_tokens=True)``, transformers'
name). A request without any special-token string renders and encodes exactly as before.

Also here: the longest text ``n`` tokens can cover (a request longer than that is refused unread),
decoding long id lists in bounded pieces (each tokenizer call holds the GIL), and giving the memory a long
text's tokenization used back to the system (``release_freed_memory``).
"""

from __future__ import annotations

import ctypes
import ctypes.util
import json
import re
from collections.abc import Iterable
from functools import lru_cache
from typing import Any

from glassbox.tokenizer.detokenizer import IncrementalDetokenizer
from glassbox.tokenizer.hf_tokenizer import Tokenizer

# Planes 16 and 15 are private use: no model's vocabulary or template means anything by them. One of the two
# that the request does not use carries the swapped strings, one code point per distinct string.
_SENTINEL_PLANES = ((0x100000, 0x10FFFD), (0xF0000, 0xFFFFD))
# Normalizers that never shorten text (each input character maps to at least one character), and those
# that shorten it by a bounded factor: canonical composition joins at most 4 characters into one (U+1F8F
# is U+0391 U+0314 U+0342 U+0345). Any other normalizer (Strip, StripAccents, BertNormalizer's control-
# character removal, SentencePiece's Precompiled map, Replace with "") can delete text: no bound.
_KEEPS_LENGTH = {"Prepend", "Lowercase", "NFD", "NFKD", "Sequence"}
_COMPOSES = {"NFC", "NFKC"}
NFC_FACTOR = 4
# Ids per decode call when decoding long lists: ~1 ms of GIL each (0.7 us per id measured on a loaded
# 2-core machine), so a worker thread decoding them leaves the event loop free in between.
DECODE_PIECE = 2048
# Tokenizing text costs the tokenizers library ~390 bytes of short-lived allocations per token (measured:
# +650 MB of RSS for a 2 MB text of 1.7M tokens). They are freed, but glibc keeps the pages in the worker
# thread's arena, so the process keeps the peak; after a text this long the free pages are given back.
TRIM_CHARS = 1 << 18


@lru_cache(maxsize=8)  # per tokenizer (a server has one)
def _special_pattern(tok: Tokenizer) -> tuple[re.Pattern[str] | None, dict[str, tuple[int, bool, bool]]]:
    """The regex matching the tokenizer's special tokens (longest first) and, per token text, (id, lstrip,
    rstrip); (None, {}) when it has none."""
    decoder = tok.backend.get_added_tokens_decoder()
    added = {a.content: (i, a.lstrip, a.rstrip) for i, a in decoder.items() if a.special}
    if not added:
        return None, {}
    return re.compile("|".join(re.escape(t) for t in sorted(added, key=len, reverse=True))), added


class _Swap:
    """Special-token strings swapped for private-use characters in request data, and back."""

    def __init__(self, pattern: re.Pattern[str], plane: tuple[int, int]) -> None:
        self.pattern = pattern
        self.first, self.last = plane
        self.to_char: dict[str, str] = {}
        self.to_text: dict[str, str] = {}

    def _char(self, match: re.Match[str]) -> str:
        text = match.group()
        if text not in self.to_char:
            char = chr(self.first + len(self.to_char))
            if ord(char) > self.last:
                raise ValueError(
                    "the request holds more distinct special-token strings than can be kept as text"
                )
            self.to_char[text], self.to_text[char] = char, text
        return self.to_char[text]

    def hide(self, value: Any) -> Any:
        """``value`` (JSON-like data) with every special-token string in its strings and keys swapped."""
        if isinstance(value, str):
            return self.pattern.sub(self._char, value) if self.pattern.search(value) else value
        if isinstance(value, dict):
            return {self.hide(k): self.hide(v) for k, v in value.items()}
        if isinstance(value, (list, tuple)):
            return [self.hide(v) for v in value]
        return value

    def restore(self, text: str) -> str:
        if not self.to_text:
            return text
        chars = "".join(self.to_text)
        return re.sub(f"[{re.escape(chars)}]", lambda m: self.to_text[m.group()], text)


def _strings(value: Any) -> Iterable[str]:
    if isinstance(value, str):
        yield value
    elif isinstance(value, dict):
        for k, v in value.items():
            yield from _strings(k)
            yield from _strings(v)
    elif isinstance(value, (list, tuple)):
        for v in value:
            yield from _strings(v)


def _free_plane(data: Any, template: str) -> tuple[int, int]:
    for first, last in _SENTINEL_PLANES:
        used = re.compile(f"[{chr(first)}-{chr(last)}]")
        if not used.search(template) and not any(used.search(s) for s in _strings(data)):
            return first, last
    raise ValueError(
        "the request uses characters of both private-use planes (U+F0000-U+10FFFD), which glassbox needs "
        "to keep special-token strings as text; send special_tokens_in_user_text: true or drop them"
    )


def encode_chat_as_text(
    tok: Tokenizer,
    messages: list[dict[str, Any]],
    add_generation_prompt: bool = True,
    continue_final_message: bool = False,
    variables: dict[str, Any] | None = None,
) -> tuple[str, list[int]]:
    """(the rendered chat's text, its ids) where only the template's markup is special tokens: a special-
    token string inside the request's data is encoded as the text it is. Raises what
    ``Tokenizer.apply_chat_template`` raises."""
    variables = dict(variables or {})
    pattern, added = _special_pattern(tok)
    if pattern is None or not any(pattern.search(s) for s in _strings([messages, variables])):
        text = tok.apply_chat_template(messages, add_generation_prompt, continue_final_message, **variables)
        return text, tok.encode(text, add_special_tokens=False)  # the template wrote any BOS
    swap = _Swap(pattern, _free_plane([messages, variables], tok.chat_template or ""))
    rendered = tok.apply_chat_template(
        swap.hide(messages), add_generation_prompt, continue_final_message, **swap.hide(variables)
    )
    ids: list[int] = []
    start = 0
    for match in pattern.finditer(rendered):  # the template's own special tokens: the user's are swapped
        token_id, lstrip, rstrip = added[match.group()]
        piece = rendered[start : match.start()]
        if lstrip:  # the token takes the whitespace before it, as the tokenizers library matches it
            piece = piece.rstrip()
        ids += tok.encode(swap.restore(piece), add_special_tokens=False, split_special_tokens=True)
        ids.append(token_id)
        start = match.end()
        if rstrip:
            while start < len(rendered) and rendered[start].isspace():
                start += 1
    ids += tok.encode(swap.restore(rendered[start:]), add_special_tokens=False, split_special_tokens=True)
    return swap.restore(rendered), ids


def _normalizer_types(node: Any) -> list[str]:
    if isinstance(node, dict):
        kind = node.get("type")
        own = [str(kind)] if kind else []
        if kind == "Replace" and node.get("content") == "":
            own = ["Replace-delete"]
        return own + [t for v in node.values() for t in _normalizer_types(v)]
    if isinstance(node, list):
        return [t for v in node for t in _normalizer_types(v)]
    return []


@lru_cache(maxsize=8)
def _chars_per_token(tok: Tokenizer) -> int | None:
    """The most characters of input one token can stand for, or None when the normalizer can delete text.

    A vocabulary string's length bounds the normalized text its token covers (byte-level BPE: one
    character per byte, and an input character is at least one byte; SentencePiece: "▁" for " ", byte
    tokens "<0x41>" longer than their byte)."""
    spec = json.loads(tok.backend.to_str()).get("normalizer")
    kinds = set(_normalizer_types(spec))
    if not kinds <= _KEEPS_LENGTH | _COMPOSES | {"Replace"}:
        return None
    longest = max(len(s) for s in tok.backend.get_vocab(with_added_tokens=True))
    return longest * (NFC_FACTOR if kinds & _COMPOSES else 1)


def max_text_chars(tok: Tokenizer, max_tokens: int) -> int | None:
    """No text longer than this many characters encodes to ``max_tokens`` tokens or fewer (None: the
    tokenizer's normalizer can delete characters, so no such bound exists)."""
    per_token = _chars_per_token(tok)
    return None if per_token is None else max_tokens * per_token


def decode_in_pieces(tok: Tokenizer, ids: list[int], skip_special_tokens: bool = False) -> str:
    """``tok.decode(ids)``, DECODE_PIECE ids per call (the incremental detokenizer's windows: the same text,
    a character split across two pieces never broken), so that no call holds the GIL for long."""
    if len(ids) <= DECODE_PIECE:
        return tok.decode(ids, skip_special_tokens=skip_special_tokens)
    detok = IncrementalDetokenizer(tok, [], skip_special_tokens)
    parts = [detok.add(ids[i : i + DECODE_PIECE]) for i in range(0, len(ids), DECODE_PIECE)]
    return "".join(parts) + detok.flush()


@lru_cache(maxsize=1)
def _malloc_trim() -> Any:
    """glibc's malloc_trim, or None (another C library: nothing to do)."""
    name = ctypes.util.find_library("c")
    try:
        return ctypes.CDLL(name).malloc_trim if name else None
    except (OSError, AttributeError):
        return None


def release_freed_memory() -> None:
    """Return the allocator's free pages to the system (glibc: every arena, ~ms; ctypes lets the GIL go)."""
    trim = _malloc_trim()
    if trim is not None:
        trim(0)
