"""The live dashboard: ``/dashboard`` (static HTML/CSS/JS shipped in server/static, no build step), its data
over server-sent events (``/dashboard/events``) and the planner beside the measurements (``/dashboard/plan``).

The data endpoints are read-only and, with ``--api-key``, need the key like /v1 does. A browser's
EventSource cannot send an Authorization header, so on these two paths (only) the key is also accepted as
the cookie ``glassbox_api_key`` (what the page sets when you type the key) or the query parameter
``api_key`` (shows up in access logs: prefer the cookie). The page and its static files need no key: they
hold no data. Bad query parameters get OpenAI-style 400s naming the parameter.
"""

from __future__ import annotations

import asyncio
import json
import logging
import math
import secrets
from collections.abc import AsyncIterator
from http.cookies import SimpleCookie
from pathlib import Path
from typing import Any
from urllib.parse import parse_qs, unquote

from fastapi import FastAPI, Request
from fastapi.responses import (
    FileResponse,
    HTMLResponse,
    JSONResponse,
    PlainTextResponse,
    Response,
    StreamingResponse,
)
from fastapi.staticfiles import StaticFiles
from starlette.types import Scope

from glassbox import __version__
from glassbox.anatomy import METRIC_KEYS
from glassbox.engine.llm_engine import LLMEngine, StepRecord
from glassbox.outputs import RequestOutput
from glassbox.server.dashboard_plan import Ceilings, measured
from glassbox.server.dashboard_recorder import Cursor, DashboardRecorder
from glassbox.server.errors import bad_request
from glassbox.server.state import ServerState

logger = logging.getLogger(__name__)

STATIC = Path(__file__).parent / "static"
DATA_PATHS = ("/dashboard/events", "/dashboard/plan")
KEY_COOKIE = "glassbox_api_key"
KEY_PARAM = "api_key"
_MAX_HISTORY = 1000  # finished requests a new client may ask to replay (the recorder keeps as many)

_INDEX = """<!doctype html><html><head><meta charset="utf-8"><title>glassbox</title></head>
<body style="font-family: sans-serif; margin: 2em">
<h1>glassbox</h1><p>An LLM server whose every request is a glass box.</p>
<ul>
<li><a href="/dashboard">/dashboard</a>: the live dashboard (requests, steps, latencies, playground)</li>
<li><a href="/docs">/docs</a>: the OpenAI-compatible API (/v1/completions, /v1/chat/completions, /v1/models);
the same port also speaks Anthropic's Messages API (/v1/messages), OpenAI's Responses API (/v1/responses)
and Ollama's API (/api/chat, /api/generate, /api/tags, /api/show, ...)</li>
<li><a href="/metrics">/metrics</a>: Prometheus metrics</li>
<li><a href="/health">/health</a>: health and load</li>
</ul></body></html>"""


def dashboard_key(scope: Scope, key: str) -> bool:
    """The API key as the dashboard's cookie or query parameter (the data paths only)."""
    query = scope.get("query_string", b"").decode("latin-1")
    given = parse_qs(query).get(KEY_PARAM, [])
    for name, value in scope.get("headers", []):
        if name == b"cookie":
            cookie: SimpleCookie = SimpleCookie()
            try:
                cookie.load(value.decode("latin-1"))
            except Exception:  # a malformed Cookie header is no key
                continue
            if KEY_COOKIE in cookie:
                given.append(unquote(cookie[KEY_COOKIE].value))  # the page URI-encodes it
    return any(secrets.compare_digest(g.encode(), key.encode()) for g in given)


class _Observers:
    """Both observers of the engine thread (Prometheus metrics and the dashboard), each failing alone."""

    def __init__(self, *observers: Any) -> None:
        self.observers = [o for o in observers if o is not None]

    def on_iteration(self, engine: LLMEngine, record: StepRecord | None) -> None:
        for o in self.observers:
            try:
                o.on_iteration(engine, record)
            except Exception:
                logger.exception("%s.on_iteration failed", type(o).__name__)

    def on_finished(self, output: RequestOutput) -> None:
        for o in self.observers:
            try:
                o.on_finished(output)
            except Exception:
                logger.exception("%s.on_finished failed", type(o).__name__)


def _query(request: Request, spec: dict[str, tuple[type, float, float]]) -> dict[str, Any]:
    """The query parameters ``spec`` names ({name: (int | float, low, high)}), checked; others are 400s."""
    params = request.query_params
    for name in params:
        if name not in spec and name != KEY_PARAM:
            known = ", ".join(spec) or "none"
            raise bad_request(
                f"unknown query parameter {name!r} (this endpoint takes: {known})",
                name,
                "unsupported_parameter",
            )
    out: dict[str, Any] = {}
    for name, (kind, lo, hi) in spec.items():
        values = params.getlist(name)
        if not values:
            continue
        if len(values) > 1:
            raise bad_request(f"{name} is given {len(values)} times; give it once", name)
        what = "an integer" if kind is int else "a number"
        try:
            value = kind(values[0])
        except ValueError:
            raise bad_request(f"{name} must be {what}, got {values[0]!r}", name) from None
        if isinstance(value, float) and not math.isfinite(value) or not lo <= value <= hi:
            raise bad_request(f"{name} must be {what} in [{lo:g}, {hi:g}], got {values[0]!r}", name)
        out[name] = value
    return out


