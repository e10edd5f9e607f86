"""Anthropic's Messages API request (``POST /v1/messages``) and its translation into the chat request the
OpenAI door runs (server/chat.py), so that both are checked, limited and generated alike.

- ``system`` (a string or text blocks) becomes the first message; ``messages`` keep their order, a user
  turn's ``tool_result`` blocks becoming ``tool`` messages before its text, an assistant turn's ``tool_use``
  blocks its ``tool_calls``. ``thinking`` and ``redacted_thinking`` blocks sent back are dropped (the chat
  template sees the answers, as OpenAI's door does). Roles ``ctx`` and ``msg`` (Claude Code) count as user.
- A last assistant turn with text is a prefill: the reply continues it (``continue_final_message``).
- ``tools`` (client tools: ``name``, ``description``, ``input_schema``) become functions; ``tool_choice``
  ``auto``, ``any`` (OpenAI's "required"), ``tool`` (a named function) and ``none``;
  ``disable_parallel_tool_use`` is ``parallel_tool_calls: false``. Server tools (web search, code
  execution, ...) are refused: nothing here runs them.
- ``thinking``: ``enabled`` and ``adaptive`` set the chat template's ``enable_thinking`` to true,
  ``disabled`` to false (no ``thinking``: the template's default). ``budget_tokens`` is accepted and not
  enforced: ``max_tokens`` bounds reasoning and answer together.
- ``output_config.format`` (a JSON schema) is enforced by the grammar engine like ``response_format``;
  ``output_config.effort`` reaches the template as ``reasoning_effort``.
- ``cache_control`` anywhere, ``metadata``, ``service_tier`` and other fields are accepted; the prefix
  cache reuses shared prompt prefixes on its own.
- Images, documents and other non-text blocks are refused with a 400 naming the block.
"""

from __future__ import annotations

import json
from typing import Any

from pydantic import Field, ValidationError

from glassbox.server.errors import bad_request, unsupported
from glassbox.server.protocol import ChatCompletionRequest, _Body, _Request

_USER_ROLES = ("user", "ctx", "msg")  # ctx and msg: Claude Code's own roles for context it adds
_DROPPED = ("thinking", "redacted_thinking")
_CLIENT_TOOL_TYPES = (None, "custom")


class AnthropicMessage(_Request):
    role: str
    content: str | list[dict[str, Any]]


class MessagesRequest(_Body):
    """POST /v1/messages (fields not listed are accepted and ignored)."""

    model: str
    messages: list[AnthropicMessage] = Field(min_length=1)
    max_tokens: int = Field(ge=1, description="cut to the room the prompt leaves in the context")
    system: str | list[dict[str, Any]] | None = None
    stop_sequences: list[str] | None = None
    temperature: float | None = None
    top_p: float | None = None
    top_k: int | None = None
    stream: bool = False
    metadata: dict[str, Any] | None = None
    tools: list[dict[str, Any]] | None = None
    tool_choice: dict[str, Any] | None = None
    thinking: dict[str, Any] | None = Field(None, description="budget_tokens is accepted, not enforced")
    output_config: dict[str, Any] | None = Field(None, description="format (a JSON schema), effort")
    ignore_eos: bool = Field(False, description="glassbox's extra (vLLM's): generate until max_tokens")


class CountTokensRequest(_Body):
    """POST /v1/messages/count_tokens: the prompt fields of a Messages request."""

    model: str
    messages: list[AnthropicMessage] = Field(min_length=1)
    system: str | list[dict[str, Any]] | None = None
    tools: list[dict[str, Any]] | None = None
    tool_choice: dict[str, Any] | None = None
    thinking: dict[str, Any] | None = None
    output_config: dict[str, Any] | None = None


