"""One assistant reply as a sequence of blocks (reasoning, text, tool calls), streamed or whole: what the
Anthropic, Ollama and Responses doors share on top of the chat path (server/chat.py's ``start_chat``).

A choice's text goes through its ``ChoiceReader`` (reasoning parser, then tool reader) into ``Piece``s;
``Blocks`` turns those into blocks that are opened, extended and closed once each, in order (Anthropic's
content blocks, the Responses API's output items). The one-shot reply is built by the same ``Blocks`` from
the whole text, so a streamed reply equals the one-shot one as the OpenAI door's does.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncGenerator, AsyncIterator
from contextlib import aclosing, suppress
from dataclasses import dataclass
from datetime import datetime, timezone
from typing import Any, TypeVar

from starlette.requests import Request

from glassbox.engine.async_engine import RequestError
from glassbox.outputs import RequestOutput
from glassbox.server.chat import ChatRun
from glassbox.server.chat_output import Piece
from glassbox.server.errors import ApiError
from glassbox.server.generation import collect, iterate, trace_spans, watch_disconnect

T = TypeVar("T")


@dataclass
class Block:
    """One block of a reply: ``kind`` "reasoning", "text" or "call"; ``text`` is the reasoning or text so
    far, or a call's arguments (JSON text) so far."""

    kind: str
    index: int  # position among the reply's blocks
    text: str = ""
    name: str = ""  # a call's function name
    call_id: str = ""  # a call's id ("call_" and 24 letters and digits)


# ("open", block, ""), ("delta", block, the new text), ("close", block, "")
Event = tuple[str, Block, str]


class Blocks:
    """Pieces of one choice as blocks; ``feed`` and ``close`` return the events in order."""

    def __init__(self) -> None:
        self.blocks: list[Block] = []
        self.open: Block | None = None

    def feed(self, piece: Piece) -> list[Event]:
        events: list[Event] = []
        if piece.reasoning:
            events += self._extend("reasoning", piece.reasoning)
        if piece.content:
            events += self._extend("text", piece.content)
        for call in piece.tool_calls:
            fn = call["function"]
            if "id" in call:  # a new call: its id and name, maybe its first arguments
                events += self.close()
                self.open = Block("call", len(self.blocks), name=fn["name"], call_id=call["id"])
                self.blocks.append(self.open)
                events.append(("open", self.open, ""))
            if fn.get("arguments"):
                assert self.open is not None and self.open.kind == "call", "arguments of no open call"
                self.open.text += fn["arguments"]
                events.append(("delta", self.open, fn["arguments"]))
        return events

    def close(self) -> list[Event]:
        if self.open is None:
            return []
        block, self.open = self.open, None
        return [("close", block, "")]

    def _extend(self, kind: str, text: str) -> list[Event]:
        events: list[Event] = []
        if self.open is None or self.open.kind != kind:
            events += self.close()
            self.open = Block(kind, len(self.blocks))
            self.blocks.append(self.open)
            events.append(("open", self.open, ""))
        self.open.text += text
        events.append(("delta", self.open, text))
        return events

    def of(self, kind: str) -> list[Block]:
        return [b for b in self.blocks if b.kind == kind]

    def joined(self, kind: str) -> str:
        return "".join(b.text for b in self.of(kind))


@dataclass
class Ending:
    """How a reply ended: ``reason`` "tool_calls" (it called a tool and stopped on its own), "stop" or
    "length"; the stop string that ended it; ``fitted``: at the length limit that the room left in the
    context set (rather than the request's own max_tokens)."""

    reason: str
    stop_sequence: str | None = None
    fitted: bool = False


def ending(run: ChatRun, final: RequestOutput, blocks: Blocks) -> Ending:
    o = final.outputs[0]
    reason = o.finish_reason or "stop"
    if reason == "stop" and blocks.of("call"):
        return Ending("tool_calls")
    if reason == "length":
        return Ending("length", fitted=run.fitted)
    return Ending(reason, o.stop_reason if isinstance(o.stop_reason, str) else None)


@dataclass
class Counts:
    """Token counts of a finished reply: the prompt, the part of it the prefix cache held, the output."""

    prompt: int
    cached: int
    output: int


def counts(run: ChatRun, final: RequestOutput) -> Counts:
    cached = final.metrics.cached_prompt_tokens if final.metrics is not None else 0
    return Counts(len(run.job.prompts[0]), cached, len(final.outputs[0].token_ids))


async def whole_reply(run: ChatRun, request: Request) -> tuple[Blocks, RequestOutput]:
    """Wait for the reply (aborted if the client leaves) and take it apart into blocks."""
    final = (await collect(run.job, request))[0]
    reader, blocks = run.readers[0], Blocks()
    blocks.feed(reader.feed(final.outputs[0].text))
    blocks.feed(reader.finish())
    blocks.close()
    return blocks, final


@dataclass
class Step:
    """What one engine output adds to a streamed reply; ``final`` is set on the last step."""

    events: list[Event]
    blocks: Blocks
    final: RequestOutput | None = None


async def reply_steps(run: ChatRun, request: Request) -> AsyncGenerator[Step, None]:
    """The reply's block events as the engine produces them, ending with a step that holds the final
    output. Raises ApiError when the engine fails the request or the server aborts it (shutting down);
    the request is aborted when the client leaves or the caller stops reading."""
    job, reader, blocks = run.job, run.readers[0], Blocks()
    watcher = watch_disconnect(request, job)
    sent = 0
    try:
        async with aclosing(iterate(job)) as outputs:
            async for _, out in outputs:
                o = out.outputs[0]
                if o.finish_reason == "abort":
                    raise ApiError(503, "the request was aborted: the server is shutting down")
                events = blocks.feed(reader.feed(o.text[sent:]))
                sent = len(o.text)
                if out.finished:
                    events += blocks.feed(reader.finish()) + blocks.close()
                    trace_spans(request, job, [out])
                    yield Step(events, blocks, out)
                    return
                if events:
                    yield Step(events, blocks)
    except RequestError as e:
        raise ApiError(e.status if e.status in (400, 503) else 500, e.message) from None
    finally:
        watcher.cancel()
        job.abort_unfinished()


async def with_heartbeat(items: AsyncIterator[T], interval_s: float) -> AsyncGenerator[T | None, None]:
    """``items``, with a None each time ``interval_s`` passes without one (a keep-alive for clients that
    time out an idle stream while a long prompt is prefilled)."""
    it = aiter(items)
    pending: asyncio.Future[T] = asyncio.ensure_future(anext(it))
    try:
        while True:
            done, _ = await asyncio.wait({pending}, timeout=interval_s)
            if not done:
                yield None
                continue
            try:
                item = pending.result()
            except StopAsyncIteration:
                return
            yield item
            pending = asyncio.ensure_future(anext(it))
    finally:
        if not pending.done():
            pending.cancel()
            with suppress(BaseException):
                await pending
        aclose = getattr(it, "aclose", None)
        if aclose is not None:
            await aclose()


def call_input(arguments: str) -> dict[str, Any]:
    """A call's arguments as an object (Anthropic's ``input``, Ollama's ``arguments``); {} when they do not
    parse (a forced call cut short by the length limit)."""
    try:
        value = json.loads(arguments) if arguments.strip() else {}
    except ValueError:
        return {}
    return value if isinstance(value, dict) else {}


def rfc3339_now() -> str:
    """The current UTC time as Ollama writes ``created_at`` (RFC 3339, microseconds, ``Z``)."""
    return datetime.now(timezone.utc).isoformat().replace("+00:00", "Z")
