"""The embedding server's gate (server/gate.py, shared with the generation server and the router): 401
without the API key in the dialect's shape of the path, the key as either header, /health open, CORS in front
of the gate, and 503 while draining; in-process on a tiny cross-encoder."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest
from embedding_models import tiny_cross_encoder

KEY = "sk-embed"
ORIGIN = "http://app.example"


@pytest.fixture(scope="module")
def gated(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[Any, Any]]:
    from fastapi.testclient import TestClient

    from glassbox.config import EngineConfig
    from glassbox.engine.async_embedder import AsyncEmbedder
    from glassbox.engine.embedding_model import open_embedding_model
    from glassbox.server.embed_app import build_embedding_app
    from glassbox.server.state import ServerSettings

    path = tiny_cross_encoder(tmp_path_factory.mktemp("gate"))
    model = open_embedding_model(
        EngineConfig(model=str(path), device="cpu", served_model_name="ce"), "rerank"
    )
    settings = ServerSettings(api_key=KEY, allowed_origins=[ORIGIN])
    app = build_embedding_app(AsyncEmbedder(model, 4096, 64), settings)
    with TestClient(app) as client:
        yield client, app


def test_key_required_in_each_dialects_shape(gated: tuple[Any, Any]) -> None:
    client, _ = gated
    body = {"model": "ce", "query": "q", "documents": ["a", "b"]}
    r = client.post("/v1/rerank", json=body)
    assert r.status_code == 401 and r.json()["error"]["code"] == "invalid_api_key", r.text
    assert r.headers["www-authenticate"] == "Bearer"
    r = client.post("/api/embed", json={"model": "ce", "input": "a"})
    assert r.status_code == 401 and isinstance(r.json()["error"], str), r.text  # Ollama's {"error": "..."}
    for headers in ({"Authorization": f"Bearer {KEY}"}, {"x-api-key": KEY}):
        assert client.post("/v1/rerank", json=body, headers=headers).status_code == 200
    assert client.post("/v1/rerank", json=body, headers={"x-api-key": "wrong"}).status_code == 401
    assert client.get("/health").status_code == 200  # open


def test_cors_in_front_of_the_gate(gated: tuple[Any, Any]) -> None:
    client, _ = gated
    pre = client.options("/v1/rerank", headers={"Origin": ORIGIN, "Access-Control-Request-Method": "POST"})
    assert pre.status_code == 200 and pre.headers["access-control-allow-origin"] == ORIGIN  # no key needed
    r = client.post("/v1/rerank", json={}, headers={"Origin": ORIGIN})
    assert r.status_code == 401 and r.headers["access-control-allow-origin"] == ORIGIN


def test_draining_answers_503_but_metrics(gated: tuple[Any, Any]) -> None:
    client, app = gated
    state = app.state.glassbox
    state.draining = True
    try:
        r = client.post("/v1/rerank", json={}, headers={"x-api-key": KEY})
        assert r.status_code == 503 and r.headers["retry-after"] == "5", r.text
        assert client.get("/metrics").status_code == 200
    finally:
        state.draining = False
