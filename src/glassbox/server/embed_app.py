"""The app of a server whose model embeds or reranks (``--task embed`` / ``rerank``, or found so in the
checkpoint): /v1/embeddings, /v1/rerank and /rerank, Ollama's /api/embed and /api/embeddings, /v1/models,
/health, /metrics. The generation routes answer 400 in their dialect's shape (the model does not generate).
The same gate as the generation server's answers 503 while draining and 401 without the API key.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import asynccontextmanager
from typing import Any

from fastapi import FastAPI
from fastapi.responses import JSONResponse, Response
from prometheus_client import CONTENT_TYPE_LATEST, CollectorRegistry, generate_latest

from glassbox.engine.async_embedder import AsyncEmbedder
from glassbox.server.embed_service import EmbeddingService
from glassbox.server.embeddings import install_embedding_routes
from glassbox.server.errors import ApiError, install_error_handlers, shown
from glassbox.server.gate import add_gate
from glassbox.server.ollama_embed import install_ollama_embed_routes, ollama_error
from glassbox.server.request_limits import install_request_limits
from glassbox.server.state import ServerSettings


class EmbedServerState:
    """The shared state of an embedding server (the gate's and SIGTERM's view: serve_cli._drain)."""

    def __init__(self, embedder: AsyncEmbedder, settings: ServerSettings, service: EmbeddingService) -> None:
        self.engine = embedder
        self.settings = settings
        self.service = service
        self.draining = False
        self.tracer: Any = None  # no OpenTelemetry spans for embeddings yet

    def check_model(self, model: str | None) -> None:
        """404 (OpenAI's ``model_not_found``) unless ``model`` is None or the served model's name."""
        name = self.service.model_name
        if model is not None and model != name:
            raise ApiError(404, f"the model {shown(model)} does not exist; this server serves {name!r}", "model",
                           "model_not_found")  # fmt: skip


def build_embedding_app(embedder: AsyncEmbedder, settings: ServerSettings) -> FastAPI:
    """The server app around a (not yet started) AsyncEmbedder."""
    model = embedder.model
    registry = CollectorRegistry()
    service = EmbeddingService(embedder, model.name, model.task, registry)
    state = EmbedServerState(embedder, settings, service)

    @asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        service.start()
        try:
            yield
        finally:
            state.draining = True
            service.shutdown()

    app = FastAPI(
        title="glassbox",
        version="0.1.0",
        lifespan=lifespan,
        description="An OpenAI-compatible embedding and rerank server whose every request is a glass box.",
    )
    app.state.glassbox = state
    install_error_handlers(app)
    install_request_limits(app, settings.max_request_bytes)  # inside the gate
    add_gate(app, state, settings)

    @app.get("/health")
    async def health() -> JSONResponse:
        s = embedder.stats
        ok = embedder.is_running and not state.draining
        body = {"status": "ok" if ok else "unavailable", "task": model.task,
                "num_requests_running": s.num_running, "num_requests_waiting": s.num_waiting,
                "batches": s.batches, "sequences": s.sequences, "tokens": s.tokens}  # fmt: skip
        return JSONResponse(body, status_code=200 if ok else 503)

    @app.get("/metrics", response_class=Response)
    async def prometheus_metrics() -> Response:
        return Response(generate_latest(registry), media_type=CONTENT_TYPE_LATEST)

    def card() -> dict[str, Any]:
        return {"id": model.name, "object": "model", "created": service.created, "owned_by": "glassbox",
                "max_model_len": model.max_tokens, "task": model.task,
                **({"dimensions": model.dimension} if model.task == "embed" else {})}  # fmt: skip

    @app.get("/v1/models")
    async def list_models() -> dict[str, Any]:
        return {"object": "list", "data": [card()]}

    @app.get("/v1/models/{model_id:path}")
    async def get_model(model_id: str) -> dict[str, Any]:
        state.check_model(model_id)
        return card()

    does_not = "embeds" if model.task == "embed" else "reranks"

    async def no_generation() -> Response:
        raise ApiError(400, f"the model {model.name!r} {does_not}: it does not generate text", "model",
                       "model_not_supported")  # fmt: skip

    for path in ("/v1/completions", "/v1/chat/completions"):
        app.post(path, include_in_schema=False)(no_generation)
    for path, what in (("/api/generate", "generate"), ("/api/chat", "chat")):
        app.post(path, include_in_schema=False)(_ollama_refusal(model.name, what))

    install_embedding_routes(app, service, state.check_model)
    install_ollama_embed_routes(app, service)
    return app


def _ollama_refusal(name: str, what: str) -> Callable[[], Awaitable[Response]]:
    async def refuse() -> Response:  # Ollama's words for a model without the capability
        return ollama_error(400, f'"{name}" does not support {what}')

    return refuse
