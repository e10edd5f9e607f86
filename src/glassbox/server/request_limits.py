"""Limits every route gets before it reads a request, whichever dialect it speaks:

- ``RequestBodyLimit`` (ASGI middleware): a body over ``--max-request-bytes`` is a 413, refused on its
  Content-Length before a byte is read, or as soon as a chunked body passes the limit.
- ``ThreadParsedRoute`` (the app's route class): a JSON body is parsed before FastAPI validates it, in a
  worker thread when it is large, and refused (400) when it holds more than MAX_JSON_VALUES values, nests
  deeper than the parser allows, or holds a lone UTF-16 surrogate. A large body is validated against the
  endpoint's pydantic model in that thread too; FastAPI then reads the parsed value or model instance
  (Starlette's ``Request.json`` cache), which costs the event loop nothing more for an instance.

The event loop's share stays small: bodies up to INLINE_BYTES are parsed on the loop; larger ones in a
worker thread (server/json_body.py: no single C call, which keeps the GIL, reads much of the body), where a
large body is also validated. Errors are in the route's dialect: Ollama's ``{"error": ...}`` under /api/,
OpenAI's shape elsewhere.
"""

from __future__ import annotations

import asyncio
import typing
from collections.abc import Callable, Coroutine
from typing import Any

from fastapi import FastAPI
from fastapi.exceptions import RequestValidationError
from fastapi.routing import APIRoute
from pydantic import BaseModel, ValidationError
from starlette.exceptions import HTTPException as StarletteHTTPException
from starlette.requests import Request
from starlette.responses import Response
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from glassbox.server.errors import error_response_for
from glassbox.server.json_body import BodyError, parse_body

INLINE_BYTES = 64 << 10  # parsed on the event loop: under 2 ms
_BODY_METHODS = ("POST", "PUT", "PATCH")


def error_for(
    scope: Scope, status: int, message: str, param: str | None = None, code: str | None = None
) -> Response:
    """An error answer in the shape of the dialect that serves the request's path (the shapes the dialects
    registered on the app, Starlette's ``scope["app"]``; OpenAI's otherwise)."""
    return error_response_for(scope.get("app"), scope["path"], status, message, param, code)


class BodyTooLarge(StarletteHTTPException):
    """A body past the limit (413); raised by the limited ``receive`` as the body arrives."""

    def __init__(self, limit: int) -> None:
        super().__init__(413, f"the request body is larger than this server's limit of {limit} bytes "
                              "(--max-request-bytes)")  # fmt: skip


class RequestBodyLimit:
    """413 for a request body over ``max_bytes``."""

    def __init__(self, app: ASGIApp, max_bytes: int) -> None:
        self.app = app
        self.max_bytes = max_bytes

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        length = _content_length(scope)
        if length is not None and length > self.max_bytes:
            response = error_for(scope, 413, BodyTooLarge(self.max_bytes).detail, code="request_too_large")
            await response(scope, receive, send)
            return
        received = 0
        started = False

        async def limited_receive() -> Message:
            nonlocal received
            message = await receive()
            if message["type"] == "http.request":
                received += len(message.get("body", b""))
                if received > self.max_bytes:
                    raise BodyTooLarge(self.max_bytes)
            return message

        async def watched_send(message: Message) -> None:
            nonlocal started
            started = started or message["type"] == "http.response.start"
            await send(message)

        try:
            await self.app(scope, limited_receive, watched_send)
        except BodyTooLarge as e:  # read by a route outside ThreadParsedRoute
            if started:
                raise
            await error_for(scope, 413, e.detail, code="request_too_large")(scope, receive, send)


def _content_length(scope: Scope) -> int | None:
    for name, value in scope.get("headers", []):
        if name == b"content-length":
            try:
                return int(value)
            except ValueError:
                return None
    return None


def install_request_limits(app: FastAPI, max_bytes: int) -> None:
    """The body limit and the thread-parsed route class; call before any route or the API-key gate is
    added (the gate answers first, the limit before any route reads)."""
    app.router.route_class = ThreadParsedRoute
    app.add_middleware(RequestBodyLimit, max_bytes=max_bytes)


def _is_json(content_type: str | None) -> bool:
    """JSON by its content type, or no content type (Ollama's clients send none)."""
    if not content_type:
        return True
    kind = content_type.split(";", 1)[0].strip().lower()
    return kind == "application/json" or (kind.startswith("application/") and kind.endswith("+json"))


def _body_model(endpoint: Callable[..., Any]) -> type[BaseModel] | None:
    """The pydantic model of the endpoint's one body parameter, if it has one."""
    try:
        hints = typing.get_type_hints(endpoint)
    except (NameError, TypeError):
        return None
    models = [
        h for k, h in hints.items() if k != "return" and isinstance(h, type) and issubclass(h, BaseModel)
    ]
    return models[0] if len(models) == 1 else None


def _parse_and_validate(raw: bytes, model: type[BaseModel] | None) -> Any:
    """``parse_body``, then the route's model validated (pydantic holds the GIL ~0.4-2 us per value: 0.5 s
    for a prompt of 262,144 ids), so that FastAPI gets an instance it need not validate again."""
    value = parse_body(raw)
    if model is None or not isinstance(value, dict):
        return value
    try:
        return model.model_validate(value)
    except ValidationError as e:
        errors = [{**err, "loc": ("body", *err["loc"])} for err in e.errors(include_url=False)]
        raise RequestValidationError(errors, body=None) from None


class ThreadParsedRoute(APIRoute):
    """A route whose JSON body is read, parsed and checked (``parse_body``) before FastAPI validates it;
    a large body is also validated in the worker thread, against the endpoint's body model."""

    def get_route_handler(self) -> Callable[[Request], Coroutine[Any, Any, Response]]:
        handler = super().get_route_handler()
        model = _body_model(self.endpoint)

        async def parsed_then_handled(request: Request) -> Response:
            if request.method in _BODY_METHODS:
                try:
                    raw = await request.body()
                except BodyTooLarge as e:
                    return error_for(request.scope, 413, e.detail, code="request_too_large")
                if raw and _is_json(request.headers.get("content-type")):
                    try:
                        if len(raw) <= INLINE_BYTES:
                            value = parse_body(raw)
                        else:
                            value = await asyncio.to_thread(_parse_and_validate, raw, model)
                    except BodyError as e:
                        return error_for(request.scope, 400, e.message, e.param, e.code)
                    request._json = value  # Starlette's cache, which FastAPI's request.json() returns
            return await handler(request)

        return parsed_then_handled
