"""What the engine hands back: RequestOutput with one CompletionOutput per sampled continuation."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from glassbox.anatomy import RequestMetrics


@dataclass
class SampleResult:
    """What an executor returns for one sequence in a step: the next token (and its logprobs)."""

    token_id: int
    logprobs: dict[int, float] | None  # top-N plus the chosen token, or None when not asked for
    # speculative decoding: the drafts verification accepted, in order, before ``token_id``
    accepted: list[SampleResult] = field(default_factory=list)


class CompletionOutput:
    """One continuation; ``text``/``token_ids``/``logprobs`` are cumulative (everything so far).

    The engine builds one per request and step (:meth:`snapshot`) from its sequence's append-only token and
    logprob lists as they stand: the copy of a list is taken when ``token_ids`` or ``logprobs`` is first
    read, so that a step costs nothing per token already generated, and reading a step's output later gives
    what it held at that step."""

    __slots__ = ("index", "text", "finish_reason", "stop_reason", "_tokens", "_logprobs", "_source")

    def __init__(
        self,
        index: int,
        text: str = "",
        token_ids: list[int] | None = None,
        logprobs: list[dict[int, float]] | None = None,  # per token: {token_id: logprob}, chosen one included
        finish_reason: str | None = None,  # "stop" | "length" | "abort" | "error"
        stop_reason: int | str | None = None,  # the stop string or stop token that ended it
    ) -> None:
        self.index = index
        self.text = text
        self.finish_reason = finish_reason
        self.stop_reason = stop_reason
        self._tokens: list[int] = [] if token_ids is None else token_ids
        self._logprobs = logprobs
        # (token list, first output index, end, logprob list or None, its end) until first read
        self._source: tuple[list[int], int, int, list[dict[int, float]] | None, int] | None = None

    @classmethod
    def snapshot(
        cls,
        index: int,
        text: str,
        tokens: list[int],  # prompt + output, appended to only
        prompt_len: int,
        logprobs: list[dict[int, float]] | None,  # appended to only
        finish_reason: str | None,
        stop_reason: int | str | None,
    ) -> CompletionOutput:
        out = cls(index, text, None, None, finish_reason, stop_reason)
        out._source = (tokens, prompt_len, len(tokens), logprobs, 0 if logprobs is None else len(logprobs))
        return out

    def _materialize(self) -> None:
        assert self._source is not None
        tokens, start, end, logprobs, lp_end = self._source
        self._tokens = tokens[start:end]
        self._logprobs = None if logprobs is None else logprobs[:lp_end]
        self._source = None

    @property
    def token_ids(self) -> list[int]:
        if self._source is not None:
            self._materialize()
        return self._tokens

    @token_ids.setter
    def token_ids(self, value: list[int]) -> None:
        if self._source is not None:
            self._materialize()
        self._tokens = value

    @property
    def logprobs(self) -> list[dict[int, float]] | None:
        if self._source is not None:
            self._materialize()
        return self._logprobs

    @logprobs.setter
    def logprobs(self, value: list[dict[int, float]] | None) -> None:
        if self._source is not None:
            self._materialize()
        self._logprobs = value

    @property
    def num_tokens(self) -> int:
        """``len(token_ids)``, without copying it."""
        if self._source is not None:
            return self._source[2] - self._source[1]
        return len(self._tokens)

    @property
    def finished(self) -> bool:
        return self.finish_reason is not None

    def _fields(self) -> tuple[Any, ...]:
        return (self.index, self.text, self.token_ids, self.logprobs, self.finish_reason, self.stop_reason)

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, CompletionOutput):
            return NotImplemented
        return self._fields() == other._fields()

    __hash__ = None  # type: ignore[assignment]  # mutable, as the dataclass it replaces

    def __repr__(self) -> str:
        names = ("index", "text", "token_ids", "logprobs", "finish_reason", "stop_reason")
        fields = ", ".join(f"{n}={v!r}" for n, v in zip(names, self._fields(), strict=True))
        return f"CompletionOutput({fields})"


@dataclass
class RequestOutput:
    """A request's state after an engine step (or its final result)."""

    request_id: str
    prompt: str | None
    prompt_token_ids: list[int]
    outputs: list[CompletionOutput]
    finished: bool = False
    metrics: RequestMetrics | None = None
    error: str | None = None
    # SamplingParams.prompt_logprobs: per prompt token {token_id: logprob} (the top N and the prompt's own
    # token), None for the first; ``prompt_ranks`` each prompt token's rank (1 = the most likely). Set
    # once complete (when the first token is sampled), else None
    prompt_logprobs: list[dict[int, float] | None] | None = None
    prompt_ranks: list[int | None] | None = None

    # Shortcuts to the first continuation (the common n=1 case).
    @property
    def text(self) -> str:
        return self.outputs[0].text

    @property
    def token_ids(self) -> list[int]:
        return self.outputs[0].token_ids

    @property
    def finish_reason(self) -> str | None:
        return self.outputs[0].finish_reason

    @property
    def logprobs(self) -> list[dict[int, float]] | None:
        return self.outputs[0].logprobs
