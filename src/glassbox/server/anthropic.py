"""Anthropic's Messages API on the chat path: ``POST /v1/messages`` (JSON, or server-sent events with
``stream``) and ``POST /v1/messages/count_tokens``. The request is translated by
server/anthropic_request.py and run by server/chat.py's ``start_chat``, as an OpenAI chat request is.

- Content: a reasoning parser's reasoning as ``thinking`` blocks (``signature`` ""), the answer as a
  ``text`` block, tool calls as ``tool_use`` blocks (``input`` parsed from the arguments).
- ``stop_reason``: ``end_turn``, ``stop_sequence`` (with ``stop_sequence``), ``tool_use``, ``max_tokens``,
  or ``model_context_window_exceeded`` when the room left in the context, not max_tokens, ended it.
- ``usage``: ``input_tokens`` are the prompt tokens the prefix cache did not hold,
  ``cache_read_input_tokens`` those it did (Anthropic's split); ``metrics`` is the request's anatomy.
- Streams: ``message_start``, ``ping``, then per block ``content_block_start`` / ``_delta`` / ``_stop``,
  then ``message_delta`` (stop reason, usage, metrics) and ``message_stop``; a ``ping`` every
  ``PING_INTERVAL_S`` seconds without output (a long prefill); a failure midway is an ``error`` event.
- Errors: ``{"type": "error", "error": {"type", "message"}}`` with Anthropic's types; every client mistake,
  a prompt too long for the context included ("prompt is too long: ..."), is a 4xx, never a 5xx (which
  Anthropic's SDKs retry).
"""

from __future__ import annotations

import json
from collections.abc import AsyncIterator
from contextlib import aclosing
from typing import Any

from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse, StreamingResponse
from starlette.background import BackgroundTask
from starlette.responses import Response

from glassbox.server.anthropic_request import CountTokensRequest, MessagesRequest, chat_request
from glassbox.server.chat import ChatRun, render_prompt, start_chat
from glassbox.server.errors import ApiError, register_error_body
from glassbox.server.generation import anatomy
from glassbox.server.reply import (
    Block,
    Counts,
    Ending,
    call_input,
    counts,
    ending,
    reply_steps,
    whole_reply,
    with_heartbeat,
)
from glassbox.server.state import ServerState

PING_INTERVAL_S = 5.0

_ERROR_TYPES = {
    401: "authentication_error",
    403: "permission_error",
    404: "not_found_error",
    413: "request_too_large",
    429: "rate_limit_error",
    503: "overloaded_error",
    529: "overloaded_error",
}


def error_body(
    status: int, message: str, param: str | None = None, code: str | None = None
) -> dict[str, Any]:
    """Anthropic's error shape (``param`` and ``code`` have no place in it)."""
    kind = _ERROR_TYPES.get(status, "invalid_request_error" if status < 500 else "api_error")
    return {"type": "error", "error": {"type": kind, "message": message}}


def add_routes(app: FastAPI, state: ServerState) -> None:
    register_error_body(app, "/v1/messages", error_body)

    @app.post("/v1/messages", include_in_schema=False)
    async def messages(body: MessagesRequest, request: Request) -> Response:
        return await create_message(state, body, request)

    @app.post("/v1/messages/count_tokens", include_in_schema=False)
    async def count_tokens(body: CountTokensRequest) -> dict[str, Any]:
        return {"input_tokens": len((await render_prompt(state, chat_request(body))).ids)}


async def create_message(state: ServerState, body: MessagesRequest, request: Request) -> Response:
    run = await start_chat(state, chat_request(body), "msg", fit_max_tokens=True)
    head = {
        "id": run.job.id.replace("-", "_", 1),  # msg_<hex>, Anthropic's form
        "type": "message",
        "role": "assistant",
        "model": run.job.model,
    }
    if body.stream:
        return StreamingResponse(
            _events(run, request, head),
            media_type="text/event-stream",
            headers={"Cache-Control": "no-cache"},
            background=BackgroundTask(run.job.abort_unfinished),
        )
    blocks, final = await whole_reply(run, request)
    stop = _stop(ending(run, final, blocks))
    return JSONResponse(
        {
            **head,
            "content": [_content(b) for b in blocks.blocks],
            **stop,
            "usage": _usage(counts(run, final)),
            "metrics": anatomy([final]),
        }
    )


def _stop(end: Ending) -> dict[str, Any]:
    if end.reason == "tool_calls":
        reason = "tool_use"
    elif end.reason == "length":
        reason = "model_context_window_exceeded" if end.fitted else "max_tokens"
    else:
        reason = "stop_sequence" if end.stop_sequence is not None else "end_turn"
    return {"stop_reason": reason, "stop_sequence": end.stop_sequence}


def _usage(c: Counts) -> dict[str, Any]:
    return {
        "input_tokens": c.prompt - c.cached,
        "output_tokens": c.output,
        "cache_read_input_tokens": c.cached,
        "cache_creation_input_tokens": 0,
    }


def _tool_id(call_id: str) -> str:
    return "toolu_" + call_id.removeprefix("call_")


def _content(b: Block) -> dict[str, Any]:
    if b.kind == "reasoning":
        return {"type": "thinking", "thinking": b.text, "signature": ""}
    if b.kind == "text":
        return {"type": "text", "text": b.text}
    return {"type": "tool_use", "id": _tool_id(b.call_id), "name": b.name, "input": call_input(b.text)}


def _sse(event: dict[str, Any]) -> str:
    return f"event: {event['type']}\ndata: {json.dumps(event, ensure_ascii=False, allow_nan=False)}\n\n"


_DELTAS = {"reasoning": ("thinking_delta", "thinking"), "text": ("text_delta", "text")}


def _block_event(kind: str, b: Block, text: str) -> dict[str, Any]:
    if kind == "open":
        start = _content(Block(b.kind, b.index, name=b.name, call_id=b.call_id))  # empty: the deltas fill it
        return {"type": "content_block_start", "index": b.index, "content_block": start}
    if kind == "close":
        return {"type": "content_block_stop", "index": b.index}
    if b.kind == "call":
        delta = {"type": "input_json_delta", "partial_json": text}
    else:
        name, key = _DELTAS[b.kind]
        delta = {"type": name, key: text}
    return {"type": "content_block_delta", "index": b.index, "delta": delta}


async def _events(run: ChatRun, request: Request, head: dict[str, Any]) -> AsyncIterator[str]:
    prompt = len(run.job.prompts[0])
    usage = {"input_tokens": prompt, "output_tokens": 0, "cache_read_input_tokens": 0}
    start = {**head, "content": [], "stop_reason": None, "stop_sequence": None, "usage": usage}
    yield _sse({"type": "message_start", "message": start})
    yield _sse({"type": "ping"})
    try:
        async with aclosing(with_heartbeat(reply_steps(run, request), PING_INTERVAL_S)) as steps:
            async for step in steps:
                if step is None:
                    yield _sse({"type": "ping"})
                    continue
                for event in step.events:
                    yield _sse(_block_event(*event))
                if step.final is not None:
                    final = step.final
                    delta = _stop(ending(run, final, step.blocks))
                    yield _sse(
                        {
                            "type": "message_delta",
                            "delta": delta,
                            "usage": _usage(counts(run, final)),
                            "metrics": anatomy([final]),
                        }
                    )
                    yield _sse({"type": "message_stop"})
    except ApiError as e:
        yield _sse(error_body(e.status, e.message))
