"""What Ollama's clients ask about the served model: ``/api/tags``, ``/api/show``, ``/api/ps`` bodies and
the model's name as Ollama writes it (``name:tag``; ``name`` alone means ``name:latest``).

``/api/show``'s ``capabilities``: ``completion`` (a generative model); ``tools`` when the server reads
tool calls in the model's format (--enable-auto-tool-choice with a --tool-call-parser, what Ollama's
clients need: they send ``tools`` and let the model choose) and the chat template renders tools;
``thinking`` with --reasoning-parser. ``model_info`` holds the GGUF-style keys clients read
(``<arch>.context_length``: the served --max-model-len, ``general.architecture``, ...); ``template`` is
the model's chat template (Jinja, where Ollama's own are Go templates).
"""

from __future__ import annotations

import hashlib
from datetime import datetime, timezone
from typing import Any

from glassbox.server.errors import ApiError
from glassbox.server.state import ServerState

LATEST = ":latest"


def ollama_name(served: str) -> str:
    """The served model's name as Ollama lists it: with its tag, ``:latest`` when it has none."""
    return served if ":" in served.rsplit("/", 1)[-1] else served + LATEST


def resolve(state: ServerState, name: str | None, param: str = "model") -> str:
    """The served model's name for ``name`` (the served name, with or without ``:latest``); 404 in
    Ollama's words otherwise, 400 when no model is named."""
    if not name:
        raise ApiError(400, f"{param} is required", param, "missing_required_parameter")
    if name in (state.model_name, ollama_name(state.model_name)):
        return state.model_name
    raise ApiError(404, f"model {name!r} not found (this server serves {ollama_name(state.model_name)!r})")


def capabilities(state: ServerState, embeds: bool = False) -> list[str]:
    """What the served model does, as Ollama names it; ``embeds``: it also embeds (``--pooling``)."""
    settings = state.settings
    caps = ["completion", *(["embedding"] if embeds else [])]
    template = state.tokenizer.chat_template or ""
    if settings.enable_auto_tool_choice and settings.tool_call_parser is not None and "tools" in template:
        caps.append("tools")
    if settings.reasoning_parser is not None:
        caps.append("thinking")
    return caps


class ModelCard:
    """The served model's facts as Ollama reports them (computed once)."""

    def __init__(self, state: ServerState) -> None:
        llm = state.engine.engine
        facts, source = llm.facts, llm.source
        files = [source.path] if source.path.is_file() else sorted(source.path.glob("*.safetensors"))
        self.size = sum(f.stat().st_size for f in files if f.is_file())
        mtime = max((f.stat().st_mtime for f in files if f.is_file()), default=0.0)
        self.modified_at = _rfc3339(mtime)
        # an identifier of the checkpoint (its path, size and time), not a hash of its bytes
        key = f"{source.path}:{self.size}:{mtime}".encode()
        self.digest = hashlib.sha256(key).hexdigest()
        self.name = ollama_name(state.model_name)
        arch = facts.model_type or "unknown"
        formats = llm.executor.block_formats
        self.details = {
            "parent_model": "",
            "format": "gguf" if source.format == "gguf" else "safetensors",
            "family": arch,
            "families": [arch],
            "parameter_size": _count(facts.total_params),
            "quantization_level": "+".join(formats) if formats else facts.dtype.upper(),
        }
        prefix = arch + "."
        self.model_info: dict[str, Any] = {
            "general.architecture": arch,
            "general.basename": state.model_name,
            "general.parameter_count": facts.total_params,
            prefix + "context_length": state.max_model_len,
            prefix + "embedding_length": facts.hidden_size,
            prefix + "block_count": facts.num_layers,
            prefix + "feed_forward_length": facts.intermediate_size,
            prefix + "attention.head_count": facts.num_heads,
            prefix + "attention.head_count_kv": facts.num_kv_heads,
            prefix + "attention.key_length": facts.head_dim,
            prefix + "attention.value_length": facts.head_dim,
            prefix + "vocab_size": facts.vocab_size,
        }
        theta = facts.rope.get("rope_theta")
        if theta is not None:
            self.model_info[prefix + "rope.freq_base"] = theta
        if facts.sliding_window:
            self.model_info[prefix + "attention.sliding_window"] = facts.sliding_window
        if facts.num_experts:
            self.model_info[prefix + "expert_count"] = facts.num_experts
            self.model_info[prefix + "expert_used_count"] = facts.experts_per_token
        plan = llm.executor.kv_plan
        self.kv_bytes = plan.num_blocks * plan.bytes_per_block
        self.on_gpu = llm.executor.device.type == "cuda"
        self.source = str(source.path)

    def tag(self) -> dict[str, Any]:
        """An entry of /api/tags."""
        return {
            "name": self.name,
            "model": self.name,
            "modified_at": self.modified_at,
            "size": self.size,
            "digest": self.digest,
            "details": self.details,
        }

    def show(self, state: ServerState, embeds: bool = False) -> dict[str, Any]:
        """/api/show's body (``embeds``: the model embeds too)."""
        return {
            "modelfile": f"# served by glassbox\nFROM {self.source}\n",
            "parameters": "",
            "template": state.tokenizer.chat_template or "",
            "details": self.details,
            "model_info": self.model_info,
            "capabilities": capabilities(state, embeds),
            "modified_at": self.modified_at,
        }

    def running(self, state: ServerState) -> dict[str, Any]:
        """An entry of /api/ps: loaded for as long as the server runs (no keep_alive expiry)."""
        size = self.size + self.kv_bytes
        return {
            **self.tag(),
            "expires_at": "2318-08-18T00:00:00Z",  # never, as Ollama writes keep_alive -1
            "size": size,
            "size_vram": size if self.on_gpu else 0,
            "context_length": state.max_model_len,
        }


def _count(n: int) -> str:
    """A parameter count as Ollama writes it: 135M, 8.0B."""
    for unit, scale in (("T", 1e12), ("B", 1e9), ("M", 1e6), ("K", 1e3)):
        if n >= scale:
            value = n / scale
            return f"{value:.1f}{unit}" if value < 10 else f"{value:.0f}{unit}"
    return str(n)


def _rfc3339(timestamp: float) -> str:
    return datetime.fromtimestamp(timestamp, timezone.utc).isoformat().replace("+00:00", "Z")