def install_dashboard(app: FastAPI, state: ServerState) -> DashboardRecorder:
    """Add the dashboard's routes to ``app`` and its recorder to the engine thread's observers."""
    async_engine = state.engine
    llm = async_engine.engine
    recorder = DashboardRecorder(llm)
    async_engine.observer = _Observers(async_engine.observer, recorder)
    ceilings = Ceilings(llm)
    hello = {
        "model": state.model_name,
        "version": __version__,
        "device": str(llm.executor.device),
        "dtype": ceilings.dtype,
        "weights": ceilings.scheme.label,
        "max_num_seqs": state.max_num_seqs,
        "max_model_len": state.max_model_len,
        "max_num_batched_tokens": llm.max_num_batched_tokens,
        "num_blocks": llm.block_manager.num_blocks,
        "block_size": llm.block_manager.block_size,
        "metric_keys": list(METRIC_KEYS),
    }

    app.mount("/dashboard/static", StaticFiles(directory=STATIC), name="dashboard-static")

    @app.api_route("/", methods=["GET", "HEAD"], include_in_schema=False)
    async def index(request: Request) -> Response:
        # a browser (Accept: text/html) gets the index; Ollama's clients probe / for this line
        if "text/html" in request.headers.get("accept", ""):
            return HTMLResponse(_INDEX)
        return PlainTextResponse("Ollama is running")

    @app.get("/dashboard", include_in_schema=False)
    async def dashboard_page() -> FileResponse:
        return FileResponse(STATIC / "dashboard.html", headers={"Cache-Control": "no-cache"})

    @app.get("/dashboard/events", include_in_schema=False)
    async def dashboard_events(request: Request) -> StreamingResponse:
        q = _query(request, {"interval": (float, 0.05, 10.0), "history": (int, 0, _MAX_HISTORY)})
        interval = q.get("interval", 0.25)
        history = q.get("history", 300)
        ceilings.start_probe()
        return StreamingResponse(
            _events(state, recorder, ceilings, hello, interval, history),
            media_type="text/event-stream",
            headers={"Cache-Control": "no-cache", "X-Accel-Buffering": "no"},
        )

    @app.get("/dashboard/plan", include_in_schema=False)
    async def dashboard_plan(request: Request) -> JSONResponse:
        limit = state.max_model_len
        q = _query(
            request,
            {
                "prompt_tokens": (int, 1, limit),
                "output_tokens": (int, 1, limit),
                "concurrency": (int, 1, 4096),
            },
        )
        got = measured(recorder.finished_metrics())
        prompt = q.get("prompt_tokens", got.get("prompt_tokens") or 128)
        output = q.get("output_tokens", got.get("output_tokens") or 64)
        conc = q.get("concurrency", max(1, round(recorder.mean_running())))
        body: dict[str, Any] = {
            "workload": {"prompt_tokens": prompt, "output_tokens": output, "concurrency": conc},
            "measured": got,
            "mean_running": recorder.mean_running(),
            "predicted": None,
            "error": None,
        }
        await ceilings.ready()
        try:
            body["predicted"] = await asyncio.to_thread(ceilings.predict, prompt, output, conc)
        except Exception as e:  # the planner cannot cost this model: say so beside the measurements
            logger.warning("dashboard plan failed: %s", e)
            body["error"] = f"{type(e).__name__}: {e}"
        return JSONResponse(body)

    return recorder


async def _events(
    state: ServerState,
    recorder: DashboardRecorder,
    ceilings: Ceilings,
    hello: dict[str, Any],
    interval: float,
    history: int,
) -> AsyncIterator[str]:
    """``hello`` once, then an ``update`` every ``interval`` seconds until the client leaves or the server
    drains."""
    first = {**hello, "now": recorder.now(), "interval": interval}
    yield f"event: hello\ndata: {json.dumps(first)}\n\n"
    cur = Cursor()
    sent_roofline = False
    while not state.draining:
        body, batches = recorder.delta(cur, history)
        by_index = {e["i"]: e for e in body["steps"]}
        for i, flat in batches:
            entry = by_index.get(i)
            # a greedy decode burst ran its rows several times: the figures of one pass, on average
            figures = (
                ceilings.step_figures(flat, entry["exec"] / entry["passes"]) if entry is not None else None
            )
            if entry is not None and figures is not None:
                entry["gbs"], entry["tflops"] = figures
        body["probe"] = ceilings.status
        if not sent_roofline and ceilings.hw is not None:
            body["roofline"] = ceilings.roofline()
            sent_roofline = True
        elif ceilings.error:
            body["probe_error"] = ceilings.error
        yield f"event: update\ndata: {json.dumps(body)}\n\n"
        await asyncio.sleep(interval)
