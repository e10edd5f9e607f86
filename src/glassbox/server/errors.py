"""Errors in OpenAI's shape: ``{"error": {"message", "type", "param", "code"}}``, with the right status.

User input never yields a 500: invalid parameters are 400, an unknown model 404, a missing key 401, a
full queue 429 (with Retry-After), shutting down 503. Only our own bugs reach the 500 handler. Types and
codes are OpenAI's: a request error of any status (400, 401, 404) is an ``invalid_request_error``; the code
says which (``invalid_value``, ``integer_above_max_value``, ``context_length_exceeded``,
``model_not_found``, ``invalid_api_key``, ``unsupported_parameter``, ...).
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import Any

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from starlette.exceptions import HTTPException as StarletteHTTPException

logger = logging.getLogger(__name__)

ERROR_TYPES = {
    400: "invalid_request_error",
    401: "invalid_request_error",
    404: "invalid_request_error",
    405: "invalid_request_error",
    413: "invalid_request_error",
    415: "invalid_request_error",
    429: "rate_limit_error",
    500: "internal_server_error",
    503: "service_unavailable_error",
}


class ApiError(Exception):
    """An error answered in OpenAI's shape; raise it from a handler."""

    def __init__(
        self,
        status: int,
        message: str,
        param: str | None = None,
        code: str | None = None,
        headers: dict[str, str] | None = None,
    ) -> None:
        super().__init__(message)
        self.status = status
        self.message = message
        self.param = param
        self.code = code
        self.headers = headers


SHOWN_CHARS = 64  # of a value echoed in an error message
MESSAGE_CHARS = 2048  # the longest error message sent; longer ones are cut in the middle


def shown(value: object, limit: int = SHOWN_CHARS) -> str:
    """``repr(value)`` for an error message, cut to ``limit`` characters with the full length said."""
    text = repr(value)
    if len(text) <= limit:
        return text
    size = f" ({len(value)} characters)" if isinstance(value, str) else ""
    return f"{text[: limit - 4]}...{text[-1]}{size}"


def bad_request(message: str, param: str | None = None, code: str = "invalid_value") -> ApiError:
    return ApiError(400, message, param, code)


def unsupported(message: str, param: str, code: str = "unsupported_parameter") -> ApiError:
    """400 for a parameter (or value: ``code="unsupported_value"``) that OpenAI has and we do not."""
    return ApiError(400, message, param, code)


def error_body(
    status: int, message: str, param: str | None = None, code: str | None = None
) -> dict[str, Any]:
    """The JSON body of an error (also sent as a server-sent event when a stream fails midway)."""
    err_type = ERROR_TYPES.get(status, "invalid_request_error" if status < 500 else "internal_server_error")
    if len(message) > MESSAGE_CHARS:  # no error echoes a request's data at length
        half = MESSAGE_CHARS // 2
        message = (
            f"{message[:half]} ... ({len(message) - 2 * half} characters left out) ... {message[-half:]}"
        )
    if param is not None and len(param) > SHOWN_CHARS:
        param = param[:SHOWN_CHARS] + "..."
    return {"error": {"message": message, "type": err_type, "param": param, "code": code}}


def error_response(
    status: int,
    message: str,
    param: str | None = None,
    code: str | None = None,
    headers: dict[str, str] | None = None,
) -> JSONResponse:
    return JSONResponse(error_body(status, message, param, code), status_code=status, headers=headers)


# another API's error body from (status, message, param, code): server/anthropic.py's, server/ollama.py's
ErrorBody = Callable[[int, str, str | None, str | None], dict[str, Any]]


def register_error_body(app: FastAPI, prefix: str, body: ErrorBody) -> None:
    """Answer errors on paths under ``prefix`` with ``body`` (an API dialect's own error shape)."""
    app.state.error_bodies = [*getattr(app.state, "error_bodies", []), (prefix, body)]


def error_response_for(
    app: Any,
    path: str,
    status: int,
    message: str,
    param: str | None = None,
    code: str | None = None,
    headers: dict[str, str] | None = None,
) -> JSONResponse:
    """An error in the shape of the API that ``path`` belongs to (OpenAI's unless a dialect registered
    its prefix on ``app``)."""
    for prefix, body in getattr(getattr(app, "state", None), "error_bodies", ()):
        if path.startswith(prefix):
            return JSONResponse(body(status, message, param, code), status_code=status, headers=headers)
    return error_response(status, message, param, code, headers)


