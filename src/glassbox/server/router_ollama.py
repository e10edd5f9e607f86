"""Ollama's model listing for the multi-model server: /api/tags (every model served), /api/ps (the loaded
ones, with what they hold and when they unload) and /api/show of a model not loaded, from its stored facts
(store/describe.py) so that a client listing models does not load them all (torch-free).

The bodies follow server/ollama_models.py's (a loaded model's /api/show is its own process's answer);
that module reads a running engine, this one the checkpoint.
"""

from __future__ import annotations

import hashlib
import time
from datetime import datetime, timezone
from typing import Any

from glassbox.store.describe import ModelInfo

LATEST = ":latest"


def ollama_name(name: str) -> str:
    """A served name as Ollama lists it: with its tag, ``:latest`` when it has none."""
    return name if ":" in name.rsplit("/", 1)[-1] else name + LATEST


def parameter_size(n: int) -> str:
    """A parameter count as Ollama writes it: 135M, 8.0B."""
    for unit, scale in (("T", 1e12), ("B", 1e9), ("M", 1e6), ("K", 1e3)):
        if n >= scale:
            value = n / scale
            return f"{value:.1f}{unit}" if value < 10 else f"{value:.0f}{unit}"
    return str(n)


def rfc3339(timestamp: float) -> str:
    return datetime.fromtimestamp(timestamp, timezone.utc).isoformat().replace("+00:00", "Z")


def details(info: ModelInfo) -> dict[str, Any]:
    family = info.facts.model_type if info.facts is not None else info.architecture
    return {
        "parent_model": "",
        "format": "gguf" if info.model.format == "gguf" else "safetensors",
        "family": family,
        "families": [family],
        "parameter_size": parameter_size(info.parameters),
        "quantization_level": info.quantization,
    }


def tag(name: str, info: ModelInfo) -> dict[str, Any]:
    """An entry of /api/tags."""
    files = [f for f in info.model.files if f.is_file()]
    mtime = max((f.stat().st_mtime for f in files), default=0.0)
    size = info.model.size
    # an identifier of the checkpoint (its path, size and time), not a hash of its bytes (as ollama_models)
    digest = hashlib.sha256(f"{info.model.path}:{size}:{mtime}".encode()).hexdigest()
    name = ollama_name(name)
    return {"name": name, "model": name, "modified_at": rfc3339(mtime), "size": size, "digest": digest,
            "details": details(info)}  # fmt: skip


def running(
    name: str, info: ModelInfo, held: float, expires_in_s: float | None, context: int
) -> dict[str, Any]:
    """An entry of /api/ps: what the model holds, and when it unloads (never without --idle-unload-seconds)."""
    expires = "2318-08-18T00:00:00Z" if expires_in_s is None else rfc3339(time.time() + expires_in_s)
    return {
        **tag(name, info),
        "size": int(held),
        "size_vram": 0,
        "expires_at": expires,
        "context_length": context,
    }


def show(info: ModelInfo, context: int) -> dict[str, Any]:
    """/api/show of a model not loaded."""
    facts = info.facts
    arch = facts.model_type if facts is not None else info.architecture
    model_info: dict[str, Any] = {"general.architecture": arch, "general.parameter_count": info.parameters,
                                  f"{arch}.context_length": context}  # fmt: skip
    if facts is not None:
        model_info |= {
            f"{arch}.embedding_length": facts.hidden_size,
            f"{arch}.block_count": facts.num_layers,
            f"{arch}.attention.head_count": facts.num_heads,
            f"{arch}.attention.head_count_kv": facts.num_kv_heads,
            f"{arch}.vocab_size": facts.vocab_size,
        }
    return {
        "modelfile": f"# served by glassbox\nFROM {info.model.path}\n",
        "parameters": "",
        "template": info.chat_template or "",
        "details": details(info),
        "model_info": model_info,
        "capabilities": info.capabilities(),
        "modified_at": tag(info.model.name, info)["modified_at"],
    }
