"""The multi-model server's app (torch-free): model listing and management, and every generation route
forwarded to the process of the model the request names.

Routes: /v1/models (every model, with ``status.value`` as llama.cpp's router reports it), GET /models and
/models/status (status, plan and, for loaded models, what they hold), POST /models/load and
/models/unload (llama.cpp's), Ollama's /api/tags, /api/ps, /api/show and /api/version, /health, /metrics
(labelled ``model``), the dashboard (server/router_dashboard.py), and any other POST: its JSON body's
``model`` names the model (400 for a name that is a path, URL or digest; 404 for one not served), which is
loaded if it is not and the request forwarded (server/router_proxy.py).
"""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from dataclasses import dataclass, field
from typing import Any

import httpx
from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse, PlainTextResponse, Response
from prometheus_client import CONTENT_TYPE_LATEST

from glassbox.perf.hardware import GIB
from glassbox.server import router_ollama
from glassbox.server.errors import ApiError, install_error_handlers, register_error_body
from glassbox.server.gate import add_gate
from glassbox.server.router import LOADED, Router, Served
from glassbox.server.router_dashboard import add_dashboard_routes
from glassbox.server.router_metrics import RouterMetrics
from glassbox.server.router_proxy import forward

MAX_BODY_BYTES = 64 << 20  # a request body the router reads before forwarding it
_GUARDED = ("/v1/", "/api/", "/models", "/tokenize", "/detokenize", "/rerank")


@dataclass(frozen=True)
class GateSettings:
    """The server flags the router applies itself (server/state.ServerSettings' names; that module imports
    the engine): the API key, CORS, and how long SIGTERM lets requests finish."""

    api_key: str | None = None
    drain_timeout_s: float = 5.0
    allowed_origins: list[str] = field(default_factory=list)
    allowed_methods: list[str] = field(default_factory=lambda: ["*"])
    allowed_headers: list[str] = field(default_factory=lambda: ["*"])


class RouterState:
    """What the gate and SIGTERM's drain (serve_cli._drain) need: draining, settings, and an ``engine``
    that counts the requests in flight over every model."""

    def __init__(self, router: Router, settings: GateSettings) -> None:
        self.router = router
        self.settings = settings
        self.draining = False
        self.tracer: Any = None
        self.engine = self

    @property
    def num_in_flight(self) -> int:
        return sum(m.in_flight for m in self.router.models.values())

    async def wait_idle(self, timeout_s: float) -> bool:
        deadline = time.monotonic() + timeout_s
        while self.num_in_flight and time.monotonic() < deadline:
            await asyncio.sleep(0.05)
        return not self.num_in_flight

    def abort_all(self) -> None:  # the children abort theirs when they get SIGTERM (router.shutdown)
        asyncio.get_running_loop().create_task(self.router.shutdown())


def _ollama_error(status: int, message: str, param: str | None, code: str | None) -> dict[str, Any]:
    return {"error": message}  # server/ollama.py's shape


def _anthropic_error(status: int, message: str, param: str | None, code: str | None) -> dict[str, Any]:
    kind = {400: "invalid_request_error", 401: "authentication_error", 404: "not_found_error",
            409: "invalid_request_error", 503: "overloaded_error"}.get(status, "api_error")  # fmt: skip
    return {"type": "error", "error": {"type": kind, "message": message}}  # server/anthropic.py's shape


async def _json_body(request: Request) -> tuple[bytes, dict[str, Any]]:
    body = await request.body()
    if len(body) > MAX_BODY_BYTES:
        raise ApiError(413, f"the request body is over {MAX_BODY_BYTES >> 20} MiB")
    try:
        obj = json.loads(body) if body else {}
    except ValueError:
        raise ApiError(400, "the request body is not valid JSON") from None
    if not isinstance(obj, dict):
        raise ApiError(400, "the request body must be a JSON object")
    return body, obj


