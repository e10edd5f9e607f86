"""OpenAI's Responses API request (``POST /v1/responses``) and its translation into the chat request the
chat door runs (server/chat.py), so that both are checked, limited and generated alike.

- ``instructions`` become the first (system) message; with ``previous_response_id`` the stored
  conversation follows (its own instructions are not carried over, as OpenAI's are not), then ``input``:
  a string (one user turn) or items: messages (``input_text`` / ``output_text`` parts; images and files
  are refused), ``function_call`` items (the assistant's calls) and ``function_call_output`` items (tool
  turns). ``reasoning`` items sent back are dropped (the template sees the answers).
- ``tools``: function tools, and the function tools inside a ``namespace`` (their calls carry it back).
  Tools that run on OpenAI's side or have no JSON schema (web_search, file_search, code_interpreter,
  image_generation, computer use, mcp, shells, apply_patch, custom freeform tools) are left out: nothing
  here runs them, and a model sees only the tools it can call. ``tool_choice`` auto, none, required or a
  named function.
- ``text.format``: text, json_object or json_schema (enforced by the grammar engine);
  ``reasoning.effort`` reaches the chat template as ``reasoning_effort``, with ``enable_thinking`` true
  (false for "none").
- ``max_output_tokens`` is cut to the room the prompt leaves; ``background`` and ``conversation`` are
  refused; ``include``, ``truncation``, ``service_tier``, ``prompt_cache_key`` and the like are accepted.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from pydantic import Field, ValidationError

from glassbox.server.errors import bad_request, unsupported
from glassbox.server.protocol import ChatCompletionRequest, _Body

# tool types that a Responses request may carry and this server leaves out (it cannot run them)
SKIPPED_TOOLS = {
    "web_search",
    "web_search_preview",
    "web_search_2025_08_26",
    "web_search_preview_2025_03_11",
    "file_search",
    "code_interpreter",
    "image_generation",
    "computer",
    "computer_use_preview",
    "mcp",
    "local_shell",
    "shell",
    "apply_patch",
    "tool_search",
    "programmatic_tool_calling",
    "custom",
}
_TEXT_PARTS = ("input_text", "output_text", "text", "refusal")


class ResponsesRequest(_Body):
    """POST /v1/responses (fields not listed are accepted and ignored)."""

    model: str
    input: str | list[dict[str, Any]] = Field(description="a user turn, or input items")
    instructions: str | None = None
    previous_response_id: str | None = None
    store: bool = True
    stream: bool = False
    background: bool = False
    conversation: str | dict[str, Any] | None = None
    max_output_tokens: int | None = Field(None, ge=1)
    temperature: float | None = None
    top_p: float | None = None
    tools: list[dict[str, Any]] | None = None
    tool_choice: str | dict[str, Any] | None = None
    parallel_tool_calls: bool | None = None
    text: dict[str, Any] | None = None
    reasoning: dict[str, Any] | None = None
    metadata: dict[str, Any] | None = None
    user: str | None = None
    ignore_eos: bool = Field(False, description="glassbox's extra (vLLM's): generate until max_output_tokens")


@dataclass
class Translation:
    """What a Responses request means: the chat request, the messages its input added (what a later
    ``previous_response_id`` replays), and each namespaced function's namespace."""

    chat: ChatCompletionRequest
    new_messages: list[dict[str, Any]]
    namespaces: dict[str, str] = field(default_factory=dict)


def translate(req: ResponsesRequest, history: list[dict[str, Any]]) -> Translation:
    """``req`` as a chat request after ``history`` (the stored conversation of previous_response_id)."""
    if req.background:
        raise unsupported("background responses are not supported", "background")
    if req.conversation is not None:
        raise unsupported("conversation is not supported (use previous_response_id)", "conversation")
    new = _input(req.input)
    system = [{"role": "system", "content": req.instructions}] if req.instructions else []
    messages = system + history + new
    if not messages:
        raise bad_request("input is empty: give a string or at least one item", "input")
    body: dict[str, Any] = {
        "model": req.model,
        "messages": messages,
        "max_tokens": req.max_output_tokens,
        "temperature": req.temperature,
        "top_p": req.top_p,
        "stream": req.stream,
        "user": req.user,
        "ignore_eos": req.ignore_eos,
    }
    tools, namespaces = _tools(req.tools)
    if tools:
        body["tools"] = tools
    if req.tool_choice is not None:
        body["tool_choice"] = _tool_choice(req.tool_choice)
    if req.parallel_tool_calls is not None:
        body["parallel_tool_calls"] = req.parallel_tool_calls
    fmt = (req.text or {}).get("format")
    if fmt is not None:
        body["response_format"] = _format(fmt)
    effort = (req.reasoning or {}).get("effort")
    if effort is not None:
        body["chat_template_kwargs"] = {"reasoning_effort": effort, "enable_thinking": effort != "none"}
    try:
        chat = ChatCompletionRequest.model_validate(body)
    except ValidationError as e:
        first = e.errors()[0]
        loc = [str(p) for p in first.get("loc", ())]
        loc[:1] = (
            [{"max_tokens": "max_output_tokens", "response_format": "text.format"}.get(loc[0], loc[0])]
            if loc
            else []
        )
        where = ".".join(loc)
        raise bad_request(f"{where}: {first.get('msg', 'invalid value')}", where or None) from None
    return Translation(chat, new, namespaces)


