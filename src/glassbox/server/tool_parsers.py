"""Tool calls in a model's own format (``tool_choice: "auto"``), by vLLM's parser names.

- ``hermes`` (Hermes 2 Pro, Qwen2.5, Qwen3): ``<tool_call>{"name": ..., "arguments": {...}}</tool_call>``,
  once per call; the last one may be left unclosed when generation stops.
- ``llama3_json`` (Llama 3.1-3.3 with JSON tool calling): ``{"name": ..., "parameters": {...}}`` as the
  whole reply, or after ``<|python_tag|>``; several calls separated by ``;``.
- ``mistral``: ``[TOOL_CALLS][{"name": ..., "arguments": {...}}, ...]`` (tokenizers before v11), or
  ``[TOOL_CALLS]name{...}`` once per call (v11 on; v13's ``[TOOL_CALLS]name[ARGS]{...}`` too).

A parser finds where the calls begin (``start``) and reads them (``calls``). The reply's content is the text
before that point (None when empty); when the calls do not parse (malformed JSON, a missing name, text the
format does not allow after them) the whole text is content and there are no calls, as vLLM does.
Each parser keys on ``"arguments"`` or ``"parameters"`` alike (models use both).

Streaming (``AutoToolStream``): text is sent as content as it comes, except a tail that could still grow
into the start marker; from the marker on it is held, and parsed when generation ends, so the calls reach
the client complete, in one piece each, and a streamed reply equals the one-shot one by construction.
"""

from __future__ import annotations

import json
import re
from abc import ABC, abstractmethod
from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True)
class ParsedCall:
    name: str
    arguments: str  # JSON text


class ToolParser(ABC):
    """A model's tool-call format."""

    name: str
    marker: str  # the text that opens the calls

    def start(self, text: str) -> int | None:
        """Where the calls begin in ``text``, or None while no call has begun."""
        i = text.find(self.marker)
        return i if i >= 0 else None

    def hold(self, text: str) -> int:
        """How many characters at the end of ``text`` (which has no call yet) could begin one."""
        return partial_suffix(text, self.marker)

    @abstractmethod
    def calls(self, region: str) -> list[ParsedCall] | None:
        """The calls in ``region`` (the text from ``start`` on); None when it does not parse."""

    def parse(self, text: str) -> tuple[str | None, list[ParsedCall]]:
        """(content, calls) of a whole reply."""
        begin = self.start(text)
        if begin is None:
            return (text or None), []
        found = self.calls(text[begin:])
        if not found:
            return (text or None), []
        return (text[:begin] or None), found


def partial_suffix(text: str, marker: str) -> int:
    """The length of the longest end of ``text`` that is a proper beginning of ``marker``."""
    for k in range(min(len(marker) - 1, len(text)), 0, -1):
        if text.endswith(marker[:k]):
            return k
    return 0


def _call(obj: Any) -> ParsedCall | None:
    """A call from a decoded {"name": str, "arguments" | "parameters": object}; None if it is not one."""
    if not isinstance(obj, dict) or not isinstance(obj.get("name"), str) or not obj["name"]:
        return None
    args = obj.get("arguments", obj.get("parameters", {}))
    if isinstance(args, str):  # some models write the arguments as a JSON string
        try:
            args = json.loads(args)
        except ValueError:
            return None
    if not isinstance(args, dict):
        return None
    return ParsedCall(obj["name"], json.dumps(args, ensure_ascii=False))


def _objects(text: str, separator: str = "") -> list[Any] | None:
    """The JSON values of ``text``, one after another (whitespace and ``separator`` between); None if any
    part is not JSON."""
    decoder = json.JSONDecoder()
    out: list[Any] = []
    i, n = 0, len(text)
    while True:
        while i < n and (text[i].isspace() or (separator and text[i] == separator and out)):
            i += 1
        if i >= n:
            return out
        try:
            value, i = decoder.raw_decode(text, i)
        except ValueError:
            return None
        out.append(value)


class HermesParser(ToolParser):
    name = "hermes"
    marker = "<tool_call>"
    _block = re.compile(r"<tool_call>(.*?)</tool_call>|<tool_call>(.*)", re.DOTALL)

    def calls(self, region: str) -> list[ParsedCall] | None:
        found = []
        for closed, unclosed in self._block.findall(region):
            try:
                obj = json.loads(closed or unclosed)
            except ValueError:
                return None
            call = _call(obj)
            if call is None:
                return None
            found.append(call)
        return found


class Llama3JsonParser(ToolParser):
    name = "llama3_json"
    marker = "<|python_tag|>"

    def start(self, text: str) -> int | None:
        if text.lstrip().startswith("{"):
            return 0
        i = text.find(self.marker)
        return i if i >= 0 else None

    def hold(self, text: str) -> int:
        if not text.strip():  # only whitespace yet: a JSON call may still follow
            return len(text)
        return partial_suffix(text, self.marker)

    def calls(self, region: str) -> list[ParsedCall] | None:
        if region.startswith(self.marker):
            region = region[len(self.marker) :]
        values = _objects(region, ";")
        if not values:
            return None
        found = [_call(v) for v in values]
        return None if any(c is None for c in found) else [c for c in found if c is not None]


class MistralParser(ToolParser):
    name = "mistral"
    marker = "[TOOL_CALLS]"
    _args = "[ARGS]"

    def calls(self, region: str) -> list[ParsedCall] | None:
        body = region[len(self.marker) :].lstrip()
        if body.startswith("["):  # [{"name": ..., "arguments": ...}, ...]
            values = _objects(body.replace(self.marker, ""))
            if not values or not all(isinstance(v, list) for v in values):
                return None
            items = [item for v in values for item in v]
            found = [_call(item) for item in items]
            return None if not found or any(c is None for c in found) else [c for c in found if c]
        out = []  # name{...} once per [TOOL_CALLS]
        for part in region.split(self.marker)[1:]:
            brace = part.find("{")
            if brace <= 0:
                return None
            name = part[:brace].replace(self._args, "").strip()
            values = _objects(part[brace:])
            if not name or not values or len(values) != 1:
                return None
            call = _call({"name": name, "arguments": values[0]})
            if call is None:
                return None
            out.append(call)
        return out or None


TOOL_PARSERS: dict[str, type[ToolParser]] = {
    p.name: p for p in (HermesParser, Llama3JsonParser, MistralParser)
}


class AutoToolStream:
    """Feeds a reply's text through a parser piece by piece: content as it comes, the calls at the end.

    ``feed`` and ``finish`` return events: ``("content", text)`` or ``("call", ParsedCall)``."""

    def __init__(self, parser: ToolParser) -> None:
        self.parser = parser
        self.text = ""
        self.sent = 0  # characters of text sent as content
        self.begin: int | None = None

    def feed(self, delta: str) -> list[tuple[str, Any]]:
        self.text += delta
        if self.begin is None:
            self.begin = self.parser.start(self.text)
        upto = self.begin if self.begin is not None else len(self.text) - self.parser.hold(self.text)
        return self._content(upto)

    def finish(self) -> list[tuple[str, Any]]:
        if self.begin is None:
            return self._content(len(self.text))
        found = self.parser.calls(self.text[self.begin :])
        if not found:
            return self._content(len(self.text))
        return self._content(self.begin) + [("call", c) for c in found]

    def _content(self, upto: int) -> list[tuple[str, Any]]:
        if upto <= self.sent:
            return []
        piece, self.sent = self.text[self.sent : upto], upto
        return [("content", piece)]
