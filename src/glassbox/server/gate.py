"""The gate every server app puts in front of its routes (torch-free: the multi-model router uses it too).

A pure-ASGI middleware: 503 for everything but /metrics while the server drains, 401 on the guarded paths
without the API key (OpenAI's ``Authorization: Bearer`` or Anthropic's ``x-api-key``), each in the error
shape of the dialect the path belongs to (``errors.register_error_body``). With --allowed-origins,
Starlette's CORS middleware sits in front of the gate: preflights need no key, and 401/503 carry the headers.
"""

from __future__ import annotations

import secrets
from collections.abc import Callable
from typing import Any, Protocol

from fastapi import FastAPI
from fastapi.middleware.cors import CORSMiddleware
from starlette.types import ASGIApp, Receive, Scope, Send

from glassbox.server.errors import error_response_for

# paths that need the API key when one is set (health, metrics, the schema, Ollama's / and version stay open)
GUARDED = ("/v1/", "/tokenize", "/detokenize", "/rerank", "/api/")
OPEN = ("/api/version",)


class GateSettings(Protocol):
    """The flags the gate and CORS read (server/state.ServerSettings, the router's GateSettings)."""

    @property
    def api_key(self) -> str | None: ...
    @property
    def allowed_origins(self) -> list[str]: ...
    @property
    def allowed_methods(self) -> list[str]: ...
    @property
    def allowed_headers(self) -> list[str]: ...


class GateState(Protocol):
    """What the gate reads of a server: draining, and the API key."""

    draining: bool

    @property
    def settings(self) -> GateSettings: ...


class Gate:
    """503 while draining (not /metrics); 401 on guarded paths without the API key. ``data_paths`` (the
    dashboard's data) need the key too, which may also come as ``data_key`` accepts it (a cookie, a query)."""

    def __init__(
        self,
        app: ASGIApp,
        state: GateState,
        guarded: tuple[str, ...] = GUARDED,
        data_paths: frozenset[str] = frozenset(),
        data_key: Callable[[Scope, str], bool] | None = None,
    ) -> None:
        self.app = app
        self.state = state
        self.guarded = guarded
        self.data_paths = data_paths
        self.data_key = data_key

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        path: str = scope["path"]
        app = scope.get("app")
        if self.state.draining and path != "/metrics":
            headers = {"Retry-After": "5"}
            response = error_response_for(app, path, 503, "the server is shutting down", headers=headers)
            await response(scope, receive, send)
            return
        key = self.state.settings.api_key
        data = path in self.data_paths
        if (
            key
            and (data or (path.startswith(self.guarded) and path not in OPEN))
            and not (
                authorized(scope, key) or (data and self.data_key is not None and self.data_key(scope, key))
            )
        ):
            how = "'Authorization: Bearer <key>', 'x-api-key: <key>'" + (
                ", the cookie glassbox_api_key or ?api_key=" if data else ""
            )
            response = error_response_for(
                app,
                path,
                401,
                f"missing or wrong API key (send {how})",
                code="invalid_api_key",
                headers={"WWW-Authenticate": "Bearer"},
            )
            await response(scope, receive, send)
            return
        await self.app(scope, receive, send)


def authorized(scope: Scope, key: str) -> bool:
    """The key as OpenAI's ``Authorization: Bearer`` or Anthropic's ``x-api-key`` (either may be sent)."""
    for name, value in scope.get("headers", []):
        if name == b"authorization":
            scheme, _, token = value.decode("latin-1").partition(" ")
            if scheme.lower() == "bearer" and secrets.compare_digest(token.strip().encode(), key.encode()):
                return True
        elif name == b"x-api-key" and secrets.compare_digest(value.strip(), key.encode()):
            return True
    return False


def add_gate(app: FastAPI, state: GateState, settings: GateSettings, **gate: Any) -> None:
    """The gate (``gate``: Gate's keyword arguments), then CORS in front of it where origins are allowed.
    Add it after the request limits (server/request_limits.py), so that the gate answers first."""
    app.add_middleware(Gate, state=state, **gate)
    if settings.allowed_origins:
        app.add_middleware(
            CORSMiddleware,
            allow_origins=settings.allowed_origins,
            allow_methods=settings.allowed_methods,
            allow_headers=settings.allowed_headers,
        )
