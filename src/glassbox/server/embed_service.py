"""What every embedding and rerank route shares, whichever dialect it speaks: the running embedder (or none:
the served model does not embed), the checks (engine/embed_request.py), the batching (AsyncEmbedder), the
anatomy and the Prometheus counters. A route only translates its dialect's request and answer.
"""

from __future__ import annotations

import asyncio
import time
from dataclasses import dataclass

import torch
from fastapi import FastAPI
from prometheus_client import CollectorRegistry, Counter, Histogram

from glassbox.anatomy import RequestMetrics
from glassbox.engine.async_embedder import AsyncEmbedder
from glassbox.engine.embed_request import check_dimensions, embedding_inputs, rerank_inputs, shorten
from glassbox.engine.embedding_model import EmbeddingModel
from glassbox.server.metrics import PREFIX, REQUEST_BUCKETS


class NotServed(Exception):
    """The served model does not do what the route asks (embed, rerank): a 400 in the route's dialect."""

    def __init__(self, message: str) -> None:
        super().__init__(message)
        self.message = message


@dataclass
class Embedded:
    vectors: torch.Tensor  # (N, dimensions) float32
    metrics: RequestMetrics


@dataclass
class Reranked:
    documents: list[str]
    scores: list[float]  # in the documents' order
    metrics: RequestMetrics


class EmbeddingMetrics:
    """Prometheus collectors of the embedding routes, added to the server's registry."""

    def __init__(self, registry: CollectorRegistry) -> None:
        self.requests = Counter(PREFIX + "embedding_requests_total", "Embedding and rerank requests answered.",
                                ("task",), registry=registry)  # fmt: skip
        self.inputs = Counter(PREFIX + "embedding_inputs_total", "Texts (or pairs) embedded or scored.",
                              ("task",), registry=registry)  # fmt: skip
        self.tokens = Counter(PREFIX + "embedding_prompt_tokens_total", "Tokens of the inputs.", ("task",),
                              registry=registry)  # fmt: skip
        self.e2e = Histogram(PREFIX + "embedding_request_duration_seconds", "Arrival to answer.", ("task",),
                             buckets=REQUEST_BUCKETS, registry=registry)  # fmt: skip
        self.queue = Histogram(PREFIX + "embedding_queue_time_seconds", "Waiting for the model.", ("task",),
                               buckets=REQUEST_BUCKETS, registry=registry)  # fmt: skip

    def observe(self, task: str, inputs: int, m: RequestMetrics) -> None:
        self.requests.labels(task).inc()
        self.inputs.labels(task).inc(inputs)
        self.tokens.labels(task).inc(m.prompt_tokens)
        self.e2e.labels(task).observe(m.e2e_s)
        self.queue.labels(task).observe(m.queue_s)


class EmbeddingService:
    """The embedding side of one server. ``embedder`` None: the served model does not embed (a generative
    model without ``--pooling``); ``task`` is what the server serves ("generate", "embed", "rerank")."""

    def __init__(
        self, embedder: AsyncEmbedder | None, model_name: str, task: str, registry: CollectorRegistry
    ) -> None:
        self.embedder = embedder
        self.model_name = model_name
        self.task = task
        self.metrics = EmbeddingMetrics(registry)
        self.created = int(time.time())

    @property
    def model(self) -> EmbeddingModel | None:
        return None if self.embedder is None else self.embedder.model

    def start(self) -> None:
        if self.embedder is not None:
            self.embedder.start()

    def shutdown(self) -> None:
        if self.embedder is not None:
            self.embedder.shutdown()

    def _require(self, task: str) -> AsyncEmbedder:
        if self.embedder is not None and self.embedder.model.task == task:
            return self.embedder
        name = self.model_name
        if task == "rerank":
            raise NotServed(
                f"the model {name!r} does not rerank; serve a cross-encoder (BertForSequenceClassification)"
            )
        if self.task == "rerank":
            raise NotServed(
                f"the model {name!r} is a reranker: it scores pairs (/v1/rerank), it does not embed"
            )
        raise NotServed(
            f"the model {name!r} is a generative model and this server does not embed with it; start the "
            "server with --pooling last (its final hidden states, last token) or serve an embedding model"
        )

    async def embed(
        self, inputs: object, truncate: bool, dimensions: object, param: str = "input"
    ) -> Embedded:
        """Check, tokenize and embed ``inputs`` (OpenAI's forms); raises InputError, NotServed, EmbedError."""
        embedder = self._require("embed")
        model = embedder.model
        t0 = time.perf_counter()
        dims = check_dimensions(model, dimensions)
        # tokenizing up to 2048 texts: off the event loop, which keeps serving the other requests meanwhile
        ids = await asyncio.to_thread(embedding_inputs, model, inputs, truncate, param)
        result = await embedder.run(ids, tokenize_s=time.perf_counter() - t0)
        self.metrics.observe("embed", len(ids), result.metrics)
        return Embedded(shorten(result.values, dims, model.normalized), result.metrics)

    async def rerank(self, query: object, documents: object, truncate: bool) -> Reranked:
        """Check, tokenize and score each (query, document) pair; raises InputError, NotServed, EmbedError."""
        embedder = self._require("rerank")
        t0 = time.perf_counter()
        texts, ids, types = await asyncio.to_thread(rerank_inputs, embedder.model, query, documents, truncate)
        result = await embedder.run(ids, types, tokenize_s=time.perf_counter() - t0)
        self.metrics.observe("rerank", len(ids), result.metrics)
        return Reranked(texts, [float(s) for s in result.values], result.metrics)


def serves_embeddings(app: FastAPI) -> bool:
    """Whether the app's model embeds (Ollama's /api/show ``embedding`` capability)."""
    service = getattr(app.state, "embeddings", None)
    return (
        isinstance(service, EmbeddingService) and service.model is not None and service.model.task == "embed"
    )
