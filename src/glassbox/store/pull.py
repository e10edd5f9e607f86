"""`glassbox pull REPO[:QUANT]`: a model from the Hugging Face Hub into the HF cache (torch-free).

``huggingface_hub`` does the transfer (``hf_hub_download``: resumable ``.incomplete`` files, progress bars,
``HF_TOKEN``, ``HF_ENDPOINT``, the cache's own layout, so every other tool finds the files). Only the files
needed are fetched: one GGUF checkpoint (its shards) for ``:QUANT``, else config, safetensors and
tokenizer files. The Hub's checksums are then verified here: an LFS file's sha256 and a small file's git
blob id, from the repo's file list (``model_info(files_metadata=True)``); a file that does not match is
removed from the cache and the pull fails, naming it.
"""

from __future__ import annotations

import hashlib
import logging
import os
import re
from dataclasses import dataclass
from pathlib import Path

from huggingface_hub import HfApi, hf_hub_download
from huggingface_hub.errors import (
    GatedRepoError,
    HfHubHTTPError,
    LocalEntryNotFoundError,
    OfflineModeIsEnabled,
    RemoteEntryNotFoundError,
    RepositoryNotFoundError,
    RevisionNotFoundError,
)
from huggingface_hub.hf_api import RepoSibling

from glassbox.models.config_reader import CONFIG_FILE
from glassbox.store.gguf_files import checkpoints, pick
from glassbox.store.locations import hf_hub_cache
from glassbox.store.names import parse_hub_name

logger = logging.getLogger(__name__)

DEFAULT_ENDPOINT = "https://huggingface.co"
# a Hugging Face model directory's files the engine reads (config, weights, tokenizer, chat template, and
# a sentence-transformers pipeline's modules); not .bin/.pt/.onnx/.gguf or other formats' copies
HF_FILES = re.compile(
    r"(config\.json|generation_config\.json|hf_quant_config\.json|[^/]+\.safetensors|[^/]+\.safetensors\.index\.json"
    r"|tokenizer\.json|tokenizer_config\.json|special_tokens_map\.json|added_tokens\.json|tokenizer\.model"
    r"|chat_template\.jinja|chat_template\.json|vocab\.json|vocab\.txt|merges\.txt|modules\.json"
    r"|sentence_bert_config\.json|config_sentence_transformers\.json|\d+_[A-Za-z]+/[^/]+\.(json|safetensors))"
)


@dataclass(frozen=True)
class Pulled:
    """What a pull left in the cache."""

    name: str  # the name to serve it by (``org/repo`` or ``org/repo:TAG``)
    revision: str  # the commit pulled
    files: tuple[Path, ...]  # the snapshot's paths
    size: int


def endpoint() -> str:
    return (os.environ.get("HF_ENDPOINT") or DEFAULT_ENDPOINT).rstrip("/")


def pull(name: str, revision: str | None = None) -> Pulled:
    """Download the files ``name`` needs (see the module docstring); ValueError or FileNotFoundError
    naming the cause (not found, gated, offline, a checksum that does not match)."""
    hub = parse_hub_name(name)
    if hub is None:
        raise ValueError(f"REPO must be a Hugging Face repo id, ORG/NAME or ORG/NAME:QUANT, got {name!r}")
    url = endpoint()
    siblings, commit = _files(hub.repo_id, revision, url)
    paths = list(siblings)
    if hub.quant is None and CONFIG_FILE in paths and any(p.endswith(".safetensors") for p in paths):
        wanted = [p for p in paths if HF_FILES.fullmatch(p)]
        served = hub.repo_id
    else:
        checkpoint = pick(checkpoints(paths), hub.quant, hub.repo_id, f"on {url}")
        wanted, served = list(checkpoint.files), f"{hub.repo_id}:{checkpoint.tag}"
    cache = hf_hub_cache()
    got = []
    for path in wanted:
        try:
            # by the ref asked for (not the commit), so that the cache records refs/<ref> for other tools
            local = Path(hf_hub_download(hub.repo_id, path, revision=revision, cache_dir=cache, endpoint=url))
        except (RemoteEntryNotFoundError, LocalEntryNotFoundError) as e:
            raise FileNotFoundError(f"{path} of {hub.repo_id} could not be fetched from {url}: {e}") from None
        except HfHubHTTPError as e:
            raise ValueError(f"{path} of {hub.repo_id}: {url} answered {e}") from None
        _verify(local, siblings[path])
        got.append(local)
    size = sum(p.resolve().stat().st_size for p in got)
    return Pulled(served, commit, tuple(got), size)


def _files(repo_id: str, revision: str | None, url: str) -> tuple[dict[str, RepoSibling], str]:
    """The repo's files (with sizes and hashes) at ``revision``, and its commit hash."""
    try:
        info = HfApi(endpoint=url).model_info(repo_id, revision=revision, files_metadata=True)
    except GatedRepoError:
        raise ValueError(f"{repo_id} is gated: accept its terms on the Hub, then set HF_TOKEN") from None
    except RepositoryNotFoundError:
        raise FileNotFoundError(
            f"{repo_id} was not found on {url} (a private repo needs HF_TOKEN with access to it)"
        ) from None
    except RevisionNotFoundError:
        raise FileNotFoundError(f"{repo_id} has no revision {revision!r} on {url}") from None
    except OfflineModeIsEnabled:
        raise ValueError(f"cannot pull {repo_id}: HF_HUB_OFFLINE is set (offline mode)") from None
    except HfHubHTTPError as e:
        raise ValueError(f"{url} answered {e}") from None
    except Exception as e:  # the transport's own errors (connection refused, DNS, TLS, timeout)
        raise ValueError(
            f"cannot reach {url} to pull {repo_id}: {type(e).__name__}: {e} (offline? HF_ENDPOINT names the hub)"
        ) from None
    if info.sha is None or info.siblings is None:
        raise ValueError(f"{url} did not list {repo_id}'s files and commit")
    return {s.rfilename: s for s in info.siblings}, info.sha


def _verify(local: Path, sibling: RepoSibling) -> None:
    """The downloaded file against the Hub's hash; a file that differs is removed from the cache."""
    blob = local.resolve()
    if sibling.lfs is not None:
        kind, expected, got = "sha256", sibling.lfs.sha256, _sha256(blob)
    elif sibling.blob_id is not None:
        kind, expected, got = "git blob id", sibling.blob_id, _git_blob_id(blob)
    else:
        logger.warning("the hub lists no hash for %s: not verified", sibling.rfilename)
        return
    if got != expected:
        for p in (blob, local):
            p.unlink(missing_ok=True)
        raise ValueError(
            f"checksum mismatch for {sibling.rfilename}: the hub lists {kind} {expected}, the download has "
            f"{got}; the file was removed from the cache (pull again; if it repeats, the mirror is corrupt)"
        )


def _sha256(path: Path) -> str:
    h = hashlib.sha256()
    with path.open("rb") as f:
        for chunk in iter(lambda: f.read(1 << 22), b""):
            h.update(chunk)
    return h.hexdigest()


def _git_blob_id(path: Path) -> str:
    """git's object id of a file: sha1 of "blob <size>\\0" and its bytes."""
    h = hashlib.sha1(b"blob %d\0" % path.stat().st_size)
    with path.open("rb") as f:
        for chunk in iter(lambda: f.read(1 << 22), b""):
            h.update(chunk)
    return h.hexdigest()