def chat_request(req: MessagesRequest | CountTokensRequest) -> ChatCompletionRequest:
    """The chat request that ``req`` means; 400 (naming the field) for what cannot be translated."""
    messages = _system(req.system) + _messages(req.messages)
    last = messages[-1]
    prefill = last["role"] == "assistant" and not last.get("tool_calls") and bool(last.get("content"))
    body: dict[str, Any] = {"model": req.model, "messages": messages}
    if prefill:
        body["continue_final_message"] = True
    kwargs: dict[str, Any] = {}
    tools = _tools(req.tools)
    if tools is not None:
        body["tools"] = tools
        body |= _tool_choice(req.tool_choice, [t["function"]["name"] for t in tools])
    elif req.tool_choice is not None and req.tool_choice.get("type") not in ("auto", "none"):
        raise bad_request("tool_choice needs tools: give the tools to choose from", "tool_choice")
    if req.thinking is not None:
        kind = req.thinking.get("type")
        if kind not in ("enabled", "disabled", "adaptive"):
            raise bad_request(
                f'thinking.type must be "enabled", "disabled" or "adaptive", got {kind!r}', "thinking"
            )
        kwargs["enable_thinking"] = kind != "disabled"
    if req.output_config is not None:
        body |= _output_config(req.output_config, kwargs)
    if kwargs:
        body["chat_template_kwargs"] = kwargs
    if isinstance(req, MessagesRequest):
        body |= {
            "max_tokens": req.max_tokens,
            "stop": req.stop_sequences,
            "temperature": req.temperature,
            "top_p": req.top_p,
            "top_k": req.top_k,
            "stream": req.stream,
            "ignore_eos": req.ignore_eos,
        }
        user = (req.metadata or {}).get("user_id")
        if isinstance(user, str):
            body["user"] = user
    try:
        return ChatCompletionRequest.model_validate(body)
    except ValidationError as e:
        first = e.errors()[0]
        where = ".".join(str(p) for p in first.get("loc", ()))
        raise bad_request(f"{where}: {first.get('msg', 'invalid value')}", where or None) from None


def _text(block: dict[str, Any], where: str) -> str:
    text = block.get("text")
    if not isinstance(text, str):
        raise bad_request(f"{where}.text must be a string", f"{where}.text")
    return text


def _system(system: str | list[dict[str, Any]] | None) -> list[dict[str, Any]]:
    if system is None:
        return []
    if isinstance(system, str):
        return [{"role": "system", "content": system}] if system else []
    parts = []
    for j, block in enumerate(system):
        if block.get("type") != "text":
            raise bad_request(f"system[{j}] must be a text block", f"system[{j}]")
        parts.append(_text(block, f"system[{j}]"))
    return [{"role": "system", "content": "\n\n".join(parts)}] if parts else []


def _messages(messages: list[AnthropicMessage]) -> list[dict[str, Any]]:
    out: list[dict[str, Any]] = []
    for i, m in enumerate(messages):
        where = f"messages[{i}]"
        if m.role in _USER_ROLES:
            out += _user_turn(m.content, where)
        elif m.role == "assistant":
            out.append(_assistant_turn(m.content, where))
        else:
            raise bad_request(
                f'{where}.role must be "user" or "assistant" (the system prompt goes in system), '
                f"got {m.role!r}",
                f"{where}.role",
            )
    return out


def _blocks(content: str | list[dict[str, Any]]) -> list[dict[str, Any]]:
    return [{"type": "text", "text": content}] if isinstance(content, str) else content


def _user_turn(content: str | list[dict[str, Any]], where: str) -> list[dict[str, Any]]:
    """Tool results as ``tool`` messages (in order), then the turn's text as one user message."""
    results: list[dict[str, Any]] = []
    texts: list[dict[str, Any]] = []
    for j, block in enumerate(_blocks(content)):
        at = f"{where}.content[{j}]"
        kind = block.get("type")
        if kind == "text":
            texts.append({"type": "text", "text": _text(block, at)})
        elif kind == "tool_result":
            call_id = block.get("tool_use_id")
            if not isinstance(call_id, str):
                raise bad_request(f"{at}.tool_use_id must be a string", f"{at}.tool_use_id")
            results.append({"role": "tool", "tool_call_id": call_id, "content": _result_text(block, at)})
        elif kind not in _DROPPED:
            raise _unsupported_block(kind, at)
    if not texts:
        return results or [{"role": "user", "content": ""}]
    return results + [{"role": "user", "content": texts}]


