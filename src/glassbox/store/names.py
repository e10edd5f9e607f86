"""Model names as users write them, and the check that keeps a name a name (torch-free, no file access).

Three forms name a model: a Hugging Face repo id (``Qwen/Qwen2.5-1.5B-Instruct``; a GGUF repo with
``:Q4_K_M`` picking the file; ``hf.co/`` in front as Ollama spells it), an Ollama name
(``qwen2.5:1.5b``, ``library/qwen2.5``, ``registry.ollama.ai/library/qwen2.5:latest``, ``user/model:tag``)
and, on the command line only, a path. A name that comes over HTTP is checked by :func:`check_name` first:
``../``, absolute paths, ``~``, backslashes, URL schemes and digest strings are refused (Ollama's digest
path traversal in /api/pull and MLX's relative model paths are the anchors' CVEs), so a request can name a
model the operator listed and nothing else.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

MAX_NAME_LEN = 256
# one part of a name: letters, digits, '_', '-', '.'; never starting with '.' (no '.', '..', dot files)
_PART = re.compile(r"[A-Za-z0-9_][A-Za-z0-9_.\-]*")
# the Hub's own rule for a repo id's two parts (huggingface_hub validate_repo_id): no '--' or '..'
_HF_PART = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.\-]{0,95}")
_QUANT = re.compile(r"[A-Za-z0-9_\-]{1,40}")
_DIGEST = re.compile(r"sha256[-:][0-9a-f]{64}")
OLLAMA_HOST = "registry.ollama.ai"
OLLAMA_NAMESPACE = "library"
OLLAMA_TAG = "latest"
HF_PREFIXES = ("hf.co/", "huggingface.co/")
# URL schemes a name must not start with ("model:tag" has the shape of "scheme:rest", so a list)
_SCHEMES = frozenset({"file", "http", "https", "ftp", "data", "s3", "gs", "ssh", "unix", "jar", "smb"})


class BadModelName(ValueError):
    """A model name refused as a name (it reads as a path, a URL or a digest, or holds bad characters)."""


def check_name(name: str, what: str = "model") -> str:
    """``name`` unchanged when it is a model name; BadModelName saying why it is not.

    Refused: empty or over 256 characters, control characters, backslashes, absolute paths and ``~``,
    ``.``/``..`` segments, URL schemes (``file://``, ``http://``...), and digests (``sha256:...``): a name
    never reaches the file system except through the stores' own layouts."""
    if not name or not name.strip():
        raise BadModelName(f"{what} must be a model name, got an empty string")
    if len(name) > MAX_NAME_LEN:
        raise BadModelName(f"{what} is longer than {MAX_NAME_LEN} characters")
    if any(ord(c) < 32 or ord(c) == 127 for c in name):
        raise BadModelName(f"{what} {name!r} holds control characters")
    scheme = name.split(":", 1)[0].lower() if ":" in name else ""
    if "://" in name or scheme in _SCHEMES:
        raise BadModelName(f"{what} {name!r} is a URL; name a model, not a location")
    if "\\" in name or name.startswith(("/", "~")):
        raise BadModelName(
            f"{what} {name!r} is a path; name a model (paths are allowed on the command line only)"
        )
    if "@" in name or _DIGEST.search(name):
        raise BadModelName(f"{what} {name!r} holds a digest; name a model by its name and tag")
    segments = name.split("/")
    if any(s in ("", ".", "..") for s in segments):
        raise BadModelName(f"{what} {name!r} has an empty, '.' or '..' segment; it is not a model name")
    if any(s.startswith(".") for s in segments):
        raise BadModelName(f"{what} {name!r} has a segment starting with '.'; it is not a model name")
    return name


@dataclass(frozen=True)
class HubName:
    """A Hugging Face repo id, and the GGUF quantization asked for (``None``: none named)."""

    repo_id: str
    quant: str | None = None

    def __str__(self) -> str:
        return self.repo_id + (f":{self.quant}" if self.quant else "")


def parse_hub_name(name: str) -> HubName | None:
    """``org/repo`` or ``org/repo:QUANT`` (``hf.co/`` in front allowed), or None when ``name`` is not one."""
    for prefix in HF_PREFIXES:
        if name.startswith(prefix):
            name = name[len(prefix) :]
            break
    repo, _, quant = name.partition(":")
    parts = repo.split("/")
    if len(parts) != 2 or not all(_HF_PART.fullmatch(p) for p in parts):
        return None
    if any("--" in p or ".." in p or p.endswith(".") for p in parts):
        return None
    if quant and not _QUANT.fullmatch(quant):
        return None
    return HubName(repo, quant or None)


@dataclass(frozen=True)
class OllamaName:
    """An Ollama model reference: ``host/namespace/model:tag`` with Ollama's defaults filled in."""

    host: str
    namespace: str
    model: str
    tag: str

    def parts(self) -> tuple[str, str, str, str]:
        """The manifest's path under ``manifests/``: host, namespace, model, tag."""
        return (self.host, self.namespace, self.model, self.tag)

    def short(self) -> str:
        """The name as ``ollama list`` shows it (the default host and namespace left out)."""
        head = "" if self.host == OLLAMA_HOST else self.host + "/"
        if head or self.namespace != OLLAMA_NAMESPACE:
            head += self.namespace + "/"
        return f"{head}{self.model}:{self.tag}"


def parse_ollama_name(name: str) -> OllamaName | None:
    """``[host/][namespace/]model[:tag]`` as Ollama reads it, or None when a part holds other characters.

    Every part is letters, digits, ``_ - .`` (the namespace no '.'), never '.' or '..' or empty, so the
    manifest path built from them stays under the store's ``manifests/`` folder."""
    head, _, tag = name.rpartition(":") if ":" in name.rsplit("/", 1)[-1] else (name, "", "")
    segments = head.split("/")
    if not 1 <= len(segments) <= 3:
        return None
    host, namespace = OLLAMA_HOST, OLLAMA_NAMESPACE
    if len(segments) == 3:
        host, namespace, model = segments
    elif len(segments) == 2:
        namespace, model = segments
    else:
        (model,) = segments
    tag = tag or OLLAMA_TAG
    for part in (host, namespace, model, tag):
        if len(part) > 128 or not _PART.fullmatch(part) or ".." in part:
            return None
    if "." in namespace:
        return None
    return OllamaName(host, namespace, model, tag)


def check_digest(digest: str) -> str:
    """A layer digest as a blob's file name (``sha256-<64 hex>``); BadModelName for anything else, so a
    manifest cannot point outside the store's ``blobs/`` folder."""
    if not _DIGEST.fullmatch(digest):
        raise BadModelName(f"digest {digest!r} is not sha256:<64 hex digits>")
    return digest.replace(":", "-", 1)
