"""Every model glassbox can find, and one found by a command-line name (a path allowed) (torch-free)."""

from __future__ import annotations

from pathlib import Path

from glassbox.models.gguf_reader import gguf_shard_paths
from glassbox.models.sources import (
    DEFAULT_NAME,
    DEMO_MODEL_DIR,
    DEMO_NAME,
    ModelSource,
    default_gguf,
    resolve_model,
)
from glassbox.store import hf_cache, ollama_store
from glassbox.store.lookup import find_model, where_looked
from glassbox.store.stored import DEMO, PACKAGE, PATH, StoredModel


def all_models() -> list[StoredModel]:
    """The bundled demo, the default model's package when installed, then the HF cache's and Ollama's."""
    found = [from_source(ModelSource(DEMO_MODEL_DIR, "hf", DEMO_NAME), DEMO)]
    package = default_gguf()
    if package is not None:
        found.append(from_source(ModelSource(package, "gguf", DEFAULT_NAME), PACKAGE))
    return found + hf_cache.scan() + ollama_store.scan()


def stored_model(name: str) -> StoredModel:
    """The model a command-line ``name`` names: a path (as ``glassbox serve`` takes it), the demo, or a
    stored model's name. FileNotFoundError saying where it was looked for."""
    path = Path(name).expanduser()
    if name == DEMO_NAME and not path.exists():
        return from_source(ModelSource(DEMO_MODEL_DIR, "hf", DEMO_NAME), DEMO)
    if path.exists():
        return from_source(resolve_model(name), PATH)
    found = find_model(name)
    if found is None:
        raise FileNotFoundError(f"{name!r} is neither a path nor a model in {where_looked()}")
    return found


def from_source(source: ModelSource, kind: str) -> StoredModel:
    """A model the engine would open from ``source`` (a directory or a GGUF file), as a StoredModel."""
    if source.format == "gguf":
        files = tuple(gguf_shard_paths(source.path))
    else:
        files = tuple(sorted(p for p in source.path.iterdir() if p.is_file()))
    return StoredModel(source.name, kind, source.format, source.path, files)
