"""A request's JSON body parsed so that no single C call (which keeps Python's GIL) reads much of it.

``parse_body``: the C parser (json.loads, one call) for a body of at most C_PARSER_BYTES that cannot hold
more than ``max_values`` values (its work: 1 MiB of strings, 3-30 ns a character, or ``max_values`` numbers,
~0.2 us each on a loaded 2-core machine: ~50 ms). Else the json module's Python scanner, counting values
as it goes (stopping past ``max_values``) and reading each string in windows of WINDOW characters (a few ms
of GIL each); an object's keys are still read whole by the json module's own C call. Then every value is
walked once: the count, and no lone UTF-16 surrogate.
"""

from __future__ import annotations

import json
import json.decoder
import json.scanner
import re
from collections.abc import Callable
from typing import Any

from glassbox.server.protocol import _lone_surrogate

# pydantic validates ~0.4 us per value on a loaded 2-core machine (a list of 1M token ids: 0.36-0.42 s);
# past this many values a body is refused before validation; a token-id prompt of 262,144 ids still fits
MAX_JSON_VALUES = 1 << 18
C_PARSER_BYTES = 1 << 20  # up to this, json.loads in one call: 1 MiB of escapes or numbers, ~30 ms loaded
# characters of a string per C call: the unit regex takes ~1.4 ms for 16K characters of escapes on a
# loaded 2-core machine (25 ms for 64K, 109 ms for 256K: its cost grows faster than the window)
WINDOW = 1 << 14
# A string's text as whole units: plain characters, an escaped surrogate pair, any other \uXXXX (not a
# high surrogate alone), a two-character escape; it stops at the closing quote or a cut escape.
_UNIT = (
    r'[^"\\]+|\\u[dD][89abAB][0-9a-fA-F]{2}\\u[dD][c-fC-F][0-9a-fA-F]{2}'
    r"|\\u(?![dD][89abAB])[0-9a-fA-F]{4}|\\[^u]"
)
_UNITS = re.compile(f"(?:{_UNIT})*")
_ONE_UNIT = re.compile(_UNIT)
_SURROGATE = re.compile("[\ud800-\udfff]")
_c_scanstring = json.decoder.scanstring  # type: ignore[attr-defined]  # the C one where built


class BodyError(ValueError):
    """A JSON body refused before validation (400)."""

    def __init__(self, message: str, param: str | None = None, code: str = "invalid_value") -> None:
        super().__init__(message)
        self.message = message
        self.param = param
        self.code = code


def _too_many(max_values: int) -> BodyError:
    return BodyError(f"the JSON body holds more than {max_values} values; split the request")


def _piece(text: str, s: str, at: int, strict: bool) -> str:
    """The decoded ``text`` (whole escapes, no quote) of string ``s`` from ``at``."""
    try:
        return str(_c_scanstring(text + '"', 0, strict)[0])
    except json.JSONDecodeError as e:
        raise json.JSONDecodeError(e.msg, s, at + e.pos) from None


def scan_string(s: str, end: int, strict: bool = True, window: int = WINDOW) -> tuple[str, int]:
    """json.decoder.scanstring's result (the string starting after the quote at ``end`` - 1, and the
    position after its closing quote), read ``window`` characters per C call."""
    parts: list[str] = []
    while True:
        units = _UNITS.match(s, end, end + window)  # always matches (maybe nothing)
        cut = units.end() if units is not None else end
        if cut < len(s) and s[cut] == '"':  # the closing quote: the rest is one window at most
            text, after = _c_scanstring(s, end, strict)
            return "".join([*parts, text]), after
        if cut == end:  # the window cannot hold the next unit, or a lone high surrogate or bad escape is next
            if end >= len(s):
                raise json.JSONDecodeError("Unterminated string starting at", s, end)
            unit = _ONE_UNIT.match(s, end)
            cut = unit.end() if unit is not None else end + (6 if s.startswith("\\u", end) else 2)
        parts.append(_piece(s[end:cut], s, end, strict))
        end = cut


