"""Prompts of an exact token length: token counters (server /tokenize, local tokenizer, estimate) and a
prompt builder calibrated against one of them.

The builder writes prompts as runs of " word" pieces. Byte-level BPE and SentencePiece tokenizers split
text at those spaces before merging, so a prompt's token count is the sum of its words' costs plus a fixed
overhead (BOS and the like). Calibration measures each candidate word's cost and the overhead with the
counter, then checks that the sum holds on sample prompts; when it does, prompts are built without further
calls. When it does not (or the counter only estimates), the lengths are reported as approximate.
"""

from __future__ import annotations

import logging
import random
from dataclasses import dataclass, field
from pathlib import Path
from typing import Protocol

import httpx

logger = logging.getLogger(__name__)

# Common English and code words; most are one token in any vocabulary of a few thousand entries or more.
CANDIDATE_WORDS = (
    "the of and to in is for on that with as it at by from this be or are an not was but all can has had "
    "have will one we you they he she his her their our more some other new time year day way man world "
    "life hand part child eye woman place work week case point number group problem fact water story "
    "house money game system line data value list type name file path code test self def return import "
    "class if else while none true false int str len range print get set key item node size count index "
    "start end open read write next last first left right up down out over under into about after before "
    "then when where which what who how why there here each every many much most very just also only "
    "good great small large long short high low old young big little same different early late able "
    "red blue green black white light dark city road river tree stone fire wind rain snow sun moon star"
).split()

REF_TEXT = "Note"  # the text each word is measured after: cost(w) = count(REF + " w") - count(REF)


class TokenCounter(Protocol):
    """Counts the tokens a server will see for a prompt (including the BOS it adds)."""

    source: str  # "server", "local" or "estimate"

    def count(self, text: str) -> int: ...


class ServerTokenCounter:
    """Counts with the server's POST /tokenize: vLLM / glassbox ({"model","prompt"}) or llama.cpp ({"content"})."""

    source = "server"

    def __init__(self, client: httpx.Client, base_url: str, model: str) -> None:
        self.client = client
        self.base_url = base_url.rstrip("/")
        self.model = model
        self._style: str | None = None

    def _payloads(self, text: str) -> list[tuple[str, dict[str, object]]]:
        styles: list[tuple[str, dict[str, object]]] = [
            ("openai", {"model": self.model, "prompt": text}),
            ("llamacpp", {"content": text, "add_special": True}),
        ]
        return [s for s in styles if s[0] == self._style] if self._style else styles

    def count(self, text: str) -> int:
        last_error = "no response"
        for style, payload in self._payloads(text):
            try:
                r = self.client.post(f"{self.base_url}/tokenize", json=payload)
            except httpx.HTTPError as e:
                last_error = repr(e)
                continue
            if r.status_code != 200:
                last_error = f"HTTP {r.status_code}"
                continue
            body = r.json()
            if isinstance(body, dict) and isinstance(body.get("count"), int):
                self._style = style
                return int(body["count"])
            if isinstance(body, dict) and isinstance(body.get("tokens"), list):
                self._style = style
                return len(body["tokens"])
            last_error = "no tokens in the reply"
        raise RuntimeError(f"/tokenize failed: {last_error}")

    def available(self) -> bool:
        """Whether the server answers /tokenize at all."""
        try:
            self.count(REF_TEXT)
        except RuntimeError:
            return False
        return True


class LocalTokenCounter:
    """Counts with a local Hugging Face tokenizer directory or a GGUF file's vocabulary (--tokenizer)."""

    source = "local"

    def __init__(self, path: str | Path) -> None:
        from glassbox.tokenizer import Tokenizer

        if str(path).endswith(".gguf"):
            from glassbox.tokenizer.gguf_tokenizer import tokenizer_from_gguf_path

            self.tokenizer = tokenizer_from_gguf_path(path)
        else:
            self.tokenizer = Tokenizer.from_dir(path)

    def count(self, text: str) -> int:
        return len(self.tokenizer.encode(text))


class EstimateTokenCounter:
    """No tokenizer at hand: one token per word. Lengths built with it are reported as estimates."""

    source = "estimate"

    def count(self, text: str) -> int:
        return len(text.split())


@dataclass
class PromptBuilder:
    """Builds prompts of a given token length from calibrated word costs."""

    word_costs: dict[str, int]
    overhead: int  # tokens a prompt carries beyond its words (BOS, ...)
    exact: bool  # calibration confirmed that counts add up
    source: str  # the counter's source
    _by_cost: dict[int, list[str]] = field(default_factory=dict, repr=False)

    def __post_init__(self) -> None:
        for word, cost in self.word_costs.items():
            self._by_cost.setdefault(cost, []).append(word)
        if 1 not in self._by_cost:
            self.exact = False  # without a one-token word some lengths cannot be hit

    def words(self, n_tokens: int, rng: random.Random) -> str:
        """Text of " word" pieces costing n_tokens (no overhead); may fall short by one if no 1-token word."""
        pieces: list[str] = []
        remaining = n_tokens
        costs = sorted(self._by_cost)
        while remaining > 0:
            fitting = [c for c in costs if c <= remaining]
            if not fitting:
                break
            # weight by how many words carry each cost, so that prompts look varied
            cost = rng.choices(fitting, weights=[len(self._by_cost[c]) for c in fitting])[0]
            pieces.append(" " + rng.choice(self._by_cost[cost]))
            remaining -= cost
        return "".join(pieces)

    def prompt(self, n_tokens: int, rng: random.Random, prefix: str = "", prefix_tokens: int = 0) -> str:
        """A prompt of n_tokens in all (overhead included); ``prefix`` (built by :meth:`prefix`) leads it."""
        body = max(n_tokens - self.overhead - prefix_tokens, 0)
        return prefix + self.words(body, rng)

    def prefix(self, n_tokens: int, rng: random.Random) -> str:
        """A shared prefix costing n_tokens of the prompt's total (overhead included)."""
        return self.words(max(n_tokens - self.overhead, 0), rng)

    def prefix_body_tokens(self, n_tokens: int) -> int:
        """Tokens the prefix text itself carries (the overhead is counted once, with the prompt)."""
        return max(n_tokens - self.overhead, 0)


def calibrate(counter: TokenCounter, seed: int = 0, samples: int = 3) -> PromptBuilder:
    """Measure word costs and the per-prompt overhead with ``counter``; check additivity on samples."""
    if counter.source == "estimate":
        return PromptBuilder({w: 1 for w in CANDIDATE_WORDS}, overhead=0, exact=False, source="estimate")
    ref = counter.count(REF_TEXT)
    costs: dict[str, int] = {}
    for word in CANDIDATE_WORDS:
        cost = counter.count(f"{REF_TEXT} {word}") - ref
        if 1 <= cost <= 4:
            costs[word] = cost
    if not costs:
        raise RuntimeError("token calibration failed: no candidate word has a cost of 1-4 tokens")
    builder = PromptBuilder(costs, overhead=0, exact=True, source=counter.source)
    rng = random.Random(seed)
    first = builder.words(17, rng)
    builder.overhead = counter.count(first) - sum(costs[w] for w in first.split())
    for n in (5, 64, 211)[:samples]:
        text = builder.prompt(n + builder.overhead, rng)
        got = counter.count(text)
        if got != n + builder.overhead:
            logger.warning(
                "prompt lengths are approximate: counts do not add up (%d built, %d counted)",
                n + builder.overhead,
                got,
            )
            builder.exact = False
            break
    return builder