def param_of_value_error(message: str, known: set[str]) -> str | None:
    """The parameter a ValueError message names first ("top_p must be ..." -> "top_p"), if known."""
    word = message.split(" ", 1)[0].strip(":,")
    return word if word in known else None


def _validation_message(exc: RequestValidationError) -> tuple[str, str | None, str]:
    """The message, the parameter and OpenAI's code for the first of pydantic's errors."""
    # a union's members each fail: a value error (a token id < 0) says more than "not a valid string"
    errors = exc.errors()
    errors = [e for e in errors if not str(e.get("type", "")).endswith(("_type", "_parsing"))] or errors
    if not errors:
        return "invalid request", None, "invalid_value"
    first = errors[0]
    if first.get("type") == "json_invalid":
        return f"malformed JSON body: {first.get('msg', 'invalid JSON')}", None, "invalid_json"
    param = _path(first.get("loc", ())) or None
    if first.get("type") == "missing" and param is None:
        return "a JSON request body is required", None, "missing_required_parameter"
    parts = []
    for err in errors[:3]:
        parts.append(f"{_path(err.get('loc', ())) or 'body'}: {err.get('msg', 'invalid value')}")
    more = f" (and {len(errors) - 3} more)" if len(errors) > 3 else ""
    return "invalid request: " + "; ".join(parts) + more, param, _code(first)


def _code(err: Any) -> str:
    """OpenAI's code for one pydantic error (``integer_above_max_value``, ``invalid_type``, ...)."""
    kind = str(err.get("type", ""))
    value = err.get("input")
    number = "integer" if isinstance(value, int) else "decimal"
    if kind in ("less_than", "less_than_equal"):
        return f"{number}_above_max_value"
    if kind in ("greater_than", "greater_than_equal"):
        return f"{number}_below_min_value"
    if kind == "int_parsing_size":  # an integer (or 1e30) too big to parse at all
        negative = str(value).lstrip().startswith("-")
        return "integer_below_min_value" if negative else "integer_above_max_value"
    if kind == "missing":
        return "missing_required_parameter"
    if kind in ("too_long", "too_short"):
        return "array_above_max_length" if kind == "too_long" else "array_below_min_length"
    if kind.endswith("_type") or kind.endswith("_parsing") or kind == "model_attributes_type":
        return "invalid_type"
    return "invalid_value"


def _path(loc: Any) -> str:
    """``("body", "messages", 0, "role")`` -> ``messages[0].role``; a union's member tags are dropped."""
    out = ""
    for part in loc:
        if isinstance(part, int):
            out += f"[{part}]"
        elif part != "body" and not _is_type_tag(str(part)):
            out += f".{part}" if out else str(part)
    return out


def _is_type_tag(part: str) -> bool:
    return (
        part in ("str", "int", "float", "bool")
        or "[" in part
        or part.startswith(("function-", "constrained-"))
    )


def install_error_handlers(app: FastAPI) -> None:
    """Answer every error (ours, FastAPI's validation, Starlette's 404/405, bugs) in OpenAI's shape, or
    in the shape of the API dialect the path belongs to (``register_error_body``)."""

    @app.exception_handler(ApiError)
    async def _api_error(request: Request, exc: ApiError) -> JSONResponse:
        path = request.url.path
        return error_response_for(app, path, exc.status, exc.message, exc.param, exc.code, exc.headers)

    @app.exception_handler(RequestValidationError)
    async def _validation_error(request: Request, exc: RequestValidationError) -> JSONResponse:
        message, param, code = _validation_message(exc)
        return error_response_for(app, request.url.path, 400, message, param, code)

    @app.exception_handler(StarletteHTTPException)
    async def _http_error(request: Request, exc: StarletteHTTPException) -> JSONResponse:
        detail = exc.detail if isinstance(exc.detail, str) else "request failed"
        headers = getattr(exc, "headers", None)
        return error_response_for(app, request.url.path, exc.status_code, detail, headers=headers)

    @app.exception_handler(Exception)
    async def _internal_error(request: Request, exc: Exception) -> JSONResponse:
        logger.exception("unhandled error on %s %s", request.method, request.url.path)
        return error_response_for(app, request.url.path, 500, f"internal server error: {type(exc).__name__}")
