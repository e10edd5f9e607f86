"""`glassbox list`'s rows of GGUF models, kept between runs (torch-free).

The ``gguf`` package parses a file's whole metadata, vocabulary included, to answer a few scalar keys:
SmolLM2-135M's 49K tokens and 48K merges took 17 s on a shared 2-core machine (load average ~7). A GGUF row is therefore kept in ``$GLASSBOX_CACHE_DIR/models-list.json`` (default
``~/.cache/glassbox``, where the hardware probe keeps its figures) keyed by the file's identity (device,
inode, size, modification time: a hard link shares it, a rewritten file does not) and glassbox's version;
a Hugging Face directory is read each time (its config.json is quick).
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
from pathlib import Path
from typing import Any

from glassbox import __version__
from glassbox.perf.probe import cache_dir
from glassbox.store.describe import describe
from glassbox.store.stored import StoredModel

logger = logging.getLogger(__name__)

CACHE_FILE = "models-list.json"


def rows(models: list[StoredModel]) -> list[dict[str, Any]]:
    """Each model's `list` row, from the cache where its file has not changed."""
    path = cache_dir() / CACHE_FILE
    cache = _load(path)
    kept: dict[str, Any] = {}
    out = []
    for model in models:
        key = _key(model)
        row = cache.get(key) if key is not None else None
        if row is None:
            row = describe(model).row()
        row = {**row, **_store_fields(model)}
        if key is not None:
            kept[key] = row
        out.append(row)
    if kept.keys() - cache.keys() or len(kept) != len(cache):
        _save(path, kept)
    return out


def _store_fields(model: StoredModel) -> dict[str, Any]:
    """The row's fields that come from the store (name, source, path), not from the file."""
    return {"name": model.name, "source": model.source, "path": str(model.path), "revision": model.revision,
            "notes": list(model.notes)}  # fmt: skip


def _key(model: StoredModel) -> str | None:
    if model.format != "gguf" or model.problem is not None or not model.files:
        return None
    try:
        ids = [os.stat(f) for f in model.files]
    except OSError:
        return None
    parts = [f"{s.st_dev}:{s.st_ino}:{s.st_size}:{s.st_mtime_ns}" for s in ids]
    return f"{__version__}|" + "|".join(parts)


def _load(path: Path) -> dict[str, Any]:
    try:
        data = json.loads(path.read_text())
    except (OSError, ValueError):
        return {}
    return data if isinstance(data, dict) else {}


def _save(path: Path, rows: dict[str, Any]) -> None:
    tmp = path.with_suffix(f".{os.getpid()}.tmp")
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp.write_text(json.dumps(rows))
        os.replace(tmp, path)
    except OSError as e:  # a read-only home: list still works, just slower next time
        logger.info("could not keep the model list in %s: %s", path, e)
        with contextlib.suppress(OSError):
            tmp.unlink()
