"""Structured outputs in the engine: grammars compiled by llguidance, a matcher per sequence, the token
bitmask the sampler applies.

A request's ``StructuredOutputs`` is compiled once (``GrammarCompiler.compile``, cached by its key, least
recently used out) into a matcher at the grammar's start; each of the request's sequences gets its own
copy (``GrammarState``). Before a step samples a constrained row, its matcher is brought up to date with
the tokens the sequence has appended since (``catch_up``): the engine appends every sampled token before
it schedules the next step (async output defers only the text work), and a preempted sequence keeps its
tokens, so the matcher state always equals "the output so far" with nothing to rebuild. Then one
(rows, ceil(V / 32)) int32 bitmask is filled for the constrained rows (llguidance, one call for the
batch) and added to their logits as 0 / -inf before anything else looks at them (logprobs, penalties,
temperature, top-k/top-p): the sampler's ``mask_logits``.

JSON is written on one line with ", " and ": " between items (no free whitespace: a model cannot spend
its tokens on blank lines). Once the grammar is complete only EOS (and the request's stop_token_ids)
remain allowed; a matcher that failed (it cannot, short of a bug) allows only EOS.
"""

from __future__ import annotations

import logging
import threading
from collections import OrderedDict
from typing import TYPE_CHECKING, Any

import llguidance
import torch

from glassbox.layers.host import to_device
from glassbox.structured_outputs import StructuredOutputs

if TYPE_CHECKING:
    from glassbox.tokenizer.hf_tokenizer import Tokenizer

logger = logging.getLogger(__name__)

JSON_OPTIONS: dict[str, Any] = {"whitespace_flexible": False, "item_separator": ", ", "key_separator": ": "}
CACHE_SIZE = 256  # compiled grammars kept (a nested JSON schema compiles in ~1-2 ms)
_WHAT = {
    "json": "JSON schema",
    "json_object": "JSON object grammar",
    "regex": "regex",
    "choice": "choice",
    "grammar": "grammar",
}


class GrammarError(ValueError):
    """A schema, regex, choice or grammar that cannot be compiled; the message names the problem."""


class GrammarState:
    """One sequence's matcher and how many of its output tokens the matcher has consumed."""

    __slots__ = ("matcher", "prompt_len", "consumed", "words", "eos_ids", "stop_ids", "failed")

    def __init__(
        self,
        matcher: llguidance.LLMatcher,
        prompt_len: int,
        words: int,
        eos_ids: list[int],
        stop_ids: list[int],
    ) -> None:
        self.matcher = matcher
        self.prompt_len = prompt_len
        self.consumed = 0
        self.words = words  # int32 words in a mask row
        self.eos_ids = eos_ids
        self.stop_ids = stop_ids
        self.failed = False

    def catch_up(self, token_ids: list[int]) -> None:
        """Feed the matcher the output tokens appended since the last call (``token_ids``: prompt + output)."""
        start = self.prompt_len + self.consumed
        if len(token_ids) > start:
            new = token_ids[start:]
            if not self.matcher.consume_tokens(new) and not self.failed:
                self.failed = True
                logger.warning("grammar matcher refused tokens %s: %s", new, self.matcher.get_error())
            self.consumed += len(new)

    @property
    def is_accepting(self) -> bool:
        return bool(self.matcher.is_accepting())


class GrammarCompiler:
    """Compiles StructuredOutputs for one tokenizer; thread-safe (the server checks a request on its event
    loop, the engine thread compiles it again: a cache hit)."""

    def __init__(self, tokenizer: Tokenizer, vocab_size: int, cache_size: int = CACHE_SIZE) -> None:
        self._tokenizer = tokenizer
        self.vocab_size = max(vocab_size, tokenizer.vocab_size)  # tokens a mask row covers
        self.words = (self.vocab_size + 31) // 32
        self.eos_ids = sorted(tokenizer.eos_token_ids)
        self.cache_size = cache_size
        self._lock = threading.Lock()
        self._ll_tokenizer: llguidance.LLTokenizer | None = None
        self._cache: OrderedDict[tuple[str, str], llguidance.LLMatcher] = OrderedDict()
        self.hits = 0
        self.misses = 0

    def _llg_tokenizer(self) -> llguidance.LLTokenizer:
        """llguidance's view of the vocabulary, built on first use (0.2 s for 49K tokens, measured)."""
        if self._ll_tokenizer is None:
            self._ll_tokenizer = llguidance.LLTokenizer(
                self._tokenizer.backend_json(), n_vocab=self.vocab_size, eos_token=self.eos_ids
            )
        return self._ll_tokenizer

    def compile(self, spec: StructuredOutputs) -> llguidance.LLMatcher:
        """The matcher of ``spec`` at the grammar's start (shared: copy it, do not advance it); raises
        GrammarError."""
        key = spec.key
        with self._lock:
            found = self._cache.get(key)
            if found is not None:
                self._cache.move_to_end(key)
                self.hits += 1
                return found
            tokenizer = self._llg_tokenizer()
        what = _WHAT[spec.kind]
        try:
            grammar = _grammar_text(spec)
        except ValueError as e:
            raise GrammarError(f"invalid {what}: {e}") from None
        matcher = llguidance.LLMatcher(tokenizer, grammar, log_level=0)
        if matcher.is_error():
            raise GrammarError(f"invalid {what}: {_plain(matcher.get_error())}")
        with self._lock:
            self.misses += 1
            self._cache[key] = matcher
            while len(self._cache) > self.cache_size:
                self._cache.popitem(last=False)
        return matcher

    def new_state(self, spec: StructuredOutputs, prompt_len: int, stop_token_ids: list[int]) -> GrammarState:
        """A fresh matcher for one sequence of a request (n > 1: one each)."""
        template = self.compile(spec)
        with self._lock:
            matcher = template.deep_copy()
        stops = [t for t in stop_token_ids if t < self.vocab_size]
        return GrammarState(matcher, prompt_len, self.words, self.eos_ids, stops)


