"""Models in the Hugging Face hub cache, read with ``huggingface_hub``'s own cache scanner (torch-free).

``scan_cache_dir`` lists each repo's revisions and the files of each snapshot; nothing here guesses a file
name. A repo's revision is the one its ``main`` ref names, else the newest. A snapshot with config.json
and safetensors is a Hugging Face model directory (named by its repo id); each GGUF checkpoint in it (a
split one by its first shard; multimodal projectors left out) is a model named ``repo:QUANT``, QUANT
being the quantization tag its file name carries (``Q4_K_M``; store/gguf_files.py).
"""

from __future__ import annotations

import logging
from pathlib import Path

from huggingface_hub import CachedRepoInfo, CachedRevisionInfo, scan_cache_dir
from huggingface_hub.errors import CacheNotFound

from glassbox.models.config_reader import CONFIG_FILE
from glassbox.store.gguf_files import GGUFCheckpoint, checkpoints, pick
from glassbox.store.locations import hf_hub_cache
from glassbox.store.names import HubName
from glassbox.store.stored import HF_CACHE, StoredModel

logger = logging.getLogger(__name__)

WEIGHT_SUFFIXES = (".safetensors",)


def scan(cache: Path | None = None) -> list[StoredModel]:
    """Every model in the cache (an absent cache holds none; a corrupted repo is skipped and logged)."""
    root = cache or hf_hub_cache()
    try:
        info = scan_cache_dir(root)
    except CacheNotFound:
        return []
    for warning in info.warnings:
        logger.warning("Hugging Face cache %s: %s", root, warning)
    found: list[StoredModel] = []
    for repo in sorted(info.repos, key=lambda r: r.repo_id):
        if repo.repo_type != "model":
            continue
        revision = _revision(repo)
        if revision is not None:
            found += _models(repo.repo_id, revision)
    return found


def find(name: HubName, cache: Path | None = None) -> StoredModel | None:
    """The model ``name`` names in the cache, or None when the repo is not there.

    FileNotFoundError, listing what the repo holds, when the repo is there but ``:QUANT`` picks no file
    (or picks two), or no quantization is named and the repo holds several GGUF checkpoints."""
    root = cache or hf_hub_cache()
    try:
        info = scan_cache_dir(root)
    except CacheNotFound:
        return None
    repo = next((r for r in info.repos if r.repo_type == "model" and r.repo_id == name.repo_id), None)
    if repo is None:  # repo ids are case-insensitive on the Hub; the cache keeps the spelling pulled
        lower = name.repo_id.lower()
        repo = next((r for r in info.repos if r.repo_type == "model" and r.repo_id.lower() == lower), None)
    revision = _revision(repo) if repo is not None else None
    if repo is None or revision is None:
        return None
    models = _models(repo.repo_id, revision)
    dirs = [m for m in models if m.format == "hf"]
    if name.quant is None and dirs:
        return dirs[0]
    by_first = {m.files[0]: m for m in models if m.format == "gguf"}
    snapshot = revision.snapshot_path
    found = [
        GGUFCheckpoint(_tag(m), (m.files[0].relative_to(snapshot).as_posix(),)) for m in by_first.values()
    ]
    where = f"in the Hugging Face cache ({root})"
    try:
        chosen = pick(found, name.quant, repo.repo_id, where)
    except FileNotFoundError as e:
        raise FileNotFoundError(
            f"{e} (`glassbox pull {name}` downloads it)" if name.quant else str(e)
        ) from None
    return by_first[snapshot / chosen.files[0]]


def _revision(repo: CachedRepoInfo) -> CachedRevisionInfo | None:
    by_ref = repo.refs
    if "main" in by_ref:
        return by_ref["main"]
    return max(repo.revisions, key=lambda r: r.last_modified, default=None)


def _models(repo_id: str, revision: CachedRevisionInfo) -> list[StoredModel]:
    snapshot = revision.snapshot_path
    files = sorted(f.file_path for f in revision.files)
    rel = {f: f.relative_to(snapshot).as_posix() for f in files}
    found: list[StoredModel] = []
    top = {r for r in rel.values() if "/" not in r}
    if CONFIG_FILE in top and any(r.endswith(WEIGHT_SUFFIXES) for r in top):
        hf_files = tuple(f for f in files if "/" not in rel[f] and not rel[f].lower().endswith(".gguf"))
        found.append(StoredModel(repo_id, HF_CACHE, "hf", snapshot, hf_files, revision.commit_hash))
    for checkpoint in checkpoints(list(rel.values())):
        shards = tuple(snapshot / f for f in checkpoint.files)
        found.append(
            StoredModel(
                f"{repo_id}:{checkpoint.tag}", HF_CACHE, "gguf", shards[0], shards, revision.commit_hash
            )
        )
    return found


def _tag(model: StoredModel) -> str:
    return model.name.split(":", 1)[1]
