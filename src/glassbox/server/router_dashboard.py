"""The dashboard of a multi-model server: ``/dashboard`` lists the models, ``/dashboard?model=NAME`` opens
that model's dashboard, whose data (``/dashboard/events``, ``/dashboard/plan``) comes from its process,
so every chart carries the model it shows. The model is remembered in the cookie ``glassbox_model`` (the
page's scripts ask for their data without naming it). The dashboard does not load a model; its data
paths need the API key as the model's process checks it. Torch-free."""

from __future__ import annotations

import html
from pathlib import Path

from fastapi import FastAPI, Request
from fastapi.responses import FileResponse, HTMLResponse, Response
from fastapi.staticfiles import StaticFiles

from glassbox.server.errors import ApiError
from glassbox.server.router import LOADED, Router
from glassbox.server.router_proxy import forward

STATIC = Path(__file__).parent / "static"  # server/dashboard.py's page and scripts
COOKIE = "glassbox_model"


def add_dashboard_routes(app: FastAPI, router: Router) -> None:
    app.mount("/dashboard/static", StaticFiles(directory=STATIC), name="dashboard-static")

    @app.get("/dashboard", include_in_schema=False)
    async def page(request: Request) -> Response:
        name = request.query_params.get("model")
        if name is None:
            rows = "".join(
                f'<li><a href="/dashboard?model={html.escape(m.name, quote=True)}">{html.escape(m.name)}</a> '
                f"({m.state})</li>"
                for m in router.models.values()
            )
            return HTMLResponse(
                f"<!doctype html><title>glassbox models</title><h1>models</h1><ul>{rows}</ul>"
            )
        m = router.named(name)
        if m.state != LOADED:
            text = f"{html.escape(m.name)} is {m.state}: a request to it (or POST /models/load) loads it"
            return HTMLResponse(f"<!doctype html><title>glassbox</title><p>{text}</p>", status_code=409)
        response = FileResponse(STATIC / "dashboard.html", headers={"Cache-Control": "no-cache"})
        response.set_cookie(COOKIE, m.name, path="/dashboard", samesite="strict")
        return response

    async def data(request: Request) -> Response:
        m = router.named(request.query_params.get("model") or request.cookies.get(COOKIE))
        if m.state != LOADED or m.process is None:
            raise ApiError(409, f"model {m.name!r} is {m.state}; its dashboard shows it once loaded", "model")
        return await forward(
            router.client, request, b"", m.process, 0.0, lambda: None, lambda: None, ("model",)
        )

    app.add_api_route("/dashboard/events", data, methods=["GET"], include_in_schema=False)
    app.add_api_route("/dashboard/plan", data, methods=["GET"], include_in_schema=False)