def build_router_app(router: Router, settings: GateSettings, metrics: RouterMetrics) -> FastAPI:
    state = RouterState(router, settings)
    created = int(time.time())

    @asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        router.start()
        try:
            yield
        finally:
            state.draining = True
            await router.shutdown()

    app = FastAPI(title="glassbox (models)", version="0.1.0", lifespan=lifespan,
                  description="Several models behind one OpenAI-compatible server, loaded on demand.")  # fmt: skip
    app.state.glassbox = state
    install_error_handlers(app)
    register_error_body(app, "/api/", _ollama_error)
    register_error_body(app, "/v1/messages", _anthropic_error)
    add_gate(app, state, settings, guarded=_GUARDED)

    def card(m: Served) -> dict[str, Any]:
        return {"id": m.name, "object": "model", "created": created, "owned_by": "glassbox",
                "max_model_len": m.plan.max_model_len, "status": {"value": m.state}}  # fmt: skip

    async def child_health(m: Served) -> dict[str, Any] | None:
        p = m.process
        if m.state != LOADED or p is None:
            return None
        try:
            return dict((await router.client.get(p.url + "/health", timeout=5.0)).json())
        except (httpx.HTTPError, ValueError):
            return None

    async def held(m: Served) -> dict[str, Any] | None:
        """What a loaded model holds, measured: its process's RSS, its weights and KV cache as allocated."""
        health = await child_health(m)
        if health is None:
            return None
        rss = m.process.rss() if m.process is not None else None
        out = {"rss_gib": None if rss is None else round(rss / GIB, 3),
               "weights_gib": round(health.get("weights_bytes", 0) / GIB, 3),
               "kv_cache_gib": round(health.get("kv_cache_bytes", 0) / GIB, 3),
               "kv_cache_tokens": health.get("kv_cache_tokens")}  # fmt: skip
        for part, value in (
            ("rss", rss),
            ("weights", health.get("weights_bytes")),
            ("kv_cache", health.get("kv_cache_bytes")),
        ):
            if value is not None:
                metrics.held.labels(m.name, part).set(value)
        return out

    @app.get("/health")
    async def health() -> JSONResponse:
        ok = not state.draining
        models = {m.name: m.state for m in router.models.values()}
        return JSONResponse({"status": "ok" if ok else "unavailable", "models": models}, 200 if ok else 503)

    @app.get("/metrics")
    async def prometheus() -> Response:
        loaded = [m for m in router.models.values() if m.state == LOADED and m.process is not None]

        async def text(m: Served) -> tuple[str, str] | None:
            await held(m)
            try:
                assert m.process is not None
                return m.name, (await router.client.get(m.process.url + "/metrics", timeout=5.0)).text
            except (httpx.HTTPError, AssertionError):
                return None

        children = [t for t in await asyncio.gather(*(text(m) for m in loaded)) if t is not None]
        return Response(metrics.render(children), media_type=CONTENT_TYPE_LATEST)

    @app.get("/v1/models")
    async def list_models() -> dict[str, Any]:
        return {"object": "list", "data": [card(m) for m in router.models.values()]}

    @app.get("/v1/models/{model_id:path}")
    async def get_model(model_id: str) -> dict[str, Any]:
        return card(router.named(model_id))

    @app.get("/models")
    async def models() -> dict[str, Any]:
        return {"object": "list", "data": [router.status(m) for m in router.models.values()]}

    @app.get("/models/status")
    async def models_status() -> dict[str, Any]:
        s = router.settings
        entries = [router.status(m) for m in router.models.values()]
        measured = await asyncio.gather(*(held(m) for m in router.models.values()))
        for entry, memory in zip(entries, measured, strict=True):
            entry["memory"] = memory
        used = sum(m.held() for m in router.models.values() if m.state == LOADED)
        budget = {"budget_gib": round(s.memory_budget / GIB, 3), "how": s.budget_how,
                  "held_gib": round(used / GIB, 3), "max_loaded_models": s.max_loaded,
                  "idle_unload_seconds": s.idle_unload_s}  # fmt: skip
        return {"object": "list", "memory": budget, "data": entries}

    @app.post("/models/load")
    async def load(request: Request) -> dict[str, Any]:
        _, body = await _json_body(request)
        m = router.named(body.get("model"))
        t0 = time.monotonic()
        waited = await router.ensure_loaded(m)
        return {
            "success": True,
            "model": m.name,
            "load_seconds": round(time.monotonic() - t0, 3) if waited else 0.0,
        }

    @app.post("/models/unload")
    async def unload(request: Request) -> dict[str, Any]:
        _, body = await _json_body(request)
        m = router.named(body.get("model"))
        return {"success": True, "model": m.name, "unloaded": await router.unload(m, "request")}

    @app.api_route("/api/version", methods=["GET", "HEAD"])
    async def version() -> dict[str, Any]:
        return {"version": "0.12.0"}  # server/ollama.py's OLLAMA_VERSION

    @app.get("/api/tags")
    async def tags() -> dict[str, Any]:
        return {"models": [router_ollama.tag(m.name, m.info) for m in router.models.values()]}

    @app.get("/api/ps")
    async def ps() -> dict[str, Any]:
        idle = router.settings.idle_unload_s
        now = time.monotonic()
        out = []
        for m in router.models.values():
            if m.state == LOADED:
                left = None if idle is None else max(0.0, idle - (now - m.last_used))
                out.append(router_ollama.running(m.name, m.info, m.held(), left, m.plan.max_model_len))
        return {"models": out}

    @app.post("/api/show")
    async def show(request: Request) -> Response:
        raw, body = await _json_body(request)
        m = router.named(body.get("model") or body.get("name"))
        if m.state == LOADED and m.process is not None:
            return await forward(router.client, request, raw, m.process, 0.0, lambda: None, lambda: None)
        return JSONResponse(router_ollama.show(m.info, m.plan.max_model_len))

    @app.api_route("/", methods=["GET", "HEAD"])
    async def index() -> PlainTextResponse:
        return PlainTextResponse("Ollama is running")  # Ollama's clients probe / for this line

    add_dashboard_routes(app, router)

    @app.post("/{path:path}")
    async def generate(path: str, request: Request) -> Response:
        raw, body = await _json_body(request)
        m = router.named(body.get("model"))
        load_s = await router.acquire(m)
        process = m.process
        assert process is not None  # loaded, and no await since
        released = False

        def done() -> None:
            nonlocal released
            if not released:
                released = True
                router.release(m)

        return await forward(router.client, request, raw, process, load_s,
                             lambda: router.crash_message(m, process), done)  # fmt: skip

    return app
