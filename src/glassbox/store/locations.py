"""Where the stores live, read from the environment at each call (torch-free).

The Hugging Face cache as ``huggingface_hub`` documents it: ``HF_HUB_CACHE`` (or the older
``HUGGINGFACE_HUB_CACHE``), else ``$HF_HOME/hub``, ``HF_HOME`` defaulting to ``$XDG_CACHE_HOME/huggingface``
or ``~/.cache/huggingface``. Ollama's store as Ollama documents it: ``OLLAMA_MODELS``, else
``~/.ollama/models`` (and the Linux service's ``/usr/share/ollama/.ollama/models`` where it exists).
Read here, not from ``huggingface_hub.constants``, because that module reads the variables once at import.
"""

from __future__ import annotations

import os
from pathlib import Path

LINUX_SERVICE_OLLAMA = Path("/usr/share/ollama/.ollama/models")


def hf_hub_cache() -> Path:
    """The Hugging Face hub cache directory (it may not exist)."""
    explicit = os.environ.get("HF_HUB_CACHE") or os.environ.get("HUGGINGFACE_HUB_CACHE")
    if explicit:
        return Path(os.path.expandvars(explicit)).expanduser()
    home = os.environ.get("HF_HOME")
    if not home:
        cache = os.environ.get("XDG_CACHE_HOME") or os.path.join("~", ".cache")
        home = os.path.join(cache, "huggingface")
    return Path(os.path.expandvars(home)).expanduser() / "hub"


def ollama_stores() -> list[Path]:
    """Ollama's model stores to read: ``OLLAMA_MODELS`` alone when set, else the default ones that exist."""
    explicit = os.environ.get("OLLAMA_MODELS")
    if explicit:
        return [Path(os.path.expandvars(explicit)).expanduser()]
    home = Path("~/.ollama/models").expanduser()
    return [p for p in (home, LINUX_SERVICE_OLLAMA) if p.is_dir()] or [home]
