"""Models in Ollama's store, read from its documented layout (torch-free).

``<store>/manifests/<host>/<namespace>/<model>/<tag>`` is a JSON manifest (Docker's v2 schema) whose
``layers`` name blobs by digest; ``<store>/blobs/sha256-<hex>`` holds each. The layer of media type
``application/vnd.ollama.image.model`` is the GGUF file; template, system, params, license, adapter and
projector layers sit beside it. Ollama's newer safetensors-based models (``...image.tensor`` layers) have
no GGUF layer and are listed as not servable. Digests are checked (``sha256:<64 hex>``) before a blob's
path is built, so a manifest cannot point outside ``blobs/``.
"""

from __future__ import annotations

import json
import logging
import os
from pathlib import Path
from typing import Any

from glassbox.store.locations import ollama_stores
from glassbox.store.names import BadModelName, OllamaName, check_digest, parse_ollama_name
from glassbox.store.stored import OLLAMA, StoredModel

logger = logging.getLogger(__name__)

MEDIA_PREFIX = "application/vnd.ollama.image."
MODEL_LAYER = MEDIA_PREFIX + "model"
TENSOR_LAYER = MEDIA_PREFIX + "tensor"
MAX_MANIFEST_BYTES = 1 << 20  # a manifest is a few hundred bytes; a bigger file is not one


def scan(stores: list[Path] | None = None) -> list[StoredModel]:
    """Every model in the stores (a manifest that cannot be read is skipped and logged)."""
    found: list[StoredModel] = []
    for store in stores if stores is not None else ollama_stores():
        root = store / "manifests"
        if not root.is_dir():
            continue
        for host in _dirs(root):
            for namespace in _dirs(host):
                for model in _dirs(namespace):
                    for tag in sorted(p for p in model.iterdir() if p.is_file()):
                        name = parse_ollama_name(f"{host.name}/{namespace.name}/{model.name}:{tag.name}")
                        if name is None:
                            continue
                        try:
                            found.append(_read(store, name, tag))
                        except (OSError, ValueError) as e:
                            logger.warning("Ollama manifest %s: %s", tag, e)
    return found


def find(name: OllamaName, stores: list[Path] | None = None) -> StoredModel | None:
    """The model ``name`` names, or None when no store has its manifest (names match case-insensitively,
    as Ollama's do). ValueError when the manifest is there but cannot be read."""
    for store in stores if stores is not None else ollama_stores():
        manifest = _manifest_path(store / "manifests", name.parts())
        if manifest is not None:  # named as stored (the case of the store's folders)
            host, namespace, model, tag = manifest.relative_to(store / "manifests").parts
            stored = OllamaName(host, namespace, model, tag)
            return _read(store, stored, manifest)
    return None


def _dirs(path: Path) -> list[Path]:
    return sorted(p for p in path.iterdir() if p.is_dir() and not p.name.startswith("."))


def _manifest_path(root: Path, parts: tuple[str, ...]) -> Path | None:
    """``root/parts...`` matched one level at a time, exactly or else case-insensitively."""
    path = root
    for i, part in enumerate(parts):
        last = i == len(parts) - 1
        exact = path / part
        if exact.is_file() if last else exact.is_dir():
            path = exact
            continue
        try:
            entries = os.listdir(path)
        except OSError:
            return None
        match = next((e for e in sorted(entries) if e.lower() == part.lower()), None)
        if match is None:
            return None
        path = path / match
        if not (path.is_file() if last else path.is_dir()):
            return None
    return path


def _read(store: Path, name: OllamaName, manifest_path: Path) -> StoredModel:
    if manifest_path.stat().st_size > MAX_MANIFEST_BYTES:
        raise ValueError(f"{manifest_path} is too large for a manifest")
    manifest: dict[str, Any] = json.loads(manifest_path.read_text())
    layers = manifest.get("layers")
    if not isinstance(layers, list):
        raise ValueError(f"{manifest_path} has no layers list; is it an Ollama manifest?")
    blobs = store / "blobs"
    model: Path | None = None
    others: list[tuple[str, Path]] = []
    problems: list[str] = []
    notes: list[str] = []
    media_types = set()
    for layer in layers:
        media = str(layer.get("mediaType", ""))
        media_types.add(media.split(";")[0])
        try:
            blob = blobs / check_digest(str(layer.get("digest", "")))
        except BadModelName as e:
            raise ValueError(f"{manifest_path}: {e}") from None
        if not blob.is_file():
            problems.append(f"blob {blob.name} ({media}) is missing")
            continue
        size = layer.get("size")
        if isinstance(size, int) and blob.stat().st_size != size:
            problems.append(f"blob {blob.name} holds {blob.stat().st_size} bytes, the manifest says {size}")
        if media == MODEL_LAYER:
            model = blob
        else:
            others.append((media, blob))
    kinds = {m.removeprefix(MEDIA_PREFIX) for m, _ in others}
    if "adapter" in kinds:
        problems.append("it applies a LoRA adapter layer, which glassbox does not apply")
    if "projector" in kinds:
        notes.append("its vision projector is not used: text only")
    if model is None and not problems:
        if TENSOR_LAYER in media_types:
            problems.append(
                "its weights are safetensors tensor layers (Ollama's own engine), not a GGUF layer"
            )
        else:
            problems.append(f"its manifest has no {MODEL_LAYER} layer")
    digest = _config_digest(manifest)
    files = (model,) if model is not None else ()
    return StoredModel(
        name.short(),
        OLLAMA,
        "gguf" if model is not None or TENSOR_LAYER not in media_types else "ollama-tensors",
        model if model is not None else manifest_path,
        files,
        digest,
        tuple(others),
        "; ".join(problems) or None,
        tuple(notes),
    )


def _config_digest(manifest: dict[str, Any]) -> str:
    config = manifest.get("config")
    return str(config.get("digest", "")) if isinstance(config, dict) else ""


def layer_text(model: StoredModel, kind: str, limit: int = 1 << 20) -> str | None:
    """The text of one of an Ollama model's small layers ("template", "params", "system"), or None."""
    for media, blob in model.layers:
        if media.split(";")[0] == MEDIA_PREFIX + kind and blob.stat().st_size <= limit:
            return blob.read_text(errors="replace")
    return None