def _counting_decoder(max_values: int, window: int) -> json.JSONDecoder:
    """The json module's Python scanner, counting array items and object members (BodyError past
    ``max_values``), reading strings ``window`` characters per C call."""
    decoder = json.JSONDecoder()
    count = 0

    def counted(scan_once: Callable[[str, int], Any]) -> Callable[[str, int], Any]:
        def scan(text: str, at: int) -> Any:
            nonlocal count
            count += 1
            if count > max_values:
                raise _too_many(max_values)
            return scan_once(text, at)

        return scan

    def parse_array(s_and_end: tuple[str, int], scan_once: Callable[[str, int], Any]) -> Any:
        return json.decoder.JSONArray(s_and_end, counted(scan_once))  # type: ignore[attr-defined]

    def parse_object(s_and_end: tuple[str, int], strict: bool, scan_once: Callable[[str, int], Any],
                     *hooks: Any) -> Any:  # fmt: skip
        return json.decoder.JSONObject(s_and_end, strict, counted(scan_once), *hooks)  # type: ignore[attr-defined]

    decoder.parse_array = parse_array  # type: ignore[attr-defined]
    decoder.parse_object = parse_object  # type: ignore[attr-defined]
    decoder.parse_string = lambda s, end, strict: scan_string(s, end, strict, window)  # type: ignore[attr-defined]
    decoder.scan_once = json.scanner.py_make_scanner(decoder)  # type: ignore[attr-defined]
    return decoder


def parse_body(
    raw: bytes, max_values: int = MAX_JSON_VALUES, window: int = WINDOW, c_parser_bytes: int = C_PARSER_BYTES
) -> Any:
    """The JSON value of ``raw``; BodyError for malformed JSON, nesting too deep, more than ``max_values``
    values, or a lone surrogate.

    A value is the whole body, an array item or an object member's value: each item but an array's first
    follows a ",", each member's value a ":", each array's first item a "[", so those bytes (counted inside
    strings too) bound the values from above."""
    try:
        separators = raw.count(b",") + raw.count(b":") + raw.count(b"[")
        if len(raw) <= c_parser_bytes and separators < max_values:
            value = json.loads(raw)
        else:
            text = raw.decode(json.detect_encoding(raw), "surrogatepass")  # as json.loads decodes bytes
            value = _counting_decoder(max_values, window).decode(text)
    except json.JSONDecodeError as e:
        raise BodyError(f"malformed JSON body: {e.msg} (line {e.lineno}, column {e.colno})", None,
                        "invalid_json") from None  # fmt: skip
    except UnicodeDecodeError as e:
        raise BodyError(
            f"the body is not UTF-8 text: {e.reason} at byte {e.start}", None, "invalid_json"
        ) from None
    except RecursionError:
        raise BodyError("the JSON body nests too deeply", None, "invalid_json") from None
    _check_values(value, max_values)
    return value


def _check_values(value: Any, max_values: int) -> None:
    count, stack, bad = 0, [value], False
    while stack:
        item = stack.pop()
        count += 1
        if count > max_values:
            raise _too_many(max_values)
        if isinstance(item, str):
            bad = bad or _has_surrogate(item)
        elif isinstance(item, dict):
            bad = bad or any(_has_surrogate(str(k)) for k in item)
            stack.extend(item.values())
        elif isinstance(item, list):
            stack.extend(item)
    if bad:
        where = _lone_surrogate(value, "") if isinstance(value, (dict, list)) else ""
        raise BodyError(
            f"{where or 'a field name'} holds a lone UTF-16 surrogate (an unpaired \\ud800-\\udfff escape), "
            "which is not valid Unicode text",
            where or None,
        )


def _has_surrogate(text: str) -> bool:
    if text.isascii():  # O(1): CPython keeps the flag
        return False
    try:
        text.encode("utf-16-le")  # one pass at memory speed; strict: a lone surrogate cannot be encoded
    except UnicodeEncodeError:
        return _SURROGATE.search(text) is not None
    return False
