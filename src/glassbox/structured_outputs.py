"""StructuredOutputs: the constraint a request puts on its output's text (vLLM's names; torch-free).

Exactly one of ``json`` (a JSON schema), ``json_object`` (any JSON object), ``regex``, ``choice`` (one of
the strings) or ``grammar`` (Lark, or llama.cpp's GBNF) is set. The engine compiles it into a grammar
(engine/structured.py) and masks, at every step, the tokens that cannot continue a text it accepts.
"""

from __future__ import annotations

import json as _json
from dataclasses import dataclass
from typing import Any

from glassbox.json_schema_refs import ref_loop

KINDS = ("json", "json_object", "regex", "choice", "grammar")
# llguidance compiles 4,000 options in 0.17 s and 32,000 in 4.3 s here (superlinear), and panics near 65,000
# grammar symbols: more options than this is a 400, not seconds of compiling
MAX_CHOICES = 4096


@dataclass(frozen=True)
class StructuredOutputs:
    """The output must match one constraint; invalid values raise ``ValueError``.

    ``json`` may be given as a dict or as its JSON text. A malformed schema, regex or grammar is found
    when the engine compiles it (``GrammarError``, a ValueError naming the problem)."""

    json: dict[str, Any] | str | None = None
    json_object: bool | None = None
    regex: str | None = None
    choice: list[str] | None = None
    grammar: str | None = None

    def __post_init__(self) -> None:
        given = [k for k in KINDS if getattr(self, k) not in (None, False)]
        if len(given) != 1:
            what = ", ".join(given) if given else "none"
            raise ValueError(f"structured outputs take exactly one of {', '.join(KINDS)}; got {what}")
        if isinstance(self.json, str):
            try:
                parsed = _json.loads(self.json)
            except ValueError as e:
                raise ValueError(f"the JSON schema is not valid JSON: {e}") from None
            object.__setattr__(self, "json", parsed)
        if self.json is not None and not isinstance(self.json, dict):
            raise ValueError(f"a JSON schema must be a JSON object, got {type(self.json).__name__}")
        loop = ref_loop(self.json) if self.json is not None else None
        if loop is not None:
            raise ValueError(
                f"invalid JSON schema: its $ref loops without descending into the value: {' -> '.join(loop)}"
            )
        if self.json_object is not None and not isinstance(self.json_object, bool):
            raise ValueError("json_object must be true or false")
        for name in ("regex", "grammar"):
            value = getattr(self, name)
            if value is not None and (not isinstance(value, str) or not value):
                raise ValueError(f"{name} must be a non-empty string")
        if self.choice is not None:
            if (
                not isinstance(self.choice, list | tuple)
                or not self.choice
                or any(not isinstance(c, str) or not c for c in self.choice)
            ):
                raise ValueError("choice must be a non-empty list of non-empty strings")
            if len(self.choice) > MAX_CHOICES:
                raise ValueError(f"choice has {len(self.choice)} options, more than {MAX_CHOICES}")
            object.__setattr__(self, "choice", list(self.choice))

    @property
    def kind(self) -> str:
        return next(k for k in KINDS if getattr(self, k) not in (None, False))

    @property
    def key(self) -> tuple[str, str]:
        """(kind, canonical text): equal for equal constraints (a JSON schema's key order is kept: it is the
        order in which the output writes the properties)."""
        kind = self.kind
        if kind == "json":
            return kind, _json.dumps(self.json, separators=(",", ":"), ensure_ascii=False)
        if kind == "json_object":
            return kind, ""
        if kind == "choice":
            return kind, _json.dumps(self.choice, ensure_ascii=False)
        value = getattr(self, kind)
        assert isinstance(value, str)
        return kind, value

    def __hash__(self) -> int:
        return hash(self.key)
