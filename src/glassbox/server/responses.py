"""OpenAI's Responses API on the chat path: ``POST /v1/responses`` (JSON, or server-sent events with
``stream``), ``GET`` and ``DELETE /v1/responses/{id}``. The request is translated by
server/responses_request.py and run by server/chat.py's ``start_chat``, as a chat request is; stored
responses live in server/responses_store.py.

- ``output``: a ``reasoning`` item (the reasoning parser's text as ``reasoning_text`` content, no summary),
  a ``message`` item (``output_text``) and ``function_call`` items, in the order the reply gave them.
- ``status``: ``completed``, or ``incomplete`` with ``incomplete_details.reason`` "max_output_tokens" when
  the length limit ended it. ``usage`` with cached and reasoning tokens; ``metrics``: the anatomy.
- Streams: ``response.created``, ``response.in_progress``; per item ``response.output_item.added``,
  ``response.content_part.added``, the deltas (``response.reasoning_text.delta``,
  ``response.output_text.delta``, ``response.function_call_arguments.delta``), their ``.done``,
  ``response.content_part.done``, ``response.output_item.done``; then ``response.completed`` (or
  ``response.incomplete``); a failure midway is ``response.failed``. Every event has ``sequence_number``.
- ``store: false``: nothing is kept (GET answers 404, a later previous_response_id 400).
- Errors are OpenAI's shape, as on the chat routes.
"""

from __future__ import annotations

import json
import time
import uuid
from collections.abc import AsyncIterator
from contextlib import aclosing
from typing import Any

from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse, StreamingResponse
from starlette.background import BackgroundTask
from starlette.responses import Response

from glassbox.outputs import RequestOutput
from glassbox.server.chat import ChatRun, start_chat
from glassbox.server.errors import ApiError, bad_request
from glassbox.server.generation import anatomy
from glassbox.server.reply import Block, Blocks, counts, ending, reply_steps, whole_reply
from glassbox.server.responses_request import ResponsesRequest, Translation, stored_messages, translate
from glassbox.server.responses_store import ResponseStore, StoredResponse
from glassbox.server.state import ServerState

_ITEM_PREFIX = {"reasoning": "rs", "text": "msg", "call": "fc"}


def add_routes(app: FastAPI, state: ServerState) -> None:
    store = ResponseStore()

    @app.post("/v1/responses", include_in_schema=False)
    async def create(body: ResponsesRequest, request: Request) -> Response:
        return await create_response(state, store, body, request)

    @app.get("/v1/responses/{response_id}", include_in_schema=False)
    async def retrieve(response_id: str) -> dict[str, Any]:
        entry = store.get(response_id)
        if entry is None:
            raise _not_found(response_id)
        return entry.response

    @app.delete("/v1/responses/{response_id}", include_in_schema=False)
    async def delete(response_id: str) -> dict[str, Any]:
        if not store.delete(response_id):
            raise _not_found(response_id)
        return {"id": response_id, "object": "response.deleted", "deleted": True}


def _not_found(rid: str) -> ApiError:
    return ApiError(404, f"Response with id {rid!r} not found", "response_id", "not_found")


