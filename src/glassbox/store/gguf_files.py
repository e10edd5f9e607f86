"""Which GGUF checkpoints a repo's file list holds, and which one ``:QUANT`` names (torch-free).

Shared by the HF cache lookup (files on disk) and ``glassbox pull`` (the Hub's file list). A split
checkpoint (llama.cpp's ``-00001-of-00003.gguf``) is one checkpoint; multimodal projectors (``mmproj*``)
are left out. A checkpoint's tag is the quantization its file name carries (``Q4_K_M``), else its stem;
``:QUANT`` matches a tag case-insensitively, or a part of the file (or folder) name ended by '.', '-' or
'/' (never '_', which continues a tag: ``Q4`` does not pick ``Q4_1``), as Ollama and llama.cpp match it.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

_SHARD = re.compile(r"-(\d{5})-of-(\d{5})$")
# the quantization tags GGUF file names carry: Q4_K_M, Q8_0, IQ4_XS, UD-Q4_K_XL, F16, BF16, MXFP4
_QUANT_TAG = re.compile(
    r"(?<![A-Za-z0-9])((?:UD-)?I?Q[1-8](?:_[A-Za-z0-9]+)*|B?F16|F32|MXFP4(?:_MOE)?)(?![A-Za-z0-9])", re.I
)


@dataclass(frozen=True)
class GGUFCheckpoint:
    """One GGUF checkpoint of a repo: its tag and its files (repo paths, first shard first)."""

    tag: str
    files: tuple[str, ...]


def checkpoints(paths: list[str]) -> list[GGUFCheckpoint]:
    """The GGUF checkpoints among a repo's file paths (posix, relative to the repo), sorted by name."""
    groups: dict[str, list[str]] = {}
    for path in paths:
        name = path.rsplit("/", 1)[-1]
        if not name.lower().endswith(".gguf") or name.lower().startswith("mmproj"):
            continue
        groups.setdefault(_SHARD.sub("", path[: -len(".gguf")]), []).append(path)
    return [GGUFCheckpoint(_label(stem), tuple(sorted(files))) for stem, files in sorted(groups.items())]


def _label(stem: str) -> str:
    name = stem.rsplit("/", 1)[-1]
    tags = _QUANT_TAG.findall(name)
    return str(tags[-1]) if tags else name


def matches(checkpoint: GGUFCheckpoint, quant: str) -> bool:
    q = quant.lower()
    if checkpoint.tag.lower() == q:
        return True
    path = checkpoint.files[0].lower()
    return re.search(r"(^|[-._/])" + re.escape(q) + r"([-./]|$)", path) is not None


def pick(found: list[GGUFCheckpoint], quant: str | None, repo_id: str, where: str) -> GGUFCheckpoint:
    """The checkpoint ``quant`` names (None: the only one); FileNotFoundError listing the tags held."""
    held = ", ".join(c.tag for c in found) or "no GGUF files"
    if quant is None:
        if len(found) == 1:
            return found[0]
        if not found:
            raise FileNotFoundError(f"{repo_id} {where} holds no GGUF file")
        raise FileNotFoundError(f"{repo_id} {where} holds {len(found)} GGUF checkpoints: name one as "
                                f"{repo_id}:QUANT, one of {held}")  # fmt: skip
    picked = [c for c in found if matches(c, quant)]
    if len(picked) == 1:
        return picked[0]
    if not picked:
        raise FileNotFoundError(f"{repo_id} {where} has no GGUF file for {quant!r}; it holds: {held}")
    raise FileNotFoundError(f"{quant!r} matches several GGUF checkpoints of {repo_id}: "
                            + ", ".join(c.files[0] for c in picked))  # fmt: skip
