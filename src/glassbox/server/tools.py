"""Tool calling in /v1/chat/completions: the request's ``tools``, ``tool_choice`` and ``parallel_tool_calls``
checked (400 naming the parameter), the grammar that enforces ``"required"`` and a named function, the
chat history's tool calls made ready for the chat template, and the calls read back from a forced reply.

- ``"none"``: no calls (the tools still reach the template, as vLLM does).
- ``"auto"`` (the default when tools are given): the model decides, in its own format, read by the
  ``--tool-call-parser`` (server/tool_parsers.py); needs ``--enable-auto-tool-choice``, as in vLLM.
- ``"required"``: the output is constrained to a JSON array of ``{"name": <a tool's name>, "arguments":
  <its parameters' schema>}`` (one item when ``parallel_tool_calls`` is false), whatever the model's format.
- ``{"type": "function", "function": {"name": N}}``: the output is constrained to N's parameters (vLLM's
  choice: the name is known, so only the arguments are generated).
"""

from __future__ import annotations

import json
import re
import secrets
import string
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING, Any

from glassbox.sampling_params import SamplingParams
from glassbox.server.errors import bad_request
from glassbox.server.tool_parsers import ParsedCall
from glassbox.structured_outputs import StructuredOutputs

if TYPE_CHECKING:
    from glassbox.server.state import ServerState

_NAME = re.compile(r"^[A-Za-z0-9_-]{1,64}$")  # OpenAI's rule for a function's name
_EMPTY_PARAMS: dict[str, Any] = {"type": "object", "properties": {}}
_ID_CHARS = string.ascii_letters + string.digits


def new_call_id() -> str:
    """An id in OpenAI's shape: ``call_`` and 24 random letters and digits."""
    return "call_" + "".join(secrets.choice(_ID_CHARS) for _ in range(24))


@dataclass(frozen=True)
class ToolChoice:
    """A request's checked tools: the function definitions (as the template gets them) and the choice,
    "none", "auto", "required" or the name of the function to call."""

    tools: list[dict[str, Any]]
    choice: str
    named: bool
    parallel: bool

    @property
    def forced(self) -> bool:
        return self.choice == "required" or self.named

    def parameters(self, name: str) -> dict[str, Any]:
        for tool in self.tools:
            if tool["function"]["name"] == name:
                return dict(tool["function"].get("parameters") or _EMPTY_PARAMS)
        raise KeyError(name)

    def schema(self) -> dict[str, Any]:
        """The JSON schema a forced reply follows."""
        if self.named:
            return self.parameters(self.choice)
        items = [
            {
                "type": "object",
                "properties": {
                    "name": {"const": t["function"]["name"]},
                    "arguments": self.parameters(t["function"]["name"]),
                },
                "required": ["name", "arguments"],
                "additionalProperties": False,
            }
            for t in self.tools
        ]
        array: dict[str, Any] = {
            "type": "array",
            "items": items[0] if len(items) == 1 else {"anyOf": items},
            "minItems": 1,
        }
        if not self.parallel:
            array["maxItems"] = 1
        return array


def check_tools(
    tools: list[Any] | None, tool_choice: Any, parallel_tool_calls: bool | None, auto_enabled: bool
) -> ToolChoice | None:
    """The request's tools and choice, checked; None when it has no tools (and no choice that needs one)."""
    if not tools:
        if tool_choice not in (None, "none", "auto"):
            raise bad_request("tool_choice needs tools: give the functions in tools", "tool_choice")
        return None
    checked = [_check_tool(t, i) for i, t in enumerate(tools)]
    names = [t["function"]["name"] for t in checked]
    dup = next((n for n in names if names.count(n) > 1), None)
    if dup is not None:
        raise bad_request(f"tools: the function name {dup!r} is given twice", "tools")
    named = False
    if tool_choice is None:
        choice = "auto"
    elif isinstance(tool_choice, str):
        if tool_choice not in ("none", "auto", "required"):
            raise bad_request(
                f'tool_choice must be "none", "auto", "required" or {{"type": "function", "function": '
                f'{{"name": ...}}}}, got {tool_choice!r}',
                "tool_choice",
            )
        choice = tool_choice
    else:
        choice, named = _named_choice(tool_choice, names), True
    if choice == "auto" and not auto_enabled:
        raise bad_request(
            '"auto" tool choice requires --enable-auto-tool-choice and --tool-call-parser to be set '
            '(give tool_choice "required", "none" or a named function, or start the server with them)',
            "tool_choice",
        )
    return ToolChoice(checked, choice, named, True if parallel_tool_calls is None else parallel_tool_calls)


