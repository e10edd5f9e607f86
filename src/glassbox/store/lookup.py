"""A model name to the model it names, in the Hugging Face cache, then in Ollama's store (torch-free).

``org/repo[:QUANT]`` (or ``hf.co/org/repo:QUANT``) is looked up in the HF cache first; any name that reads
as Ollama's (``model[:tag]``, ``namespace/model[:tag]``, ``host/namespace/model[:tag]``) in Ollama's store.
Paths are not names: models/sources.py takes those (the command line's), before asking here.
"""

from __future__ import annotations

from glassbox.store import hf_cache, ollama_store
from glassbox.store.locations import hf_hub_cache, ollama_stores
from glassbox.store.names import check_name, parse_hub_name, parse_ollama_name
from glassbox.store.stored import StoredModel


def find_model(name: str) -> StoredModel | None:
    """The stored model ``name`` names, or None when no store holds it.

    BadModelName (a ValueError) when ``name`` reads as a path, URL or digest; FileNotFoundError naming
    what a store holds when it has the repo but not the file asked for."""
    check_name(name)
    hub = parse_hub_name(name)
    if hub is not None:
        found = hf_cache.find(hub)
        if found is not None:
            return found
    ollama = parse_ollama_name(name)
    if ollama is not None:
        return ollama_store.find(ollama)
    return None


def where_looked() -> str:
    """The stores a name is looked up in, for error messages."""
    stores = ", ".join(str(p) for p in ollama_stores())
    return f"the Hugging Face cache ({hf_hub_cache()}) and Ollama's store ({stores})"
