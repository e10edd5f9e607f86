"""Test helper: a Hugging Face hub cache and an Ollama store laid out on disk as their owners write them.

The HF cache as huggingface_hub documents it (its "manage the cache" guide): ``models--ORG--NAME/`` with
``blobs/`` named by the file's hash (sha256 for LFS files, the git blob sha1 for the others), ``refs/main``
holding the commit hash, ``snapshots/COMMIT/FILE`` a relative symlink to its blob. Ollama's store as Ollama
writes it: ``blobs/sha256-HEX`` and ``manifests/registry.ollama.ai/library/NAME/TAG``, a Docker v2 manifest
whose config layer and model/template/params/license layers name blobs by ``sha256:HEX`` digest.
No tests here.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
from pathlib import Path

LFS_SUFFIXES = (".safetensors", ".gguf", ".bin")


def git_blob_sha1(data: bytes) -> str:
    """The git object id of a file's bytes (what the Hub reports for a non-LFS file)."""
    return hashlib.sha1(b"blob %d\0" % len(data) + data).hexdigest()


def sha256_file(path: Path) -> str:
    h = hashlib.sha256()
    with path.open("rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            h.update(chunk)
    return h.hexdigest()


def _place(src: Path, dst: Path) -> None:
    """A real file at ``dst`` with ``src``'s bytes (a hard link where the file system allows)."""
    dst.parent.mkdir(parents=True, exist_ok=True)
    if dst.exists():
        return
    try:
        os.link(src, dst)
    except OSError:
        shutil.copyfile(src, dst)


def add_hf_repo(cache: Path, repo_id: str, files: dict[str, Path], commit: str | None = None) -> Path:
    """Lay ``files`` (repo path -> a file with its bytes) out as the cache holds a model repo at ``main``;
    returns the snapshot directory."""
    commit = commit or hashlib.sha1(repo_id.encode()).hexdigest()
    repo = cache / ("models--" + repo_id.replace("/", "--"))
    snapshot = repo / "snapshots" / commit
    for name, src in files.items():
        lfs = name.endswith(LFS_SUFFIXES)
        blob_id = sha256_file(src) if lfs else git_blob_sha1(src.read_bytes())
        blob = repo / "blobs" / blob_id
        _place(src, blob)
        link = snapshot / name
        link.parent.mkdir(parents=True, exist_ok=True)
        if not link.is_symlink():
            link.symlink_to(os.path.relpath(blob, link.parent))
    (repo / "refs").mkdir(parents=True, exist_ok=True)
    (repo / "refs" / "main").write_text(commit)
    return snapshot


def _blob(store: Path, data: bytes | None = None, src: Path | None = None) -> dict[str, object]:
    """Put bytes (or a file) in the store's blobs/ under its digest; the layer's digest and size."""
    if src is not None:
        digest = sha256_file(src)
        _place(src, store / "blobs" / f"sha256-{digest}")
        size = src.stat().st_size
    else:
        assert data is not None
        digest = hashlib.sha256(data).hexdigest()
        path = store / "blobs" / f"sha256-{digest}"
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(data)
        size = len(data)
    return {"digest": f"sha256:{digest}", "size": size}


def add_ollama_model(
    store: Path,
    model: str,
    tag: str,
    gguf: Path | None,
    template: str = "{{ .Prompt }}",
    params: dict[str, object] | None = None,
    extra_layers: tuple[tuple[str, bytes], ...] = (),
    namespace: str = "library",
    host: str = "registry.ollama.ai",
) -> Path:
    """A model as ``ollama pull`` leaves it: the GGUF as the model layer, a template, params and license
    layer, the config blob, and the manifest; returns the manifest's path."""
    layers: list[dict[str, object]] = []
    if gguf is not None:
        layers.append({"mediaType": "application/vnd.ollama.image.model", **_blob(store, src=gguf)})
    for media, data in [
        ("template", template.encode()),
        ("params", json.dumps(params or {"stop": ["<|im_end|>"]}).encode()),
        ("license", b"Apache License 2.0\n"),
        *extra_layers,
    ]:
        layers.append({"mediaType": f"application/vnd.ollama.image.{media}", **_blob(store, data)})
    diff_ids = [layer["digest"] for layer in layers]
    config = {
        "model_format": "gguf",
        "model_family": "llama",
        "model_families": ["llama"],
        "model_type": "135M",
        "file_type": "Q4_1",
        "architecture": "amd64",
        "os": "linux",
        "rootfs": {"type": "layers", "diff_ids": diff_ids},
    }
    manifest = {
        "schemaVersion": 2,
        "mediaType": "application/vnd.docker.distribution.manifest.v2+json",
        "config": {
            "mediaType": "application/vnd.docker.container.image.v1+json",
            **_blob(store, json.dumps(config).encode()),
        },
        "layers": layers,
    }
    path = store / "manifests" / host / namespace / model / tag
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(manifest))
    return path