def _check_tool(tool: Any, i: int) -> dict[str, Any]:
    where = f"tools[{i}]"
    if not isinstance(tool, dict) or tool.get("type", "function") != "function":
        raise bad_request(f'{where} must be {{"type": "function", "function": {{...}}}}', where)
    fn = tool.get("function")
    if not isinstance(fn, dict):
        raise bad_request(
            f'{where}.function must be an object {{"name", "description", "parameters"}}', where
        )
    name = fn.get("name")
    if not isinstance(name, str) or not _NAME.match(name):
        raise bad_request(
            f"{where}.function.name must be 1 to 64 letters, digits, _ or -, got {name!r}",
            f"{where}.function.name",
        )
    if fn.get("description") is not None and not isinstance(fn["description"], str):
        raise bad_request(f"{where}.function.description must be a string", f"{where}.function.description")
    params = fn.get("parameters")
    if params is not None:
        if not isinstance(params, dict):
            raise bad_request(
                f"{where}.function.parameters must be a JSON schema object, got {type(params).__name__}",
                f"{where}.function.parameters",
            )
        if params.get("type", "object") != "object":
            raise bad_request(
                f'{where}.function.parameters must describe an object ("type": "object"), '
                f"got type {params.get('type')!r}",
                f"{where}.function.parameters",
            )
    if fn.get("strict") not in (None, True, False):
        raise bad_request(f"{where}.function.strict must be true or false", f"{where}.function.strict")
    out = {k: v for k, v in fn.items() if v is not None}
    return {"type": "function", "function": out}


def _named_choice(choice: Any, names: list[str]) -> str:
    fn = choice.get("function") if isinstance(choice, dict) else None
    name = fn.get("name") if isinstance(fn, dict) else None
    if not isinstance(choice, dict) or choice.get("type") != "function" or not isinstance(name, str):
        raise bad_request(
            'tool_choice must be "none", "auto", "required" or {"type": "function", "function": {"name": ...}}',
            "tool_choice",
        )
    if name not in names:
        raise bad_request(
            f"tool_choice names the function {name!r}, which is not in tools ({', '.join(names)})",
            "tool_choice",
        )
    return name


