"""``$ref`` loops in a JSON schema: references that come back to where they started without descending into
the value (``{"$ref": "#"}``, a -> b -> a, an ``anyOf`` that names itself). Evaluating such a schema never
ends (JSON Schema asks validators to detect it); a grammar built from it matches nothing useful. A reference
reached through ``properties``, ``items`` and the like descends one level into the value: that is
recursion (a tree), which is fine.
"""

from __future__ import annotations

from typing import Any

# keywords whose subschemas apply to the same value (a loop through only these never ends)
_IN_PLACE_LISTS = ("allOf", "anyOf", "oneOf")
_IN_PLACE_ONE = ("not", "if", "then", "else")
# keywords whose values are data, not schemas
_DATA = {"const", "enum", "default", "examples", "example"}


def _escape(key: str) -> str:
    return key.replace("~", "~0").replace("/", "~1")


def _target(ref: str) -> str | None:
    """The JSON pointer a local ``$ref`` names ("#" -> "", "#/$defs/a" -> "/$defs/a"), else None."""
    if ref == "#":
        return ""
    if ref.startswith("#/"):
        return ref[1:]
    return None  # an anchor or a remote reference: left to the grammar engine


def _nodes(schema: Any) -> dict[str, dict[str, Any]]:
    """Every object in the schema (data keywords skipped), by JSON pointer."""
    found: dict[str, dict[str, Any]] = {}
    stack: list[tuple[str, Any]] = [("", schema)]
    while stack:
        pointer, value = stack.pop()
        if isinstance(value, dict):
            found[pointer] = value
            stack.extend((f"{pointer}/{_escape(str(k))}", v) for k, v in value.items() if k not in _DATA)
        elif isinstance(value, list):
            stack.extend((f"{pointer}/{i}", v) for i, v in enumerate(value))
    return found


def _edges(pointer: str, node: dict[str, Any]) -> list[str]:
    out = []
    ref = node.get("$ref")
    if isinstance(ref, str) and (target := _target(ref)) is not None:
        out.append(target)
    for key in _IN_PLACE_LISTS:
        if isinstance(node.get(key), list):
            out.extend(f"{pointer}/{key}/{i}" for i in range(len(node[key])))
    out.extend(f"{pointer}/{key}" for key in _IN_PLACE_ONE if isinstance(node.get(key), dict))
    return out


def ref_loop(schema: Any) -> list[str] | None:
    """The pointers of one in-place ``$ref`` loop of ``schema`` ("#", "#/$defs/a", ..., back to the first),
    or None when it has none."""
    nodes = _nodes(schema)
    edges = {p: [e for e in _edges(p, node) if e in nodes] for p, node in nodes.items()}
    state: dict[str, int] = {}  # 1: on the current path, 2: done
    for start in nodes:
        if start in state:
            continue
        path: list[str] = []
        stack: list[tuple[str, int]] = [(start, 0)]
        while stack:
            pointer, i = stack.pop()
            if i == 0:
                state[pointer] = 1
                path.append(pointer)
            if i < len(edges[pointer]):
                stack.append((pointer, i + 1))
                nxt = edges[pointer][i]
                if state.get(nxt) == 1:
                    loop = path[path.index(nxt) :] + [nxt]
                    return ["#" + p for p in loop]
                if nxt not in state:
                    stack.append((nxt, 0))
            else:
                state[pointer] = 2
                path.pop()
    return None
