"""Ollama's API on the chat path: ``/api/version``, ``/api/tags``, ``/api/show``, ``/api/ps``, ``/api/chat``
and ``/api/generate`` (``GET /`` and ``HEAD /``, "Ollama is running", are server/dashboard.py's index).
Requests are translated by server/ollama_request.py and run as OpenAI chat (or, raw, completion)
requests are; model facts come from server/ollama_models.py.

- Replies stream as NDJSON (Ollama's default, ``stream: true``) or come whole: ``message.content``
  (``response`` for generate), ``thinking`` from the reasoning parser, ``tool_calls`` (arguments as an
  object; streamed whole, in one line before the last); the last object has ``done: true``,
  ``done_reason`` ("stop", "length"; "load" for an empty request) and Ollama's timings in nanoseconds from
  the request's anatomy: ``total_duration`` (tokenize + end to end), ``load_duration`` 0 (the model stays
  loaded), ``prompt_eval_count`` (the whole prompt, as Ollama counts it since 0.30),
  ``prompt_eval_cached_count`` (the part the prefix cache held) and ``prompt_eval_duration`` (prefill),
  ``eval_count`` and ``eval_duration`` (decode); plus
  ``metrics``, the anatomy itself. Generate's last object carries ``context`` (prompt and reply ids).
- A ``num_predict`` beyond the room the prompt leaves is cut to that room; no ``num_predict``: until a
  stop or the context is full.
- Errors: ``{"error": "..."}`` with the status (400, 401, 404, 429, 503); a failure midway through a
  stream is a last line ``{"error": "..."}``, as Ollama's.
"""

from __future__ import annotations

import json
from collections.abc import AsyncIterator
from contextlib import aclosing
from typing import Any, TypeVar

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse, StreamingResponse
from pydantic import BaseModel, Field, ValidationError
from starlette.background import BackgroundTask
from starlette.responses import Response

from glassbox.outputs import RequestOutput
from glassbox.server.chat import ChatRun, render_prompt, start_chat, start_run
from glassbox.server.chat_output import ChoiceReader
from glassbox.server.chat_prompt import text_prompts
from glassbox.server.embed_service import serves_embeddings
from glassbox.server.errors import ApiError, bad_request, register_error_body
from glassbox.server.generation import anatomy, sampling_params
from glassbox.server.ollama_models import ModelCard, resolve
from glassbox.server.ollama_request import ChatRequest, GenerateRequest, chat_request, generate_request
from glassbox.server.protocol import ChatCompletionRequest, _Body
from glassbox.server.reply import (
    Block,
    Blocks,
    call_input,
    counts,
    ending,
    reply_steps,
    rfc3339_now,
    whole_reply,
)
from glassbox.server.response_format import with_structured_outputs
from glassbox.server.state import ServerState

# the Ollama version /api/version reports: clients check a minimum (VS Code Copilot: 0.6.4) and key
# features to it (thinking: 0.9; tool calls streamed: 0.8)
OLLAMA_VERSION = "0.12.0"
_NDJSON = "application/x-ndjson"


class ShowRequest(_Body):
    model: str | None = None
    name: str | None = Field(None, description="the older name of model")
    verbose: bool = False


def error_body(
    status: int, message: str, param: str | None = None, code: str | None = None
) -> dict[str, Any]:
    return {"error": message}


def add_routes(app: FastAPI, state: ServerState) -> None:
    register_error_body(app, "/api/", error_body)
    card = ModelCard(state)

    @app.api_route("/api/version", methods=["GET", "HEAD"], include_in_schema=False)
    async def version() -> dict[str, Any]:
        return {"version": OLLAMA_VERSION}

    @app.get("/api/tags", include_in_schema=False)
    async def tags() -> dict[str, Any]:
        return {"models": [card.tag()]}

    # Ollama's clients (and its docs' curl lines) send JSON without a JSON content type: read it as JSON
    @app.post("/api/show", include_in_schema=False)
    async def show(request: Request) -> dict[str, Any]:
        body = await _json(request, ShowRequest)
        resolve(state, body.model or body.name)
        return card.show(state, serves_embeddings(request.app))

    @app.get("/api/ps", include_in_schema=False)
    async def ps() -> dict[str, Any]:
        return {"models": [card.running(state)]}

    @app.post("/api/chat", include_in_schema=False)
    async def chat(request: Request) -> Response:
        return await _chat(state, await _json(request, ChatRequest), request)

    @app.post("/api/generate", include_in_schema=False)
    async def generate(request: Request) -> Response:
        return await _generate(state, await _json(request, GenerateRequest), request)


M = TypeVar("M", bound=BaseModel)


async def _json(request: Request, model: type[M]) -> M:
    """The body as ``model``, whatever its content type; 400 in Ollama's shape when it does not fit."""
    raw = await request.body()
    try:
        data = json.loads(raw)
    except ValueError as e:
        raise bad_request(f"malformed JSON body: {e}") from None
    try:
        return model.model_validate(data)
    except ValidationError as e:
        raise RequestValidationError(e.errors()) from None


