"""Logprobs in OpenAI's two formats, from the engine's per-token ``{token_id: logprob}`` dicts.

Completions: ``{tokens, token_logprobs, top_logprobs, text_offset}``; each ``top_logprobs`` entry holds the
N most likely tokens and the sampled one (up to N + 1 entries; N = 0 gives the sampled one alone), as
OpenAI's legacy API and vLLM answer.
Chat: ``{"content": [{token, logprob, bytes, top_logprobs: [{token, logprob, bytes}]}]}``; ``top_logprobs``
holds exactly the N most likely tokens, as OpenAI's chat API defines it (the sampled one only if among them).
Prompt logprobs (completions ``echo`` with ``logprobs``) take the completions format, the first prompt token
with null ``token_logprobs`` and ``top_logprobs`` (nothing precedes it), as OpenAI's legacy API; vLLM's
``prompt_logprobs`` field is a list of ``{"token id": {logprob, rank, decoded_token}}`` (null first).
The engine's dict for a token holds the top-N plus the chosen token (N + 1 entries when the chosen one is
not among the top N), so the top N are the N largest values.
"""

from __future__ import annotations

import math
from typing import Any

from glassbox.outputs import RequestOutput
from glassbox.tokenizer.hf_tokenizer import Tokenizer


def _byte_level_decoder() -> dict[str, int]:
    """The byte-level BPE alphabet (GPT-2's): printable bytes stand for themselves, the others are
    shifted to code points from 256 up, in byte order. Maps each such character back to its byte."""
    printable = [
        *range(ord("!"), ord("~") + 1),
        *range(ord("\xa1"), ord("\xac") + 1),
        *range(ord("\xae"), ord("\xff") + 1),
    ]
    chars = list(printable)
    shift = 0
    for b in range(256):
        if b not in printable:
            printable.append(b)
            chars.append(256 + shift)
            shift += 1
    return {chr(c): b for b, c in zip(printable, chars, strict=True)}


_BYTE_DECODER = _byte_level_decoder()
FLOOR = -9999.0  # stands for -inf (and NaN), which JSON cannot carry


def _finite(logprob: float | None) -> float:
    return logprob if logprob is not None and math.isfinite(logprob) else FLOOR


class LogprobFormatter:
    """Formats logprobs for one tokenizer; token strings and bytes are cached by id."""

    def __init__(self, tokenizer: Tokenizer) -> None:
        self.tokenizer = tokenizer
        self._text: dict[int, str] = {}
        self._bytes: dict[int, list[int]] = {}

    def text(self, token_id: int) -> str:
        text = self._text.get(token_id)
        if text is None:
            text = self.tokenizer.decode([token_id], skip_special_tokens=False)
            self._text[token_id] = text
        return text

    def bytes(self, token_id: int) -> list[int]:
        """The token's own bytes (a piece of a multi-byte character when its text alone is U+FFFD)."""
        raw = self._bytes.get(token_id)
        if raw is None:
            text = self.text(token_id)
            piece = self.tokenizer.id_to_token(token_id) if "\ufffd" in text else None
            if piece and all(c in _BYTE_DECODER for c in piece):
                raw = [_BYTE_DECODER[c] for c in piece]
            else:
                raw = list(text.encode("utf-8"))
            self._bytes[token_id] = raw
        return raw

    @staticmethod
    def _top(entry: dict[int, float], k: int) -> list[tuple[int, float]]:
        return sorted(entry.items(), key=lambda kv: -kv[1])[:k] if k > 0 else []

    def completion(
        self,
        token_ids: list[int],
        logprobs: list[dict[int, float]] | list[dict[int, float] | None],
        k: int,
        text_offset: int = 0,
    ) -> dict[str, Any]:
        """Completions format for ``token_ids`` (offsets start at ``text_offset``; a None entry, the first
        prompt token's, gives null logprobs)."""
        tokens: list[str] = []
        token_logprobs: list[float | None] = []
        top: list[dict[str, float] | None] = []
        offsets: list[int] = []
        for tid, entry in zip(token_ids, logprobs, strict=False):
            text = self.text(tid)
            tokens.append(text)
            offsets.append(text_offset)
            text_offset += len(text)
            if entry is None:
                token_logprobs.append(None)
                top.append(None)
                continue
            chosen = _finite(entry.get(tid))
            token_logprobs.append(chosen)
            best: dict[str, float] = {}
            for t, lp in self._top(entry, k):  # tokens with the same text (e.g. U+FFFD) keep the best value
                best.setdefault(self.text(t), _finite(lp))
            best.setdefault(text, chosen)  # the sampled token, when not among the top k
            top.append(best)
        return {
            "tokens": tokens,
            "token_logprobs": token_logprobs,
            "top_logprobs": top,
            "text_offset": offsets,
        }

    def prompt_vllm(self, out: RequestOutput, k: int) -> list[dict[str, dict[str, Any]] | None] | None:
        """vLLM's ``prompt_logprobs``: per prompt token the top ``k`` and the token itself, by token id."""
        if out.prompt_logprobs is None or out.prompt_ranks is None:
            return None
        entries: list[dict[str, dict[str, Any]] | None] = []
        for tid, entry, rank in zip(out.prompt_token_ids, out.prompt_logprobs, out.prompt_ranks, strict=True):
            if entry is None:
                entries.append(None)
                continue
            best: dict[int, tuple[float, int | None]] = {
                t: (lp, r) for r, (t, lp) in enumerate(self._top(entry, k), start=1)
            }
            best.setdefault(tid, (entry[tid], rank))
            entries.append(
                {
                    str(t): {"logprob": _finite(lp), "rank": r, "decoded_token": self.text(t)}
                    for t, (lp, r) in best.items()
                }
            )
        return entries

    def chat(self, token_ids: list[int], logprobs: list[dict[int, float]], k: int) -> list[dict[str, Any]]:
        """Chat format (the ``content`` list) for ``token_ids``."""
        content = []
        for tid, entry in zip(token_ids, logprobs, strict=False):
            content.append(
                {
                    "token": self.text(tid),
                    "logprob": _finite(entry.get(tid)),
                    "bytes": self.bytes(tid),
                    "top_logprobs": [
                        {"token": self.text(t), "logprob": _finite(lp), "bytes": self.bytes(t)}
                        for t, lp in self._top(entry, k)
                    ],
                }
            )
        return content
