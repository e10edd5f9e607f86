"""Models in the Hugging Face hub cache, read with ``huggingface_hub``'s own cache scanner (torch-free).

``scan_cache_dir`` lists each repo's revisions and the files of each snapshot; nothing here guesses a file
name. A repo's revision is the one its ``main`` ref names, else the newest. A snapshot with config.json
and safetensors is a Hugging Face model directory (named by its repo id); each GGUF checkpoint in it (a
split one by its first shard; multimodal projectors left out) is a model named ``repo:QUANT``, QUANT
being the quantization tag its file name carries (``Q4_K_M``), matched case-insensitively between
separators as Ollama and llama.cpp match ``:QUANT``.
"""

from __future__ import annotations

import logging
import re
from pathlib import Path

from huggingface_hub import CachedRepoInfo, CachedRevisionInfo, scan_cache_dir
from huggingface_hub.errors import CacheNotFound

from glassbox.models.config_reader import CONFIG_FILE
from glassbox.store.locations import hf_hub_cache
from glassbox.store.names import HubName
from glassbox.store.stored import HF_CACHE, StoredModel

logger = logging.getLogger(__name__)

# a split GGUF's shard suffix (llama.cpp's gguf-split names)
_SHARD = re.compile(r"-(\d{5})-of-(\d{5})$")
# the quantization tags GGUF file names carry: Q4_K_M, Q8_0, IQ4_XS, UD-Q4_K_XL, F16, BF16, MXFP4
_QUANT_TAG = re.compile(
    r"(?<![A-Za-z0-9])((?:UD-)?I?Q[1-8](?:_[A-Za-z0-9]+)*|B?F16|F32|MXFP4(?:_MOE)?)(?![A-Za-z0-9])", re.I
)
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
    ggufs = [m for m in models if m.format == "gguf"]
    if name.quant is None:
        dirs = [m for m in models if m.format == "hf"]
        if dirs:
            return dirs[0]
        if len(ggufs) == 1:
            return ggufs[0]
        if not ggufs:
            raise FileNotFoundError(
                f"{name.repo_id} is in the Hugging Face cache ({root}) but holds neither config.json with "
                "safetensors nor a GGUF file"
            )
        raise FileNotFoundError(
            f"{name.repo_id} holds {len(ggufs)} GGUF files: name one as {name.repo_id}:QUANT, one of "
            + ", ".join(_tag(m) for m in ggufs)
        )
    picked = [m for m in ggufs if _matches(m, name.quant)]
    if len(picked) == 1:
        return picked[0]
    held = ", ".join(_tag(m) for m in ggufs) or "no GGUF files"
    if not picked:
        raise FileNotFoundError(
            f"{name.repo_id} in the Hugging Face cache ({root}) has no GGUF file for {name.quant!r}; it holds: "
            f"{held} (`glassbox pull {name}` downloads it)"
        )
    raise FileNotFoundError(
        f"{name.quant!r} matches several GGUF files of {name.repo_id}: "
        + ", ".join(str(m.path.name) for m in picked)
    )


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
    groups: dict[str, list[Path]] = {}
    for f in files:
        path = rel[f]
        if not path.lower().endswith(".gguf") or Path(path).name.lower().startswith("mmproj"):
            continue
        stem = path[: -len(".gguf")]
        groups.setdefault(_SHARD.sub("", stem), []).append(f)
    for stem, shards in sorted(groups.items()):
        shards.sort()
        label = _quant_label(stem)
        found.append(
            StoredModel(
                f"{repo_id}:{label}", HF_CACHE, "gguf", shards[0], tuple(shards), revision.commit_hash
            )
        )
    return found


def _quant_label(stem: str) -> str:
    """The quantization tag a GGUF file's name carries (its last one), else its file name's stem."""
    tags = _QUANT_TAG.findall(Path(stem).name)
    return tags[-1] if tags else Path(stem).name


def _tag(model: StoredModel) -> str:
    return model.name.split(":", 1)[1]


def _matches(model: StoredModel, quant: str) -> bool:
    """Whether ``quant`` names this GGUF checkpoint: its tag, or a part of its file (or folder) name ended
    by '.', '-' or '/' (not '_', which continues a tag: Q4 is not Q4_1)."""
    q = quant.lower()
    if _tag(model).lower() == q:
        return True
    path = f"{model.path.parent.name}/{model.path.name}".lower()  # a quant's folder, or the commit hash
    return re.search(r"(^|[-._/])" + re.escape(q) + r"([-./]|$)", path) is not None  # '_' is inside tags
