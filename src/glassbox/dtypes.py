"""One vocabulary of element types for the engine, the planner and the CLI (torch-free).

Canonical names are the short ones the planner's formats use ("fp32", "bf16", "fp16", "fp8", ...). At the
edges both spellings are accepted: ``--dtype bfloat16``, a config.json's ``"torch_dtype": "bfloat16"``
and ``--kv-cache-dtype bf16`` all mean "bf16". torch dtypes are mapped in models/model_config.py.
"""

from __future__ import annotations

# canonical name -> bytes per element
ELEMENT_BYTES: dict[str, float] = {
    "fp32": 4.0,
    "bf16": 2.0,
    "fp16": 2.0,
    "fp8": 1.0,
    "int8": 1.0,
    "q8_0": 8.5 / 8,  # llama.cpp's 8-bit KV cache: 32 int8 + one fp16 scale
}

ALIASES: dict[str, str] = {
    "float32": "fp32",
    "float": "fp32",
    "f32": "fp32",
    "bfloat16": "bf16",
    "float16": "fp16",
    "half": "fp16",
    "f16": "fp16",
    "fp8_e4m3": "fp8",
    "float8_e4m3fn": "fp8",
}

# What the engine can hold weights in today ("auto": the model's own dtype), and its KV cache: also 8 bits
# with a float32 scale per token and head (layers/kv_quant.py).
ENGINE_DTYPES = ("auto", "fp32", "bf16", "fp16")
KV_CACHE_DTYPES = (*ENGINE_DTYPES, "fp8", "int8")
KV_SCALE_BYTES = 4  # per (token, head) row of an 8-bit glassbox cache


def canonical(name: str) -> str:
    """The canonical spelling of a dtype name (unknown names come back lower-cased, unchanged)."""
    key = name.strip().lower()
    return ALIASES.get(key, key)


def parse_dtype(name: str, flag: str, allowed: tuple[str, ...]) -> str:
    """``name`` in canonical form if it is one of ``allowed`` (canonical names); else ValueError naming
    ``flag`` and the allowed values with their long spellings."""
    key = canonical(name)
    if key not in allowed:
        spelled = [a + (f" ({long})" if (long := long_name(a)) != a else "") for a in allowed]
        raise ValueError(f"{flag} must be one of {', '.join(spelled)}, got {name!r}")
    return key


def long_name(name: str) -> str:
    """The torch / config.json spelling of a canonical name ("bf16" -> "bfloat16")."""
    return {"fp32": "float32", "bf16": "bfloat16", "fp16": "float16"}.get(name, name)


def element_bytes(name: str) -> float:
    """Bytes per element of a dtype (either spelling); KeyError for an unknown one."""
    return ELEMENT_BYTES[canonical(name)]


def kv_element_bytes(name: str, head_dim: int) -> float:
    """Bytes per cached K/V element in glassbox's cache: the dtype's, plus for fp8/int8 the row's float32
    scale shared by its ``head_dim`` elements."""
    key = canonical(name)
    return ELEMENT_BYTES[key] + (KV_SCALE_BYTES / head_dim if key in ("fp8", "int8") else 0.0)