def template_messages(chat: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The messages as chat templates expect them (vLLM's and transformers' convention): an assistant
    turn's tool call arguments as a dict rather than JSON text, its missing content as ""."""
    out = []
    for i, message in enumerate(chat):
        message = dict(message)
        calls = message.get("tool_calls")
        if message.get("role") == "assistant" and calls is not None:
            if not isinstance(calls, list):
                raise bad_request(f"messages[{i}].tool_calls must be a list", f"messages[{i}].tool_calls")
            if calls:
                message["tool_calls"] = [
                    _history_call(c, f"messages[{i}].tool_calls[{j}]") for j, c in enumerate(calls)
                ]
            else:
                del message["tool_calls"]
            if message.get("content") is None:
                message["content"] = ""
        out.append(message)
    return out


def _history_call(call: Any, where: str) -> dict[str, Any]:
    fn = call.get("function") if isinstance(call, dict) else None
    if not isinstance(fn, dict) or not isinstance(fn.get("name"), str):
        raise bad_request(
            f'{where} must be {{"id", "type": "function", "function": {{"name", "arguments"}}}}', where
        )
    args = fn.get("arguments")
    if isinstance(args, str) and args.strip():
        try:
            args = json.loads(args)
        except ValueError as e:
            raise bad_request(
                f"{where}.function.arguments is not valid JSON: {e}", f"{where}.function.arguments"
            ) from None
    elif not args:
        args = {}
    return {**call, "type": call.get("type", "function"), "function": {**fn, "arguments": args}}


class ForcedToolStream:
    """Reads a grammar-forced reply as it streams: a named function's arguments go out as they come; with
    "required", each array item's arguments go out as they come once its name is complete.

    ``feed`` and ``finish`` return events: ``("call", ParsedCall)`` opens a call (arguments ""), then
    ``("args", text)`` continue the last one opened. A reply cut short (max_tokens) leaves the last call's
    arguments incomplete, as OpenAI's do."""

    _HEAD = re.compile(r'\{"name": ("(?:[^"\\]|\\.)*"), "arguments": ')

    def __init__(self, choice: ToolChoice) -> None:
        self.named = choice.choice if choice.named else None
        self.text = ""
        self.pos = 0  # characters scanned
        self.depth = 0
        self.in_string = False
        self.escaped = False
        self.item: int | None = None  # where the open array item begins
        self.args_at: int | None = None  # where its arguments begin (once its name is known)
        self.sent = 0  # characters of text sent as arguments

    def feed(self, delta: str) -> list[tuple[str, Any]]:
        self.text += delta
        if self.named is not None:
            events: list[tuple[str, Any]] = []
            if self.args_at is None:
                self.args_at = 0
                events.append(("call", ParsedCall(self.named, "")))
            return events + self._args(len(self.text))
        return self._scan()

    def finish(self) -> list[tuple[str, Any]]:
        return self.feed("")

    def _args(self, upto: int) -> list[tuple[str, Any]]:
        if upto <= self.sent:
            return []
        piece, self.sent = self.text[self.sent : upto], upto
        return [("args", piece)]

    def _scan(self) -> list[tuple[str, Any]]:
        events: list[tuple[str, Any]] = []
        while self.pos < len(self.text):
            c = self.text[self.pos]
            if self.in_string:
                if self.escaped:
                    self.escaped = False
                elif c == "\\":
                    self.escaped = True
                elif c == '"':
                    self.in_string = False
            elif c == '"':
                self.in_string = True
            elif c in "[{":
                self.depth += 1
                if self.depth == 2 and c == "{":
                    self.item, self.args_at = self.pos, None
            elif c in "]}":
                if self.depth == 2 and c == "}" and self.item is not None:
                    events += self._open_item(self.pos)
                    if self.args_at is not None:
                        events += self._args(self.pos)
                    self.item = self.args_at = None
                self.depth -= 1
            self.pos += 1
        if self.item is not None:
            events += self._open_item(len(self.text))
            if self.args_at is not None:
                events += self._args(len(self.text))
        return events

    def _open_item(self, upto: int) -> list[tuple[str, Any]]:
        """Announce the open item's call once its name is complete."""
        if self.args_at is not None or self.item is None:
            return []
        m = self._HEAD.match(self.text, self.item, upto)
        if m is None:
            return []
        self.args_at = m.end()
        self.sent = self.args_at
        return [("call", ParsedCall(json.loads(m.group(1)), ""))]


def forced_params(state: ServerState, choice: ToolChoice, params: SamplingParams) -> SamplingParams:
    """``params`` constrained to the forced reply's schema (compiled now: 400 naming the tool whose
    parameters do not compile); 400 when the request already has another constraint."""
    if params.structured_outputs is not None:
        raise bad_request(
            f'tool_choice "{choice.choice}" constrains the output; it cannot be combined with response_format '
            "or structured_outputs",
            "tool_choice",
        )
    try:  # a schema refused as it is read (a $ref loop: ValueError) or as it compiles (GrammarError)
        spec = StructuredOutputs(json=choice.schema())
        state.grammars.compile(spec)
    except ValueError as e:
        for i, tool in enumerate(choice.tools):  # name the tool at fault when one alone does not compile
            try:
                state.grammars.compile(StructuredOutputs(json=choice.parameters(tool["function"]["name"])))
            except ValueError as each:
                where = f"tools[{i}].function.parameters"
                raise bad_request(f"{where}: {each}", where) from None
        raise bad_request(f"tools: {e}", "tools") from None
    try:
        return replace(params, structured_outputs=spec)
    except ValueError as e:  # a combination the engine refuses (min_tokens)
        raise bad_request(str(e), str(e).split(" ", 1)[0]) from None
