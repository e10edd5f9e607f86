"""What every route handler shares: the async engine, the server's settings, its metrics and flags."""

from __future__ import annotations

import dataclasses
import hashlib
import json
import time
import uuid
from dataclasses import dataclass, field
from typing import Any

from glassbox import __version__
from glassbox.config import EngineConfig
from glassbox.engine.async_engine import AsyncEngine
from glassbox.server.errors import ApiError, shown
from glassbox.server.logprobs import LogprobFormatter
from glassbox.server.metrics import ServerMetrics
from glassbox.tokenizer.request_text import max_text_chars


@dataclass
class ServerSettings:
    """Server flags: ``api_key`` guards /v1 and /(de)tokenize; ``max_queue_len`` bounds the sequences
    waiting beyond max-num-seqs (more get 429); ``drain_timeout_s`` is how long SIGTERM lets requests in
    flight finish before aborting them; ``allowed_origins`` turns CORS on for those browser origins ("*":
    any), with ``allowed_methods`` and ``allowed_headers``; ``tool_call_parser`` reads tool calls in the
    model's own format (``tool_choice: "auto"``, allowed only with ``enable_auto_tool_choice``);
    ``reasoning_parser`` splits the reasoning from the answer; ``special_tokens_in_user_text`` tokenizes
    special-token strings in requests' text as the tokens (else as text); ``max_request_bytes`` bounds a
    request body (larger: 413)."""

    api_key: str | None = None
    max_queue_len: int | None = None
    drain_timeout_s: float = 5.0
    allowed_origins: list[str] = field(default_factory=list)
    allowed_methods: list[str] = field(default_factory=lambda: ["*"])
    allowed_headers: list[str] = field(default_factory=lambda: ["*"])
    # tool calling and reasoning (server/tools.py, tool_parsers.py, reasoning.py): vLLM's flags and names
    enable_auto_tool_choice: bool = False
    tool_call_parser: str | None = None
    reasoning_parser: str | None = None
    # hostile input (server/request_limits.py, server/chat_prompt.py)
    special_tokens_in_user_text: bool = False
    max_request_bytes: int = 16 << 20


def system_fingerprint(model: str, device: str, config: EngineConfig, version: str = __version__) -> str:
    """OpenAI's ``system_fingerprint``: the same for the same glassbox version, model, device and engine
    settings (any of which might change a sampled token), different when any of them changes."""
    facts = {"glassbox": version, "model": model, "device": device, "config": dataclasses.asdict(config)}
    digest = hashlib.sha256(json.dumps(facts, sort_keys=True, default=str).encode()).hexdigest()
    return f"fp_{digest[:12]}"


class ServerState:
    """The app's shared state (one per app; event-loop thread only, except the engine it wraps)."""

    def __init__(self, engine: AsyncEngine, settings: ServerSettings, metrics: ServerMetrics) -> None:
        self.engine = engine
        self.settings = settings
        self.metrics = metrics
        llm = engine.engine
        self.tokenizer = llm.tokenizer
        self.model_name = llm.model_name
        self.max_model_len = llm.max_model_len
        self.max_num_seqs = llm.config.max_num_seqs
        self.vocab_size = llm.facts.vocab_size
        self.kv_capacity_tokens = llm.kv_capacity_tokens
        # no text longer than this fits in max_model_len tokens: refused before it is tokenized
        self.max_prompt_chars = max_text_chars(self.tokenizer, self.max_model_len)
        self.logprobs = LogprobFormatter(self.tokenizer)
        self.grammars = llm.grammars  # structured outputs: compiled (and cached) for the engine too
        self.fingerprint = system_fingerprint(llm.source.describe(), str(llm.executor.device), llm.config)
        self.created = int(time.time())
        self.draining = False
        self.tracer: Any = (
            None  # server/tracing.RequestTracer with --otlp-traces-endpoint (no import: a cycle)
        )

    def check_model(self, model: str | None) -> None:
        """404 (OpenAI's ``invalid_request_error``, code ``model_not_found``) unless ``model`` is None or the
        served model's name."""
        if model is not None and model != self.model_name:
            raise ApiError(
                404,
                f"the model {shown(model)} does not exist; this server serves {self.model_name!r}",
                "model",
                "model_not_found",
            )

    @staticmethod
    def new_id(prefix: str) -> str:
        return f"{prefix}-{uuid.uuid4().hex}"