def _loaded(model: str, generate: bool) -> JSONResponse:
    """The answer to a request with nothing to generate: Ollama's way to (pre)load a model."""
    reply: dict[str, Any] = (
        {"response": ""} if generate else {"message": {"role": "assistant", "content": ""}}
    )
    return JSONResponse(
        {"model": model, "created_at": rfc3339_now(), **reply, "done": True, "done_reason": "load"}
    )


async def _chat(state: ServerState, body: ChatRequest, request: Request) -> Response:
    served = resolve(state, body.model)
    if not body.messages:
        return _loaded(body.model, generate=False)
    reasoning = state.settings.reasoning_parser is not None
    run = await start_chat(state, chat_request(body, served, reasoning), "ollama", fit_max_tokens=True)
    return await _reply(run, request, body.model, body.stream, generate=False)


async def _generate(state: ServerState, body: GenerateRequest, request: Request) -> Response:
    served = resolve(state, body.model)
    if not body.prompt and not body.context:
        return _loaded(body.model, generate=True)
    reasoning = state.settings.reasoning_parser is not None
    templated = state.tokenizer.chat_template is not None
    req = generate_request(body, served, reasoning, templated)
    context = list(body.context or [])
    if isinstance(req, ChatCompletionRequest):
        p = await render_prompt(state, req)
        readers = p.plan.readers(1, p.text)
        run = start_run(
            state, "ollama", context + p.ids, p.tokenize_s, p.plan.params, p.max_tokens, readers, True
        )
    else:  # raw: the prompt as it is, as /v1/completions takes it
        params = await with_structured_outputs(state, req, sampling_params(req, req.max_tokens, None))
        # tokenized as /v1/completions tokenizes a prompt: its length checked first, in a worker thread
        prompt = (await text_prompts(state, [body.prompt]))[0] if body.prompt else None
        ids = context + (prompt.ids if prompt is not None else [])
        tokenize_s = prompt.tokenize_s if prompt is not None else 0.0
        run = start_run(state, "ollama", ids, tokenize_s, params, req.max_tokens, [ChoiceReader()], True)
    return await _reply(run, request, body.model, body.stream, generate=True)


async def _reply(run: ChatRun, request: Request, model: str, stream: bool, generate: bool) -> Response:
    if stream:
        return StreamingResponse(
            _lines(run, request, model, generate),
            media_type=_NDJSON,
            background=BackgroundTask(run.job.abort_unfinished),
        )
    blocks, final = await whole_reply(run, request)
    body = _piece(model, generate, blocks.joined("text"), blocks.joined("reasoning"), blocks.of("call"))
    return JSONResponse({**body, **_last(run, final, blocks, generate)})


def _piece(model: str, generate: bool, text: str, thinking: str, calls: list[Block]) -> dict[str, Any]:
    if generate:
        reply: dict[str, Any] = {"response": text}
        if thinking:
            reply["thinking"] = thinking
    else:
        message: dict[str, Any] = {"role": "assistant", "content": text}
        if thinking:
            message["thinking"] = thinking
        if calls:
            message["tool_calls"] = [_call(b, i) for i, b in enumerate(calls)]
        reply = {"message": message}
    return {"model": model, "created_at": rfc3339_now(), **reply, "done": False}


def _call(b: Block, index: int) -> dict[str, Any]:
    return {"id": b.call_id, "function": {"index": index, "name": b.name, "arguments": call_input(b.text)}}


def _ns(seconds: float) -> int:
    return int(round(seconds * 1e9))


def _last(run: ChatRun, final: RequestOutput, blocks: Blocks, generate: bool) -> dict[str, Any]:
    """The fields of the last object: done, the reason, Ollama's timings, the anatomy."""
    c = counts(run, final)
    out: dict[str, Any] = {
        "done": True,
        "done_reason": "length" if ending(run, final, blocks).reason == "length" else "stop",
    }
    m = final.metrics
    if m is not None:
        out |= {
            "total_duration": _ns(m.tokenize_s + m.e2e_s),
            "load_duration": 0,
            "prompt_eval_count": c.prompt,
            "prompt_eval_cached_count": c.cached,
            "prompt_eval_duration": _ns(m.prefill_s),
            "eval_count": c.output,
            "eval_duration": _ns(m.decode_s),
        }
    if generate:
        out["context"] = run.job.prompts[0] + list(final.outputs[0].token_ids)
    out["metrics"] = anatomy([final])
    return out


def _line(obj: dict[str, Any]) -> str:
    return json.dumps(obj, ensure_ascii=False, allow_nan=False) + "\n"


async def _lines(run: ChatRun, request: Request, model: str, generate: bool) -> AsyncIterator[str]:
    try:
        async with aclosing(reply_steps(run, request)) as steps:
            async for step in steps:
                text = "".join(t for kind, b, t in step.events if kind == "delta" and b.kind == "text")
                thinking = "".join(
                    t for kind, b, t in step.events if kind == "delta" and b.kind == "reasoning"
                )
                if text or thinking:
                    yield _line(_piece(model, generate, text, thinking, []))
                if step.final is not None:
                    calls = step.blocks.of("call")
                    if calls and not generate:
                        yield _line(_piece(model, generate, "", "", calls))
                    last = _piece(model, generate, "", "", [])
                    yield _line({**last, **_last(run, step.final, step.blocks, generate)})
    except ApiError as e:
        yield _line({"error": e.message})