def _input(items: str | list[dict[str, Any]]) -> list[dict[str, Any]]:
    if isinstance(items, str):
        return [{"role": "user", "content": items}]
    out: list[dict[str, Any]] = []
    for i, item in enumerate(items):
        where = f"input[{i}]"
        kind = item.get("type", "message")
        if kind == "message":
            out.append(_message(item, where))
        elif kind == "function_call":
            call = _call(item, where)
            last = out[-1] if out else None
            if last is not None and last["role"] == "assistant":  # the turn's text, then its calls
                last.setdefault("tool_calls", []).append(call)
            else:
                out.append({"role": "assistant", "content": "", "tool_calls": [call]})
        elif kind == "function_call_output":
            call_id = item.get("call_id")
            if not isinstance(call_id, str):
                raise bad_request(f"{where}.call_id must be a string", f"{where}.call_id")
            out.append({"role": "tool", "tool_call_id": call_id, "content": _text(item.get("output"), where)})
        elif kind != "reasoning":
            raise unsupported(
                f"{where}: items of type {kind!r} are not supported (message, function_call, "
                "function_call_output and reasoning are)",
                f"{where}.type",
            )
    return out


def _message(item: dict[str, Any], where: str) -> dict[str, Any]:
    role = item.get("role")
    if role not in ("user", "assistant", "system", "developer"):
        raise bad_request(
            f'{where}.role must be "user", "assistant", "system" or "developer", got {role!r}',
            f"{where}.role",
        )
    return {"role": role, "content": _text(item.get("content"), where)}


def _text(content: Any, where: str) -> str:
    if isinstance(content, str):
        return content
    if not isinstance(content, list):
        raise bad_request(f"{where}.content must be a string or a list of text parts", f"{where}.content")
    parts = []
    for j, part in enumerate(content):
        kind = part.get("type") if isinstance(part, dict) else None
        if kind not in _TEXT_PARTS:
            raise unsupported(
                f"{where}.content[{j}]: parts of type {kind!r} are not supported (the model reads text)",
                f"{where}.content[{j}]",
            )
        text = part.get("text", part.get("refusal"))
        if not isinstance(text, str):
            raise bad_request(f"{where}.content[{j}].text must be a string", f"{where}.content[{j}].text")
        parts.append(text)
    return "".join(parts)


def _call(item: dict[str, Any], where: str) -> dict[str, Any]:
    name, call_id, arguments = item.get("name"), item.get("call_id"), item.get("arguments", "")
    if not isinstance(name, str) or not isinstance(call_id, str) or not isinstance(arguments, str):
        raise bad_request(f"{where} must be a function_call {{call_id, name, arguments (JSON text)}}", where)
    return {"id": call_id, "type": "function", "function": {"name": name, "arguments": arguments}}


def _function(tool: dict[str, Any]) -> dict[str, Any]:
    fn = {k: tool[k] for k in ("name", "description", "parameters", "strict") if tool.get(k) is not None}
    return {"type": "function", "function": fn}


def _tools(tools: list[dict[str, Any]] | None) -> tuple[list[dict[str, Any]], dict[str, str]]:
    out: list[dict[str, Any]] = []
    namespaces: dict[str, str] = {}
    for i, tool in enumerate(tools or []):
        kind = tool.get("type")
        if kind == "function":
            out.append(_function(tool))
        elif kind == "namespace":
            inner_tools = tool.get("tools")
            if not isinstance(inner_tools, list):
                raise bad_request(f"tools[{i}].tools must be a list of tools", f"tools[{i}].tools")
            for inner in inner_tools:
                if isinstance(inner, dict) and inner.get("type") == "function":
                    out.append(_function(inner))
                    namespaces[str(inner.get("name"))] = str(tool.get("name"))
        elif not isinstance(kind, str) or kind not in SKIPPED_TOOLS:
            raise unsupported(f"tools[{i}]: tools of type {kind!r} are not supported", f"tools[{i}].type")
    return out, namespaces


def _tool_choice(choice: str | dict[str, Any]) -> str | dict[str, Any]:
    if isinstance(choice, str):
        return choice  # checked by the chat path
    if choice.get("type") == "function" and isinstance(choice.get("name"), str):
        return {"type": "function", "function": {"name": choice["name"]}}
    raise unsupported(
        'tool_choice must be "auto", "none", "required" or {"type": "function", "name": ...}', "tool_choice"
    )


def _format(fmt: Any) -> dict[str, Any]:
    kind = fmt.get("type") if isinstance(fmt, dict) else None
    if kind in ("text", "json_object"):
        return {"type": kind}
    if kind == "json_schema":
        spec = {k: fmt[k] for k in ("name", "schema", "strict") if k in fmt}
        return {"type": "json_schema", "json_schema": spec}
    raise bad_request(
        f'text.format.type must be "text", "json_object" or "json_schema", got {kind!r}', "text.format"
    )


def stored_messages(
    new: list[dict[str, Any]], text: str, calls: list[tuple[str, str, str]]
) -> list[dict[str, Any]]:
    """What a stored response adds to its conversation: its input's messages, then its reply as one
    assistant turn (``calls``: call id, name, arguments)."""
    reply: dict[str, Any] = {"role": "assistant", "content": text}
    if calls:
        reply["tool_calls"] = [
            {"id": c, "type": "function", "function": {"name": n, "arguments": a}} for c, n, a in calls
        ]
    return [*new, reply]