class _Reply:
    """One response being made: its request, ids, and the response object at each stage."""

    def __init__(self, state: ServerState, req: ResponsesRequest, t: Translation, run: ChatRun) -> None:
        self.state, self.req, self.t, self.run = state, req, t, run
        self.id = "resp_" + run.job.id.split("-", 1)[1]
        self.created = time.time()
        self.item_ids: dict[int, str] = {}  # block index -> item id

    def item_id(self, b: Block) -> str:
        if b.index not in self.item_ids:
            self.item_ids[b.index] = f"{_ITEM_PREFIX[b.kind]}_{uuid.uuid4().hex}"
        return self.item_ids[b.index]

    def item(self, b: Block, status: str) -> dict[str, Any]:
        """The output item of a block (its content so far)."""
        if b.kind == "reasoning":
            content = [{"type": "reasoning_text", "text": b.text}] if status != "in_progress" else []
            return {
                "type": "reasoning",
                "id": self.item_id(b),
                "summary": [],
                "content": content,
                "status": status,
            }
        if b.kind == "text":
            parts = [_text_part(b.text)] if status != "in_progress" else []
            return {
                "type": "message",
                "id": self.item_id(b),
                "status": status,
                "role": "assistant",
                "content": parts,
            }
        item = {
            "type": "function_call",
            "id": self.item_id(b),
            "call_id": b.call_id,
            "name": b.name,
            "arguments": b.text,
            "status": status,
        }
        namespace = self.t.namespaces.get(b.name)
        return {**item, "namespace": namespace} if namespace is not None else item

    def body(
        self, status: str, output: list[dict[str, Any]], final: RequestOutput | None = None, **extra: Any
    ) -> dict[str, Any]:
        """The response object; with ``final``, its usage and anatomy."""
        req = self.req
        chat = self.t.chat
        out: dict[str, Any] = {
            "id": self.id,
            "object": "response",
            "created_at": int(self.created),
            "status": status,
            "background": False,
            "error": None,
            "incomplete_details": None,
            "instructions": req.instructions,
            "max_output_tokens": req.max_output_tokens,
            "model": self.run.job.model,
            "output": output,
            "parallel_tool_calls": chat.parallel_tool_calls is not False,
            "previous_response_id": req.previous_response_id,
            "reasoning": {"effort": (req.reasoning or {}).get("effort"), "summary": None},
            "store": req.store,
            "temperature": req.temperature,
            "text": {"format": (req.text or {}).get("format") or {"type": "text"}},
            "tool_choice": req.tool_choice if req.tool_choice is not None else "auto",
            "tools": req.tools or [],
            "top_p": req.top_p,
            "truncation": "disabled",
            "usage": None,
            "user": req.user,
            "metadata": req.metadata or {},
            **extra,
        }
        if final is not None:
            c = counts(self.run, final)
            reasoning = "".join(
                o["content"][0]["text"] for o in output if o["type"] == "reasoning" and o["content"]
            )
            thought = (
                len(self.state.tokenizer.encode(reasoning, add_special_tokens=False)) if reasoning else 0
            )
            out["usage"] = {
                "input_tokens": c.prompt,
                "input_tokens_details": {"cached_tokens": c.cached, "cache_write_tokens": 0},
                "output_tokens": c.output,
                "output_tokens_details": {"reasoning_tokens": thought},
                "total_tokens": c.prompt + c.output,
            }
            out["completed_at"] = int(time.time())
            out["metrics"] = anatomy([final])
        return out

    def finish(self, blocks: Blocks, final: RequestOutput, store: ResponseStore) -> dict[str, Any]:
        """The finished response object (stored unless ``store: false``)."""
        cut = ending(self.run, final, blocks).reason == "length"
        last = len(blocks.blocks) - 1
        output = [
            self.item(b, "incomplete" if cut and b.index == last else "completed") for b in blocks.blocks
        ]
        extra: dict[str, Any] = {}
        if cut:
            extra["incomplete_details"] = {"reason": "max_output_tokens"}
        body = self.body("incomplete" if cut else "completed", output, final, **extra)
        if self.req.store:
            calls = [(b.call_id, b.name, b.text) for b in blocks.of("call")]
            messages = stored_messages(self.t.new_messages, blocks.joined("text"), calls)
            store.put(self.id, StoredResponse(body, messages, self.req.previous_response_id))
        return body


def _text_part(text: str) -> dict[str, Any]:
    return {"type": "output_text", "text": text, "annotations": [], "logprobs": []}


