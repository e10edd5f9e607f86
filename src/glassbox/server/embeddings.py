"""OpenAI's ``POST /v1/embeddings`` and the Cohere/Jina-shaped ``POST /v1/rerank`` (also ``/rerank``), as vLLM
and llama.cpp serve them, over the server's EmbeddingService (server/embed_service.py).

/v1/embeddings: ``input`` a string, a list of strings, a token array or a list of token arrays (at most 2048);
``encoding_format`` "float" or "base64" (little-endian float32, what the openai client asks by default);
``dimensions`` where the model was trained for shorter vectors (config.json ``matryoshka_dimensions`` or
``is_matryoshka``, vLLM's keys); glassbox's ``truncate`` (as text-embeddings-inference's) cuts an input past
the model's limit instead of refusing it. Answers carry ``usage`` and the request's anatomy as ``metrics``.
/v1/rerank: ``query``, ``documents`` (strings or {"text"}), ``top_n`` (0 or absent: all), ``return_documents``
(default true, as vLLM); results sorted by ``relevance_score`` (the cross-encoder's sigmoid), best first.
Errors are OpenAI's shape: bad input 400, an unknown model 404.
"""

from __future__ import annotations

import base64
import uuid
from collections.abc import Callable
from typing import Any, Literal

import numpy as np
import torch
from fastapi import FastAPI
from fastapi.responses import JSONResponse
from pydantic import BaseModel, Field

from glassbox.engine.async_embedder import EmbedError
from glassbox.engine.embed_request import InputError
from glassbox.server.embed_service import EmbeddingService, NotServed
from glassbox.server.errors import ApiError
from glassbox.server.protocol import ErrorResponse, RequestAnatomy, _Body

CheckModel = Callable[[str | None], None]  # 404 (ApiError) unless None or the served model's name


class EmbeddingRequest(_Body):
    model: str | None = Field(None, description="the served model name (default: the one served)")
    input: Any = Field(
        ..., description="a string, a list of strings, a token array, or a list of token arrays"
    )
    encoding_format: Literal["float", "base64"] = "float"
    dimensions: int | None = Field(None, description="a shorter vector, where the model was trained for it")
    user: str | None = None
    truncate: bool = Field(False, description="cut an input past the model's limit (else a 400)")


class RerankRequest(_Body):
    model: str | None = None
    query: Any = Field(..., description="the query, a string")
    documents: Any = Field(..., description="the documents: strings or {'text': str} objects")
    top_n: int | None = Field(None, ge=0, description="the best n (0 or absent: all)")
    return_documents: bool = True
    truncate: bool = Field(False, description="cut a pair past the model's limit (the longer text first)")


class EmbeddingData(BaseModel):
    object: Literal["embedding"] = "embedding"
    index: int
    embedding: list[float] | str


class EmbeddingUsage(BaseModel):
    prompt_tokens: int
    total_tokens: int


class EmbeddingResponse(BaseModel):
    object: Literal["list"] = "list"
    data: list[EmbeddingData]
    model: str
    usage: EmbeddingUsage
    metrics: RequestAnatomy | None = None


class RerankDocument(BaseModel):
    text: str


class RerankResult(BaseModel):
    index: int
    relevance_score: float
    document: RerankDocument | None = None


class RerankResponse(BaseModel):
    id: str
    model: str
    results: list[RerankResult]
    usage: EmbeddingUsage
    metrics: RequestAnatomy | None = None


def _api_error(e: Exception) -> ApiError:
    if isinstance(e, InputError):
        return ApiError(400, e.message, e.param, e.code)
    if isinstance(e, NotServed):
        return ApiError(400, e.message, "model", "model_not_supported")
    assert isinstance(e, EmbedError)
    return ApiError(e.status, e.message)


def encode_vector(vector: torch.Tensor, fmt: str) -> list[float] | str:
    """A (D,) float32 vector as OpenAI sends it: a list of floats, or base64 of its little-endian float32."""
    if fmt == "base64":
        return base64.b64encode(vector.numpy().astype("<f4").tobytes()).decode("ascii")
    return [float(x) for x in vector.tolist()]


def install_embedding_routes(app: FastAPI, service: EmbeddingService, check_model: CheckModel) -> None:
    """/v1/embeddings, /v1/rerank and /rerank; ``app.state.embeddings`` holds the service."""
    app.state.embeddings = service
    errors: dict[int | str, dict[str, Any]] = {c: {"model": ErrorResponse} for c in (400, 401, 404, 503)}

    @app.post("/v1/embeddings", response_model=EmbeddingResponse, responses=errors)
    async def create_embeddings(body: EmbeddingRequest) -> JSONResponse:
        check_model(body.model)
        try:
            out = await service.embed(body.input, body.truncate, body.dimensions)
        except (InputError, NotServed, EmbedError) as e:
            raise _api_error(e) from None
        tokens = out.metrics.prompt_tokens
        data = [
            {"object": "embedding", "index": i, "embedding": encode_vector(v, body.encoding_format)}
            for i, v in enumerate(out.vectors)
        ]
        return JSONResponse({
            "object": "list", "data": data, "model": service.model_name,
            "usage": {"prompt_tokens": tokens, "total_tokens": tokens}, "metrics": out.metrics.as_dict(),
        })  # fmt: skip

    async def rerank(body: RerankRequest) -> JSONResponse:
        check_model(body.model)
        try:
            out = await service.rerank(body.query, body.documents, body.truncate)
        except (InputError, NotServed, EmbedError) as e:
            raise _api_error(e) from None
        order = np.argsort(-np.asarray(out.scores), kind="stable")
        if body.top_n:
            order = order[: body.top_n]
        results = []
        for i in order.tolist():
            item: dict[str, Any] = {"index": i, "relevance_score": out.scores[i]}
            if body.return_documents:
                item["document"] = {"text": out.documents[i]}
            results.append(item)
        tokens = out.metrics.prompt_tokens
        return JSONResponse({
            "id": f"rerank-{uuid.uuid4().hex}", "model": service.model_name,
            "results": results, "usage": {"prompt_tokens": tokens, "total_tokens": tokens},
            "metrics": out.metrics.as_dict(),
        })  # fmt: skip

    for path in ("/v1/rerank", "/rerank"):
        app.post(path, response_model=RerankResponse, responses=errors)(rerank)