def _result_text(block: dict[str, Any], where: str) -> str:
    content = block.get("content", "")
    if isinstance(content, str):
        text = content
    elif isinstance(content, list):
        parts = []
        for k, part in enumerate(content):
            at = f"{where}.content[{k}]"
            if not isinstance(part, dict) or part.get("type") != "text":
                raise _unsupported_block(part.get("type") if isinstance(part, dict) else None, at)
            parts.append(_text(part, at))
        text = "\n".join(parts)
    else:
        raise bad_request(f"{where}.content must be a string or text blocks", f"{where}.content")
    return f"Error: {text}" if block.get("is_error") is True else text


def _assistant_turn(content: str | list[dict[str, Any]], where: str) -> dict[str, Any]:
    texts: list[str] = []
    calls: list[dict[str, Any]] = []
    for j, block in enumerate(_blocks(content)):
        at = f"{where}.content[{j}]"
        kind = block.get("type")
        if kind == "text":
            texts.append(_text(block, at))
        elif kind == "tool_use":
            name, call_id, args = block.get("name"), block.get("id"), block.get("input", {})
            if not isinstance(name, str) or not isinstance(call_id, str) or not isinstance(args, dict):
                raise bad_request(f"{at} must be a tool_use block {{id, name, input: {{...}}}}", at)
            arguments = json.dumps(args, ensure_ascii=False)
            calls.append(
                {"id": call_id, "type": "function", "function": {"name": name, "arguments": arguments}}
            )
        elif kind not in _DROPPED:
            raise _unsupported_block(kind, at)
    message: dict[str, Any] = {"role": "assistant", "content": "".join(texts)}
    if calls:
        message["tool_calls"] = calls
    return message


def _unsupported_block(kind: Any, where: str) -> Exception:
    if kind in ("image", "document"):
        return unsupported(f"{where}: {kind} blocks are not supported (the model reads text)", where)
    return unsupported(
        f"{where}: content blocks of type {kind!r} are not supported (text, tool_use, tool_result, "
        "thinking are)",
        where,
    )


def _tools(tools: list[dict[str, Any]] | None) -> list[dict[str, Any]] | None:
    if not tools:
        return None
    out = []
    for i, tool in enumerate(tools):
        where = f"tools[{i}]"
        if tool.get("type") not in _CLIENT_TOOL_TYPES:
            raise unsupported(
                f"{where}: tools of type {tool.get('type')!r} run on Anthropic's servers, not here; define "
                "it as a client tool {name, description, input_schema}",
                where,
            )
        fn: dict[str, Any] = {"name": tool.get("name")}
        if tool.get("description") is not None:
            fn["description"] = tool["description"]
        if "input_schema" in tool:
            fn["parameters"] = tool["input_schema"]
        out.append({"type": "function", "function": fn})
    return out


def _tool_choice(choice: dict[str, Any] | None, names: list[str]) -> dict[str, Any]:
    if choice is None:
        return {}
    kind = choice.get("type")
    out: dict[str, Any] = {}
    if choice.get("disable_parallel_tool_use") is True:
        out["parallel_tool_calls"] = False
    if kind in ("auto", "none"):
        out["tool_choice"] = kind
    elif kind == "any":
        out["tool_choice"] = "required"
    elif kind == "tool":
        name = choice.get("name")
        if not isinstance(name, str) or name not in names:
            raise bad_request(
                f"tool_choice.name must name one of the tools ({', '.join(names)}), got {name!r}",
                "tool_choice.name",
            )
        out["tool_choice"] = {"type": "function", "function": {"name": name}}
    else:
        raise bad_request(
            f'tool_choice.type must be "auto", "any", "tool" or "none", got {kind!r}', "tool_choice.type"
        )
    return out


def _output_config(config: dict[str, Any], kwargs: dict[str, Any]) -> dict[str, Any]:
    effort = config.get("effort")
    if effort is not None:
        kwargs["reasoning_effort"] = effort
    fmt = config.get("format")
    if fmt is None:
        return {}
    if (
        not isinstance(fmt, dict)
        or fmt.get("type") != "json_schema"
        or not isinstance(fmt.get("schema"), dict)
    ):
        raise bad_request(
            'output_config.format must be {"type": "json_schema", "schema": {...}}', "output_config.format"
        )
    return {
        "response_format": {"type": "json_schema", "json_schema": {"name": "output", "schema": fmt["schema"]}}
    }