async def create_response(
    state: ServerState, store: ResponseStore, req: ResponsesRequest, request: Request
) -> Response:
    history: list[dict[str, Any]] = []
    if req.previous_response_id is not None:
        try:
            history = store.conversation(req.previous_response_id)
        except KeyError as e:
            raise bad_request(
                f"previous response {e.args[0]!r} not found (never stored, stored with store: false, deleted "
                "or dropped from the bounded store)",
                "previous_response_id",
                "previous_response_not_found",
            ) from None
    t = translate(req, history)
    run = await start_chat(state, t.chat, "resp", fit_max_tokens=True)
    reply = _Reply(state, req, t, run)
    if req.stream:
        return StreamingResponse(
            _events(reply, store, request),
            media_type="text/event-stream",
            headers={"Cache-Control": "no-cache"},
            background=BackgroundTask(run.job.abort_unfinished),
        )
    blocks, final = await whole_reply(run, request)
    return JSONResponse(reply.finish(blocks, final, store))


class _Sse:
    def __init__(self) -> None:
        self.sequence = 0

    def __call__(self, kind: str, **fields: Any) -> str:
        event = {"type": kind, "sequence_number": self.sequence, **fields}
        self.sequence += 1
        return f"event: {kind}\ndata: {json.dumps(event, ensure_ascii=False, allow_nan=False)}\n\n"


def _block_events(r: _Reply, sse: _Sse, kind: str, b: Block, text: str, status: str) -> list[str]:
    at = {"item_id": r.item_id(b), "output_index": b.index}
    if kind == "open":
        events = [sse("response.output_item.added", output_index=b.index, item=r.item(b, "in_progress"))]
        if b.kind != "call":
            part = {"type": "reasoning_text", "text": ""} if b.kind == "reasoning" else _text_part("")
            events.append(sse("response.content_part.added", **at, content_index=0, part=part))
        return events
    if kind == "delta":
        if b.kind == "call":
            return [sse("response.function_call_arguments.delta", **at, delta=text)]
        if b.kind == "reasoning":
            return [sse("response.reasoning_text.delta", **at, content_index=0, delta=text)]
        return [sse("response.output_text.delta", **at, content_index=0, delta=text, logprobs=[])]
    # built in the order they are sent: each takes the next sequence number
    if b.kind == "call":
        events = [sse("response.function_call_arguments.done", **at, arguments=b.text, name=b.name)]
    else:
        if b.kind == "reasoning":
            part = {"type": "reasoning_text", "text": b.text}
            events = [sse("response.reasoning_text.done", **at, content_index=0, text=b.text)]
        else:
            part = _text_part(b.text)
            events = [sse("response.output_text.done", **at, content_index=0, text=b.text, logprobs=[])]
        events.append(sse("response.content_part.done", **at, content_index=0, part=part))
    events.append(sse("response.output_item.done", output_index=b.index, item=r.item(b, status)))
    return events


async def _events(r: _Reply, store: ResponseStore, request: Request) -> AsyncIterator[str]:
    sse = _Sse()
    yield sse("response.created", response=r.body("in_progress", []))
    yield sse("response.in_progress", response=r.body("in_progress", []))
    blocks: Blocks | None = None
    try:
        async with aclosing(reply_steps(r.run, request)) as steps:
            async for step in steps:
                blocks = step.blocks
                cut = step.final is not None and ending(r.run, step.final, blocks).reason == "length"
                for kind, b, text in step.events:
                    status = "incomplete" if cut and b.index == len(blocks.blocks) - 1 else "completed"
                    for event in _block_events(r, sse, kind, b, text, status):
                        yield event
                if step.final is not None:
                    body = r.finish(step.blocks, step.final, store)
                    kind = "response.completed" if body["status"] == "completed" else "response.incomplete"
                    yield sse(kind, response=body)
    except ApiError as e:
        done = [r.item(b, "incomplete") for b in blocks.blocks] if blocks is not None else []
        error = {"code": "server_error", "message": e.message}
        yield sse("response.failed", response={**r.body("failed", done), "error": error})
