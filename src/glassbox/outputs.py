"""What the engine hands back: RequestOutput with one CompletionOutput per sampled continuation."""

from __future__ import annotations

from dataclasses import dataclass, field

from glassbox.engine.sequence import RequestMetrics


@dataclass
class SampleResult:
    """What an executor returns for one sequence in a step: the next token (and its logprobs)."""

    token_id: int
    logprobs: dict[int, float] | None  # top-N plus the chosen token, or None when not asked for


@dataclass
class CompletionOutput:
    """One continuation; ``text``/``token_ids``/``logprobs`` are cumulative (everything so far)."""

    index: int
    text: str = ""
    token_ids: list[int] = field(default_factory=list)
    logprobs: list[dict[int, float]] | None = None  # per token: {token_id: logprob}, chosen one included
    finish_reason: str | None = None  # "stop" | "length" | "abort" | "error"
    stop_reason: int | str | None = None  # the stop string or stop token that ended it

    @property
    def finished(self) -> bool:
        return self.finish_reason is not None


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
