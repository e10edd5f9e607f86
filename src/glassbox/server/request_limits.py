"""Limits every route gets before it reads a request, whichever dialect it speaks:

- ``RequestBodyLimit`` (ASGI middleware): a body over ``--max-request-bytes`` is a 413, refused on its
  Content-Length before a byte is read, or as soon as a chunked body passes the limit.
- ``ThreadParsedRoute`` (the app's route class): a JSON body is parsed before FastAPI validates it, in a
  worker thread when it is large, and refused (400) when it holds more than MAX_JSON_VALUES values, nests
  deeper than the parser allows, or holds a lone UTF-16 surrogate. FastAPI then reads the parsed value
  (Starlette's ``Request.json`` cache) and validates at most MAX_JSON_VALUES values on the event loop.

The event loop's share stays small. A C call keeps the GIL for its whole length, so none may read much:
bodies up to INLINE_BYTES are parsed on the loop (under 2 ms); larger ones in a worker thread, by the C
parser when the body cannot hold more than MAX_JSON_VALUES values (its work is then bounded by the body's
bytes of string, ~3 ns each, and MAX_JSON_VALUES numbers, ~0.2 us each on a loaded 2-core machine: ~50 ms),
else by the json module's Python scanner, whose C calls each read one string or number, stopping at
MAX_JSON_VALUES. Errors are in the route's dialect: Ollama's ``{"error": ...}`` under /api/, OpenAI's shape
elsewhere.
"""

from __future__ import annotations

import asyncio
import json
import json.scanner
import re
from collections.abc import Callable, Coroutine
from typing import Any

from fastapi import FastAPI
from fastapi.routing import APIRoute
from starlette.exceptions import HTTPException as StarletteHTTPException
from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from glassbox.server.errors import error_response
from glassbox.server.protocol import _lone_surrogate

INLINE_BYTES = 64 << 10
# pydantic validates ~0.4 us per value on a loaded 2-core machine (a list of 1M token ids: 0.36-0.42 s),
# so the event loop's validation of a body stays near 100 ms; a token-id prompt of 262,144 ids still fits
MAX_JSON_VALUES = 1 << 18
_SURROGATE = re.compile("[\ud800-\udfff]")
_BODY_METHODS = ("POST", "PUT", "PATCH")


def error_for(
    path: str, status: int, message: str, param: str | None = None, code: str | None = None
) -> Response:
    """An error answer in the shape of the dialect that serves ``path``."""
    if path.startswith("/api/"):  # Ollama's
        return JSONResponse({"error": message}, status_code=status)
    return error_response(status, message, param, code)


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
        path: str = scope["path"]
        length = _content_length(scope)
        if length is not None and length > self.max_bytes:
            response = error_for(path, 413, BodyTooLarge(self.max_bytes).detail, code="request_too_large")
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
            await error_for(path, 413, e.detail, code="request_too_large")(scope, receive, send)


def _content_length(scope: Scope) -> int | None:
    for name, value in scope.get("headers", []):
        if name == b"content-length":
            try:
                return int(value)
            except ValueError:
                return None
    return None


class BodyError(ValueError):
    """A JSON body refused before validation (400)."""

    def __init__(self, message: str, param: str | None = None, code: str = "invalid_value") -> None:
        super().__init__(message)
        self.message = message
        self.param = param
        self.code = code


def _too_many(max_values: int) -> BodyError:
    return BodyError(f"the JSON body holds more than {max_values} values; split the request", None)


def _counting_decoder(max_values: int) -> json.JSONDecoder:
    """The json module's Python scanner, stopping once it has scanned ``max_values`` array items and
    object members (each C call it makes reads one string or number)."""
    decoder = json.JSONDecoder()
    count = 0

    def counted(scan_once: Callable[[str, int], Any]) -> Callable[[str, int], Any]:
        def scan(text: str, at: int) -> Any:
            nonlocal count
            count += 1
            if count > max_values:
                raise _too_many(max_values)
            return scan_once(text, at)

        return scan

    def parse_array(s_and_end: tuple[str, int], scan_once: Callable[[str, int], Any]) -> Any:
        return json.decoder.JSONArray(s_and_end, counted(scan_once))  # type: ignore[attr-defined]

    def parse_object(s_and_end: tuple[str, int], strict: bool, scan_once: Callable[[str, int], Any],
                     *hooks: Any) -> Any:  # fmt: skip
        return json.decoder.JSONObject(s_and_end, strict, counted(scan_once), *hooks)  # type: ignore[attr-defined]

    decoder.parse_array = parse_array  # type: ignore[attr-defined]
    decoder.parse_object = parse_object  # type: ignore[attr-defined]
    decoder.scan_once = json.scanner.py_make_scanner(decoder)  # type: ignore[attr-defined]
    return decoder