def _plain(error: str) -> str:
    """llguidance's error as a user reads it: a Rust panic (an internal limit hit, with its backtrace)
    becomes one sentence; other errors are already the user's problem in words."""
    text = error.strip()
    if text.startswith("panic") or "<backtrace>" in text:
        logger.debug("llguidance panicked: %s", text)
        return "the grammar engine cannot compile it (it is too large or too complex)"
    return text


def _grammar_text(spec: StructuredOutputs) -> str:
    kind = spec.kind
    if kind == "json":
        assert isinstance(spec.json, dict)
        return str(llguidance.LLMatcher.grammar_from_json_schema(spec.json, overrides=JSON_OPTIONS))  # type: ignore[arg-type]
    if kind == "json_object":
        return str(llguidance.LLMatcher.grammar_from_json_schema({"type": "object"}, overrides=JSON_OPTIONS))  # type: ignore[arg-type]
    if kind == "regex":
        assert spec.regex is not None
        return str(llguidance.LLMatcher.grammar_from_regex(spec.regex))
    if kind == "choice":
        return str(llguidance.grammar_from("choice", spec.key[1]))
    assert spec.grammar is not None
    return str(llguidance.grammar_from("grammar", spec.grammar))  # Lark, or GBNF converted to Lark


_executor: llguidance.LLExecutor | None = None


def _llg_executor() -> llguidance.LLExecutor:
    global _executor
    if _executor is None:
        _executor = llguidance.LLExecutor(num_threads=max(1, min(8, torch.get_num_threads())))
    return _executor


def fill_bitmask(states: list[GrammarState], token_ids: list[list[int]]) -> torch.Tensor:
    """The (len(states), words) int32 host bitmask of the next token of each sequence (``token_ids``: its
    prompt + output), after catching each matcher up. Bit t % 32 of word t // 32 is set when token t may
    come next."""
    for st, ids in zip(states, token_ids, strict=True):
        st.catch_up(ids)
    words = states[0].words
    bitmask = torch.zeros((len(states), words), dtype=torch.int32)
    _llg_executor().unsafe_compute_mask_ptr(
        [(st.matcher, j) for j, st in enumerate(states)], bitmask.data_ptr(), words * 4, len(states)
    )
    as_bytes = bitmask.view(torch.uint8)
    for j, st in enumerate(states):
        extra: list[int] = []
        if st.failed or st.matcher.is_error():
            as_bytes[j] = 0
            extra = st.eos_ids
        elif st.stop_ids and st.matcher.is_accepting():
            extra = st.stop_ids
        for t in extra:
            as_bytes[j, t // 8] |= 1 << (t % 8)
    return bitmask


_TABLES: dict[tuple[torch.device, torch.dtype], torch.Tensor] = {}


def _bit_table(device: torch.device, dtype: torch.dtype) -> torch.Tensor:
    """(256, 8): for each byte value, 0 where its bit is set and -inf where not (little-endian bits)."""
    table = _TABLES.get((device, dtype))
    if table is None:
        bits = (torch.arange(256)[:, None] >> torch.arange(8)) & 1
        table = torch.zeros(256, 8, dtype=dtype).masked_fill_(bits == 0, float("-inf")).to(device)
        _TABLES[(device, dtype)] = table
    return table


def apply_bitmask(logits: torch.Tensor, bitmask: torch.Tensor, rows: torch.Tensor | None) -> None:
    """Add 0 / -inf to ``logits`` (S, V) in place: -inf for every token a mask row forbids.

    ``bitmask`` (R, W) int32 on the logits' device; ``rows`` (R,) long, the row of ``logits`` each mask row
    is for (None: all, in order). Tokens past W * 32 are forbidden. One table lookup per mask byte, then one
    add: 64 rows of 49K tokens took 2-3 ms on one core of the (shared) 2-core dev machine when quiet, 10 ms
    under load; shifting each bit out took 15-34 ms, a bool mask and masked_fill 15-29 ms."""
    n, vocab = bitmask.shape[0], logits.shape[1]
    table = _bit_table(logits.device, logits.dtype)
    bias = table.index_select(0, bitmask.view(torch.uint8).reshape(-1).long()).view(n, -1)
    if bias.shape[1] < vocab:
        bias = torch.nn.functional.pad(bias, (0, vocab - bias.shape[1]), value=float("-inf"))
    bias = bias[:, :vocab]
    if rows is None:
        logits.add_(bias)
    else:
        logits.index_add_(0, rows, bias)


def mask_logits(
    logits: torch.Tensor, rows: list[int], states: list[GrammarState], token_ids: list[list[int]]
) -> None:
    """The sampler's step: each constrained row (``rows`` of ``logits``, with its sequence's state and
    tokens) gets its grammar's mask, in one bitmask for the batch."""
    bitmask = fill_bitmask(states, token_ids)
    dev = logits.device
    if dev.type == "cuda":
        bitmask = bitmask.pin_memory().to(dev, non_blocking=True)
    whole = len(rows) == logits.shape[0]
    apply_bitmask(logits, bitmask, None if whole else to_device(rows, torch.long, dev))
