"""Structured outputs from an API request: OpenAI's ``response_format``, vLLM's ``structured_outputs``
and its older ``guided_*`` fields, into the engine's ``StructuredOutputs``, compiled here so that a bad
schema, regex or grammar is a 400 naming the problem before anything is queued.

- ``response_format``: ``{"type": "text"}`` (no constraint), ``{"type": "json_object"}``,
  ``{"type": "json_schema", "json_schema": {"name", "schema", "strict"}}`` (always enforced, strict or
  not; no schema: any JSON object). Chat and completions alike, as vLLM does.
- ``structured_outputs``: ``{"json" | "regex" | "choice" | "grammar" | "json_object": ...}`` (vLLM >= 0.12).
- ``guided_json``, ``guided_regex``, ``guided_choice``, ``guided_grammar`` (vLLM before 0.12).

At most one of them may constrain a request.
"""

from __future__ import annotations

import asyncio
from dataclasses import replace
from typing import Any

from glassbox.engine.structured import GrammarError
from glassbox.sampling_params import SamplingParams
from glassbox.server.errors import bad_request
from glassbox.server.protocol import SamplingFields
from glassbox.server.state import ServerState
from glassbox.structured_outputs import KINDS, StructuredOutputs

_GUIDED = {
    "guided_json": "json",
    "guided_regex": "regex",
    "guided_choice": "choice",
    "guided_grammar": "grammar",
}
# vLLM options accepted and needing nothing: JSON never has free whitespace here; there is one backend
_IGNORED_OPTIONS = {"disable_any_whitespace", "disable_fallback"}


async def with_structured_outputs(
    state: ServerState, req: SamplingFields, params: SamplingParams
) -> SamplingParams:
    """``params`` with the request's structured outputs (checked, and compiled in a worker thread: a large
    schema or choice list compiles for seconds, and llguidance lets the GIL go meanwhile), or unchanged
    without any."""
    found = _sources(req)
    if not found:
        return params
    if len(found) > 1:
        names = " and ".join(name for name, _ in found)
        raise bad_request(f"give one structured-output constraint, not {names}", found[1][0])
    param, fields = found[0]
    try:
        spec = StructuredOutputs(**fields)
    except ValueError as e:
        raise bad_request(f"{param}: {e}", param) from None
    try:
        await asyncio.to_thread(state.grammars.compile, spec)
    except GrammarError as e:
        raise bad_request(f"{param}: {e}", param) from None
    try:
        return replace(params, structured_outputs=spec)
    except ValueError as e:  # a combination the engine refuses (min_tokens)
        raise bad_request(str(e), str(e).split(" ", 1)[0]) from None


def _sources(req: SamplingFields) -> list[tuple[str, dict[str, Any]]]:
    """(API parameter, StructuredOutputs fields) of each constraint the request gives."""
    found: list[tuple[str, dict[str, Any]]] = []
    if req.response_format is not None:
        fields = _response_format(req.response_format)
        if fields is not None:
            found.append(("response_format", fields))
    if req.structured_outputs is not None:
        found.append(("structured_outputs", _vllm_fields(req.structured_outputs)))
    for name, kind in _GUIDED.items():
        value = getattr(req, name)
        if value is not None:
            found.append((name, {kind: value}))
    if req.guided_whitespace_pattern is not None:
        raise bad_request("guided_whitespace_pattern is not supported", "guided_whitespace_pattern")
    return found


def _response_format(rf: dict[str, Any]) -> dict[str, Any] | None:
    kind = rf.get("type")
    if kind == "text":
        return None
    if kind == "json_object":
        return {"json_object": True}
    if kind != "json_schema":
        raise bad_request(
            f"response_format.type must be text, json_object or json_schema, got {kind!r}", "response_format"
        )
    spec = rf.get("json_schema")
    if not isinstance(spec, dict):
        raise bad_request(
            'response_format.json_schema must be an object {"name": ..., "schema": {...}}', "response_format"
        )
    if not isinstance(spec.get("name"), str) or not spec["name"]:
        raise bad_request(
            "response_format.json_schema.name is required (a non-empty string)", "response_format"
        )
    if spec.get("strict") not in (None, True, False):
        raise bad_request("response_format.json_schema.strict must be true or false", "response_format")
    schema = spec.get("schema")
    if schema is None:
        return {"json_object": True}
    if not isinstance(schema, dict):
        raise bad_request("response_format.json_schema.schema must be a JSON object", "response_format")
    return {"json": schema}


def _vllm_fields(so: dict[str, Any]) -> dict[str, Any]:
    unknown = sorted(set(so) - set(KINDS) - _IGNORED_OPTIONS)
    if unknown:
        raise bad_request(
            f"structured_outputs: {', '.join(unknown)} not supported (supported: {', '.join(KINDS)})",
            "structured_outputs",
        )
    return {k: v for k, v in so.items() if k in KINDS and v is not None}
