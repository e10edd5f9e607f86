"""One chat choice's text taken apart: reasoning, content and tool calls, streamed or whole.

The text goes through the reasoning parser (if any), and the content that comes out through the tool
reader (a model-format parser for ``tool_choice: "auto"``, the forced-JSON reader for ``"required"`` or
a named function). Both work on the text so far, so the one-shot message is the streamed deltas summed:
``message`` feeds the whole text and finishes; a stream feeds each new piece.

Reasoning is written under two names, ``reasoning_content`` (DeepSeek's API and vLLM before 0.18; what
the openai client's users and LangChain read) and ``reasoning`` (vLLM's name since then).
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from typing import Any

from glassbox.sampling_params import SamplingParams
from glassbox.server.chat_prompt import template_variables
from glassbox.server.protocol import ChatCompletionRequest
from glassbox.server.reasoning import REASONING_PARSERS, ReasoningParser, ReasoningStream
from glassbox.server.state import ServerState
from glassbox.server.tool_parsers import TOOL_PARSERS, AutoToolStream, ParsedCall, ToolParser
from glassbox.server.tools import (
    ForcedToolStream,
    ToolChoice,
    check_tools,
    forced_params,
    new_call_id,
)


@dataclass
class Piece:
    """What one step of a choice adds: reasoning and content text, tool call deltas (OpenAI's shape)."""

    reasoning: str = ""
    content: str = ""
    tool_calls: list[dict[str, Any]] = field(default_factory=list)


class ChoiceReader:
    """Reads one choice's growing text; ``feed`` the new text, then ``finish`` once it has ended."""

    def __init__(
        self,
        reasoning: ReasoningParser | None = None,
        tool_parser: ToolParser | None = None,
        forced: ToolChoice | None = None,
    ) -> None:
        self.reasoning = ReasoningStream(reasoning) if reasoning is not None else None
        self.tools: AutoToolStream | ForcedToolStream | None = None
        if forced is not None:
            self.tools = ForcedToolStream(forced)
        elif tool_parser is not None:
            self.tools = AutoToolStream(tool_parser)
        self.calls = 0  # tool calls opened

    def feed(self, delta: str) -> Piece:
        return self._step(delta, final=False)

    def finish(self) -> Piece:
        return self._step("", final=True)

    def _step(self, delta: str, final: bool) -> Piece:
        piece = Piece()
        if self.reasoning is not None:
            piece.reasoning, delta = self.reasoning.feed(delta, final)
        if self.tools is None:
            piece.content = delta
            return piece
        events = self.tools.feed(delta) if delta or not final else []
        if final:
            events += self.tools.finish()
        for kind, value in events:
            if kind == "content":
                piece.content += value
            elif kind == "call":
                piece.tool_calls.append(self._open(value))
            else:  # arguments of the call opened last
                piece.tool_calls.append({"index": self.calls - 1, "function": {"arguments": value}})
        return piece

    def _open(self, call: ParsedCall) -> dict[str, Any]:
        self.calls += 1
        head = {
            "index": self.calls - 1,
            "id": new_call_id(),
            "type": "function",
            "function": {"name": call.name, "arguments": ""},
        }
        if not call.arguments:
            return head
        return {**head, "function": {"name": call.name, "arguments": call.arguments}}

    def message(self, text: str) -> dict[str, Any]:
        """The whole reply as a chat message (feed everything, finish, sum the pieces)."""
        a, b = self.feed(text), self.finish()
        calls: list[dict[str, Any]] = []
        for d in a.tool_calls + b.tool_calls:
            if "id" in d:
                calls.append({"id": d["id"], "type": "function", "function": dict(d["function"])})
            else:
                calls[d["index"]]["function"]["arguments"] += d["function"]["arguments"]
        content, reasoning = a.content + b.content, a.reasoning + b.reasoning
        out: dict[str, Any] = {
            "role": "assistant",
            "content": content or (None if calls or reasoning else content),
        }
        if self.reasoning is not None:
            out["reasoning_content"] = out["reasoning"] = reasoning or None
        if calls:
            out["tool_calls"] = calls
        elif self.tools is not None:
            out["tool_calls"] = []
        return out


def delta_chunks(piece: Piece, with_reasoning: bool) -> list[dict[str, Any]]:
    """The stream deltas of a piece: text first, then each tool call delta in its own chunk (a call's
    first delta carries its id, type, name and arguments "", later ones more arguments, as OpenAI's)."""
    deltas: list[dict[str, Any]] = []
    text: dict[str, Any] = {}
    if piece.reasoning and with_reasoning:
        text["reasoning_content"] = text["reasoning"] = piece.reasoning
    if piece.content:
        text["content"] = piece.content
    if text:
        deltas.append(text)
    for call in piece.tool_calls:
        fn = call["function"]
        if "id" in call and fn["arguments"]:  # split the head from the arguments it came with
            deltas.append({"tool_calls": [{**call, "function": {"name": fn["name"], "arguments": ""}}]})
            deltas.append(
                {"tool_calls": [{"index": call["index"], "function": {"arguments": fn["arguments"]}}]}
            )
        else:
            deltas.append({"tool_calls": [call]})
    return deltas


@dataclass
class ChatPlan:
    """How a chat request's text is read: its sampling params (with a forced tool grammar), the chat
    template's extra variables, and one ``ChoiceReader`` per choice."""

    params: SamplingParams
    template_kwargs: dict[str, Any]
    tools: ToolChoice | None
    tool_parser: ToolParser | None
    reasoning: type[ReasoningParser] | None
    enable_thinking: bool

    def readers(self, n: int, prompt: str) -> list[ChoiceReader]:
        return [
            ChoiceReader(
                self.reasoning(prompt, self.enable_thinking) if self.reasoning is not None else None,
                self.tool_parser,
                self.tools if self.tools is not None and self.tools.forced else None,
            )
            for _ in range(n)
        ]


def plan_chat(state: ServerState, req: ChatCompletionRequest, params: SamplingParams) -> ChatPlan:
    """Check the request's tools and template variables; 400 naming the parameter."""
    settings = state.settings
    kwargs = template_variables(req.chat_template_kwargs)
    tools = check_tools(req.tools, req.tool_choice, req.parallel_tool_calls, settings.enable_auto_tool_choice)
    parser: ToolParser | None = None
    if tools is not None:
        kwargs["tools"] = tools.tools
        if tools.forced:
            params = forced_params(state, tools, params)
        elif tools.choice == "auto" and settings.tool_call_parser is not None:
            parser = TOOL_PARSERS[settings.tool_call_parser]()
            # the markers may be special tokens (Mistral's [TOOL_CALLS], Llama's <|python_tag|>)
            params = replace(params, skip_special_tokens=False)
    reasoning = None
    if settings.reasoning_parser is not None and params.structured_outputs is None:
        # a grammar constrains the output from its first token: there is no reasoning to split off
        reasoning = REASONING_PARSERS[settings.reasoning_parser]
    thinking = kwargs.get("enable_thinking", True) is not False
    return ChatPlan(params, kwargs, tools, parser, reasoning, thinking)


def finish_reason(reader: ChoiceReader, reason: str | None) -> str | None:
    """OpenAI's "tool_calls" when the choice called a tool and stopped on its own."""
    return "tool_calls" if reason == "stop" and reader.calls else reason


def choice_chunks(
    head: dict[str, Any],
    index: int,
    reader: ChoiceReader,
    text: str,
    logprobs: dict[str, Any] | None,
    reason: str | None,
    stop_reason: int | str | None,
) -> list[dict[str, Any]]:
    """The stream chunks for a choice's new ``text`` (and its end, when ``reason`` is set): the finish
    reason comes alone in a last chunk with an empty delta, as OpenAI's does; an aborted choice (the server
    draining) gets no closing chunk (the stream ends with an error event instead)."""
    piece = reader.feed(text)
    if reason is not None:
        end = reader.finish()
        piece = Piece(
            piece.reasoning + end.reasoning, piece.content + end.content, piece.tool_calls + end.tool_calls
        )
    deltas = delta_chunks(piece, reader.reasoning is not None)
    if not deltas and logprobs:
        deltas = [{}]
    closing = reason is not None and reason != "abort"
    if closing:
        deltas.append({})
    chunks = []
    for k, delta in enumerate(deltas):
        last = closing and k == len(deltas) - 1
        choice = {
            "index": index,
            "delta": delta,
            "logprobs": logprobs if k == 0 and not last else None,
            "finish_reason": finish_reason(reader, reason) if last else None,
            "stop_reason": stop_reason if last else None,
        }
        chunks.append({**head, "choices": [choice]})
    return chunks
