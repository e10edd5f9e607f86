"""Ollama's embedding routes: ``POST /api/embed`` and the older ``POST /api/embeddings``, over the server's
EmbeddingService (server/embed_service.py), in Ollama's shapes and with its errors (``{"error": "..."}``).

/api/embed: ``input`` a string or a list of strings (empty: a 200 with no embeddings, Ollama's way to load a
model), ``truncate`` (default true: an input past the limit is cut), ``dimensions``, ``options`` and
``keep_alive`` accepted (the model stays loaded); vectors L2-normalized, as Ollama returns them; the answer
carries ``total_duration``, ``load_duration`` (0: loaded at start) and ``prompt_eval_count``, plus the
request's anatomy as ``metrics``. /api/embeddings: ``prompt`` a string (empty: an empty embedding), the
pipeline's own vector (not renormalized), no truncation, as Ollama.
"""

from __future__ import annotations

import json
from typing import Any

import torch.nn.functional as F
from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse

from glassbox.engine.async_embedder import EmbedError
from glassbox.engine.embed_request import InputError
from glassbox.server.embed_service import EmbeddingService, NotServed
from glassbox.server.errors import register_error_body, shown
from glassbox.server.protocol import _lone_surrogate


class OllamaError(Exception):
    def __init__(self, status: int, message: str) -> None:
        super().__init__(message)
        self.status = status
        self.message = message


def ollama_error(status: int, message: str) -> JSONResponse:
    return JSONResponse(_error_body(status, message), status_code=status)


def _error_body(
    status: int, message: str, param: str | None = None, code: str | None = None
) -> dict[str, Any]:
    return {"error": message}  # Ollama's error shape


async def _body(request: Request) -> dict[str, Any]:
    raw = await request.body()
    if not raw.strip():
        raise OllamaError(400, "missing request body")
    try:
        body = await request.json()  # parsed and checked already (server/request_limits.py)
    except (json.JSONDecodeError, UnicodeDecodeError) as e:
        raise OllamaError(400, f"invalid JSON: {e}") from None
    if not isinstance(body, dict):
        raise OllamaError(400, "the request body must be a JSON object")
    where = _lone_surrogate(body, "")
    if where is not None:
        raise OllamaError(
            400, f"{where or 'a field name'} holds a lone UTF-16 surrogate, not valid Unicode text"
        )
    return body


def _check_model(service: EmbeddingService, model: Any) -> str:
    """The request's model name: the served one, with or without Ollama's ``:latest`` tag."""
    if not isinstance(model, str) or not model:
        raise OllamaError(400, "model is required")
    if model not in (service.model_name, f"{service.model_name}:latest"):
        raise OllamaError(404, f"model {shown(model)} not found")
    return model


def _flag(body: dict[str, Any], key: str, default: bool) -> bool:
    value = body.get(key, default)
    if value is None:
        return default
    if not isinstance(value, bool):
        raise OllamaError(400, f"{key} must be true or false")
    return value


def _translate(e: Exception) -> OllamaError:
    if isinstance(e, (InputError, NotServed)):
        return OllamaError(400, e.message)
    assert isinstance(e, EmbedError)
    return OllamaError(e.status, e.message)


def _schema(properties: dict[str, Any], required: list[str]) -> dict[str, Any]:
    """The route's body in the OpenAPI schema (the handler reads the JSON itself, to answer in Ollama's shape)."""
    body = {"type": "object", "properties": properties, "required": required}
    return {"requestBody": {"required": True, "content": {"application/json": {"schema": body}}}}


_EMBED = _schema(
    {
        "model": {"type": "string"},
        "input": {"anyOf": [{"type": "string"}, {"type": "array", "items": {"type": "string"}}]},
        "truncate": {"type": "boolean"},
        "dimensions": {"type": "integer"},
        "options": {"type": "object"},
        "keep_alive": {"anyOf": [{"type": "string"}, {"type": "number"}]},
    },
    ["model"],
)
_EMBEDDINGS = _schema(
    {"model": {"type": "string"}, "prompt": {"type": "string"}, "options": {"type": "object"},
     "keep_alive": {"anyOf": [{"type": "string"}, {"type": "number"}]}},
    ["model"],
)  # fmt: skip


def install_ollama_embed_routes(app: FastAPI, service: EmbeddingService) -> None:
    register_error_body(app, "/api/", _error_body)  # the body limit's 413 and a JSON error in Ollama's shape

    @app.post("/api/embed", openapi_extra=_EMBED)
    async def embed(request: Request) -> JSONResponse:
        try:
            body = await _body(request)
            model = _check_model(service, body.get("model"))
            inputs = body.get("input")
            if inputs is None or inputs == "" or inputs == []:  # Ollama: nothing to embed loads the model
                if service.model is None or service.model.task != "embed":
                    raise _translate(NotServed(f'"{model}" does not support embeddings'))
                return JSONResponse({"model": model, "embeddings": []})
            if not isinstance(inputs, str) and not (
                isinstance(inputs, list) and all(isinstance(x, str) for x in inputs)
            ):
                raise OllamaError(400, "invalid input type")
            dims = body.get("dimensions")
            if dims is not None and (type(dims) is not int or dims < 1):
                raise OllamaError(400, "dimensions must be a positive integer")
            try:
                out = await service.embed(inputs, _flag(body, "truncate", True), dims)
            except (InputError, NotServed, EmbedError) as e:
                raise _translate(e) from None
        except OllamaError as e:
            return ollama_error(e.status, e.message)
        m = out.metrics
        vectors = F.normalize(out.vectors, dim=-1)  # Ollama's /api/embed answers unit vectors
        return JSONResponse({
            "model": model, "embeddings": vectors.tolist(), "total_duration": int(m.e2e_s * 1e9),
            "load_duration": 0, "prompt_eval_count": m.prompt_tokens, "metrics": m.as_dict(),
        })  # fmt: skip

    @app.post("/api/embeddings", openapi_extra=_EMBEDDINGS)
    async def embeddings(request: Request) -> JSONResponse:
        try:
            body = await _body(request)
            model = _check_model(service, body.get("model"))
            prompt = body.get("prompt")
            if prompt is not None and not isinstance(prompt, str):
                raise OllamaError(400, "prompt must be a string")
            if not prompt:
                if service.model is None or service.model.task != "embed":
                    raise _translate(NotServed(f'"{model}" does not support embeddings'))
                return JSONResponse({"embedding": []})
            try:
                out = await service.embed(prompt, False, None, param="prompt")
            except (InputError, NotServed, EmbedError) as e:
                raise _translate(e) from None
        except OllamaError as e:
            return ollama_error(e.status, e.message)
        return JSONResponse({"embedding": out.vectors[0].tolist()})
