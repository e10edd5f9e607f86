"""The FastAPI app: OpenAI-compatible routes, health, Prometheus metrics, (de)tokenize.

``build_app(async_engine, settings, metrics)`` returns an app whose lifespan starts and stops the engine
thread. The gate in front (server/gate.py) answers 503 while shutting down and 401 without the API key;
with --allowed-origins, Starlette's CORS middleware sits in front of the gate.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any

from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse, Response
from prometheus_client import CONTENT_TYPE_LATEST

from glassbox.engine.async_embedder import AsyncEmbedder
from glassbox.engine.async_engine import AsyncEngine
from glassbox.server import anthropic, ollama, responses
from glassbox.server.chat import chat_flags, create_chat_completion
from glassbox.server.chat_prompt import chat_prompt, template_variables, text_prompts
from glassbox.server.completions import create_completion
from glassbox.server.dashboard import DATA_PATHS, dashboard_key, install_dashboard
from glassbox.server.embed_service import EmbeddingService
from glassbox.server.embeddings import install_embedding_routes
from glassbox.server.errors import bad_request, install_error_handlers
from glassbox.server.gate import add_gate
from glassbox.server.metrics import ServerMetrics
from glassbox.server.ollama_embed import install_ollama_embed_routes
from glassbox.server.protocol import (
    ChatCompletionRequest,
    ChatCompletionResponse,
    CompletionRequest,
    CompletionResponse,
    DetokenizeRequest,
    DetokenizeResponse,
    ErrorResponse,
    HealthResponse,
    ModelCard,
    ModelList,
    TokenizeRequest,
    TokenizeResponse,
)
from glassbox.server.request_limits import install_request_limits
from glassbox.server.state import ServerSettings, ServerState
from glassbox.server.tools import check_tools
from glassbox.tokenizer.request_text import decode_in_pieces


def _errors(*codes: int) -> dict[int | str, dict[str, Any]]:
    return {code: {"model": ErrorResponse} for code in codes}


_SSE: dict[int | str, dict[str, Any]] = {
    200: {"content": {"text/event-stream": {}}, "description": "JSON, or server-sent events when stream"}
}


def build_app(
    engine: AsyncEngine,
    settings: ServerSettings,
    metrics: ServerMetrics,
    embedder: AsyncEmbedder | None = None,
) -> FastAPI:
    """The server app around a (not yet started) AsyncEngine whose observer is ``metrics``; ``embedder``:
    the same model's embeddings (``--pooling``), else /v1/embeddings answers that it does not embed."""
    state = ServerState(engine, settings, metrics)
    executor = engine.engine.executor
    embeddings = EmbeddingService(embedder, state.model_name, "generate", metrics.registry)

    @asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        engine.start()
        embeddings.start()
        try:
            yield
        finally:
            state.draining = True
            engine.abort_all()
            embeddings.shutdown()
            await engine.shutdown(timeout_s=3.0)

    app = FastAPI(
        title="glassbox",
        version="0.1.0",
        lifespan=lifespan,
        description="An OpenAI-compatible LLM server whose every request is a glass box.",
    )
    app.state.glassbox = state
    install_error_handlers(app)
    install_request_limits(app, settings.max_request_bytes)  # inside the gate
    add_gate(app, state, settings, data_paths=frozenset(DATA_PATHS), data_key=dashboard_key)

    @app.get("/health", response_model=HealthResponse, responses=_errors(503))
    async def health() -> JSONResponse:
        s = engine.stats
        ok = engine.is_running and not state.draining
        body = {
            "status": "ok" if ok else "unavailable",
            "num_requests_running": s.num_running,
            "num_requests_waiting": s.num_waiting,
            "kv_cache_free_blocks": s.num_free_blocks,
            "kv_cache_total_blocks": s.num_blocks,
            "kv_cache_usage": s.kv_usage,
            # what the model holds (the multi-model server's /models/status shows it)
            "weights_bytes": executor.weight_bytes,
            "kv_cache_bytes": executor.kv_plan.num_blocks * executor.kv_plan.bytes_per_block,
            "kv_cache_tokens": executor.kv_plan.num_tokens,
        }
        return JSONResponse(body, status_code=200 if ok else 503)

    @app.get("/metrics", response_class=Response, responses={200: {"content": {"text/plain": {}}}})
    async def prometheus_metrics() -> Response:
        return Response(metrics.render(), media_type=CONTENT_TYPE_LATEST)

    @app.get("/v1/models", response_model=ModelList, responses=_errors(401))
    async def list_models() -> dict[str, Any]:
        return {"object": "list", "data": [_card(state)]}

    @app.get("/v1/models/{model_id:path}", response_model=ModelCard, responses=_errors(401, 404))
    async def get_model(model_id: str) -> dict[str, Any]:
        state.check_model(model_id)
        return _card(state)

    @app.post(
        "/v1/completions",
        response_model=CompletionResponse,
        responses={**_SSE, **_errors(400, 401, 404, 429, 503)},
    )
    async def completions(body: CompletionRequest, request: Request) -> Response:
        return await create_completion(state, body, request)

    @app.post(
        "/v1/chat/completions",
        response_model=ChatCompletionResponse,
        responses={**_SSE, **_errors(400, 401, 404, 429, 503)},
    )
    async def chat_completions(body: ChatCompletionRequest, request: Request) -> Response:
        return await create_chat_completion(state, body, request)

    @app.post("/tokenize", response_model=TokenizeResponse, responses=_errors(400, 401, 404))
    async def tokenize(body: TokenizeRequest) -> dict[str, Any]:
        """Token ids of a prompt, or of messages rendered as /v1/chat/completions renders them (the same
        add_generation_prompt / continue_final_message rules; tools are refused there, so here too)."""
        state.check_model(body.model)
        if (body.prompt is None) == (body.messages is None):
            raise bad_request("give exactly one of prompt or messages", "prompt")
        if body.messages is not None:
            if not body.messages:
                raise bad_request("messages must contain at least one message", "messages")
            variables = template_variables(body.chat_template_kwargs)
            if body.tools:  # checked as the chat endpoint checks them
                tools = check_tools(body.tools, "none", None, False)
                variables["tools"] = tools.tools if tools is not None else body.tools
            messages = [m.model_dump(exclude_none=True) for m in body.messages]
            prompt = await chat_prompt(
                state, messages, *chat_flags(body), variables, body.special_tokens_in_user_text
            )
        else:
            (prompt,) = await text_prompts(
                state, [body.prompt or ""], body.add_special_tokens, body.special_tokens_in_user_text
            )
        ids = prompt.ids
        out: dict[str, Any] = {"count": len(ids), "max_model_len": state.max_model_len, "tokens": ids}
        if body.return_token_strs:
            out["token_strs"] = await asyncio.to_thread(lambda: [state.tokenizer.id_to_token(t) for t in ids])
        return out

    @app.post("/detokenize", response_model=DetokenizeResponse, responses=_errors(400, 401, 404))
    async def detokenize(body: DetokenizeRequest) -> dict[str, Any]:
        state.check_model(body.model)
        bad = [t for t in body.tokens if not 0 <= t < state.vocab_size]
        if bad:
            raise bad_request(
                f"tokens holds ids outside the vocabulary [0, {state.vocab_size}): {bad[:5]}", "tokens"
            )
        return {"prompt": await asyncio.to_thread(decode_in_pieces, state.tokenizer, body.tokens)}

    install_embedding_routes(app, embeddings, state.check_model)  # /v1/embeddings, /v1/rerank, /rerank
    install_ollama_embed_routes(app, embeddings)  # /api/embed, /api/embeddings
    anthropic.add_routes(app, state)  # /v1/messages
    ollama.add_routes(app, state)  # /api/chat, /api/generate, /api/tags, /api/show, ...
    responses.add_routes(app, state)  # /v1/responses
    install_dashboard(app, state)  # /, /dashboard and its data endpoints
    return app


def _card(state: ServerState) -> dict[str, Any]:
    return {
        "id": state.model_name,
        "object": "model",
        "created": state.created,
        "owned_by": "glassbox",
        "max_model_len": state.max_model_len,
    }