def parse_body(raw: bytes, max_values: int = MAX_JSON_VALUES) -> Any:
    """The JSON value of ``raw``; BodyError for malformed JSON, nesting too deep, more than ``max_values``
    values, or a lone surrogate.

    A value is the whole body, an array item or an object member's value: each item but an array's first
    follows a ",", each member's value a ":", each array's first item a "[". When those bytes (counted
    inside strings too) are fewer than ``max_values``, the C parser reads the body in one call (strings and
    at most ``max_values`` numbers: ~50 ms of GIL for a 16 MiB body). Else the Python scanner reads it,
    counting as it goes."""
    try:
        separators = raw.count(b",") + raw.count(b":") + raw.count(b"[")
        if separators < max_values:
            value = json.loads(raw)
        else:
            text = raw.decode(json.detect_encoding(raw), "surrogatepass")  # as json.loads decodes bytes
            value = _counting_decoder(max_values).decode(text)
    except json.JSONDecodeError as e:
        raise BodyError(f"malformed JSON body: {e.msg} (line {e.lineno}, column {e.colno})", None,
                        "invalid_json") from None  # fmt: skip
    except UnicodeDecodeError as e:
        raise BodyError(
            f"the body is not UTF-8 text: {e.reason} at byte {e.start}", None, "invalid_json"
        ) from None
    except RecursionError:
        raise BodyError("the JSON body nests too deeply", None, "invalid_json") from None
    _check_values(value, max_values)
    return value


def _check_values(value: Any, max_values: int) -> None:
    count, stack, bad = 0, [value], False
    while stack:
        item = stack.pop()
        count += 1
        if count > max_values:
            raise _too_many(max_values)
        if isinstance(item, str):
            bad = bad or _has_surrogate(item)
        elif isinstance(item, dict):
            bad = bad or any(_has_surrogate(str(k)) for k in item)
            stack.extend(item.values())
        elif isinstance(item, list):
            stack.extend(item)
    if bad:
        where = _lone_surrogate(value, "") if isinstance(value, (dict, list)) else ""
        raise BodyError(
            f"{where or 'a field name'} holds a lone UTF-16 surrogate (an unpaired \\ud800-\\udfff escape), "
            "which is not valid Unicode text",
            where or None,
        )


def _has_surrogate(text: str) -> bool:
    if text.isascii():  # O(1): CPython keeps the flag
        return False
    try:
        text.encode("utf-16-le")  # one pass at memory speed; strict: a lone surrogate cannot be encoded
    except UnicodeEncodeError:
        return _SURROGATE.search(text) is not None
    return False


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


class ThreadParsedRoute(APIRoute):
    """A route whose JSON body is read, parsed and checked (``parse_body``) before FastAPI validates it."""

    def get_route_handler(self) -> Callable[[Request], Coroutine[Any, Any, Response]]:
        handler = super().get_route_handler()

        async def parsed_then_handled(request: Request) -> Response:
            if request.method in _BODY_METHODS:
                try:
                    raw = await request.body()
                except BodyTooLarge as e:
                    return error_for(request.url.path, 413, e.detail, code="request_too_large")
                if raw and _is_json(request.headers.get("content-type")):
                    try:
                        if len(raw) <= INLINE_BYTES:
                            value = parse_body(raw)
                        else:
                            value = await asyncio.to_thread(parse_body, raw)
                    except BodyError as e:
                        return error_for(request.url.path, 400, e.message, e.param, e.code)
                    request._json = value  # Starlette's cache, which FastAPI's request.json() returns
            return await handler(request)

        return parsed_then_handled
