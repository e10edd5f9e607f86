"""Ollama's ``/api/chat`` and ``/api/generate`` requests and their translation into the requests the OpenAI
door runs (a chat request; for ``raw`` generation, a completion request), so that both are checked,
limited and generated alike.

- ``options``: ``temperature``, ``top_p``, ``top_k``, ``min_p``, ``seed``, ``stop``, ``num_predict`` (-1 and
  -2: until a stop or the context is full), ``repeat_penalty`` (repetition_penalty), ``presence_penalty``,
  ``frequency_penalty``. ``num_ctx`` is accepted and not applied: the context is the server's
  --max-model-len (the model is not reloaded per request); other runner options (num_gpu, num_thread,
  mirostat, ...) are accepted and ignored, as Ollama ignores the ones a runner lacks.
- ``format``: ``"json"`` (any JSON object) or a JSON schema, enforced by the grammar engine.
- ``think``: true or false sets the chat template's ``enable_thinking``; true needs --reasoning-parser
  (Ollama's 400 otherwise); "low" / "medium" / "high" also reach the template as ``reasoning_effort``.
- ``keep_alive`` is accepted: the one served model stays loaded.
- Images are refused (the model reads text); ``template`` and ``suffix`` (fill-in-the-middle) are refused.
"""

from __future__ import annotations

import json
from typing import Any

from pydantic import Field, ValidationError

from glassbox.server.errors import bad_request, unsupported
from glassbox.server.protocol import ChatCompletionRequest, CompletionRequest, _Body, _Request

_OPTIONS = {  # Ollama's option -> the sampling field
    "temperature": "temperature",
    "top_p": "top_p",
    "top_k": "top_k",
    "min_p": "min_p",
    "seed": "seed",
    "stop": "stop",
    "repeat_penalty": "repetition_penalty",
    "presence_penalty": "presence_penalty",
    "frequency_penalty": "frequency_penalty",
}


class OllamaMessage(_Request):
    role: str
    content: str | None = None
    images: list[Any] | None = None
    thinking: str | None = None
    tool_calls: list[dict[str, Any]] | None = None
    tool_name: str | None = None
    tool_call_id: str | None = None


class _Generation(_Body):
    model: str
    stream: bool = True
    format: str | dict[str, Any] | None = None
    options: dict[str, Any] | None = None
    keep_alive: str | float | None = Field(None, description="accepted: the served model stays loaded")
    think: bool | str | None = None
    ignore_eos: bool = Field(False, description="glassbox's extra (vLLM's): generate until num_predict")


class ChatRequest(_Generation):
    """POST /api/chat."""

    messages: list[OllamaMessage] | None = None
    tools: list[dict[str, Any]] | None = None


class GenerateRequest(_Generation):
    """POST /api/generate."""

    prompt: str | None = None
    system: str | None = None
    raw: bool = False
    context: list[int] | None = Field(None, description="token ids of an earlier reply's context")
    images: list[Any] | None = None
    template: str | None = Field(None, description="not supported: the model's chat template renders")
    suffix: str | None = Field(None, description="not supported")


def _sampling(req: _Generation, reasoning: bool) -> tuple[dict[str, Any], dict[str, Any]]:
    """(sampling fields, chat template variables) from ``options``, ``format`` and ``think``."""
    body: dict[str, Any] = {"model": req.model, "stream": req.stream, "ignore_eos": req.ignore_eos}
    options = req.options or {}
    for name, field in _OPTIONS.items():
        if options.get(name) is not None:
            body[field] = options[name]
    predict = options.get("num_predict")
    if predict is not None:
        if not isinstance(predict, int) or isinstance(predict, bool) or predict == 0 or predict < -2:
            raise bad_request(
                f"options.num_predict must be a positive number of tokens, -1 or -2, got {predict!r}",
                "options.num_predict",
            )
        if predict > 0:
            body["max_tokens"] = predict
    if req.format not in (None, ""):
        if req.format == "json":
            body["response_format"] = {"type": "json_object"}
        elif isinstance(req.format, dict):
            body["response_format"] = {
                "type": "json_schema",
                "json_schema": {"name": "format", "schema": req.format},
            }
        else:
            raise bad_request(f'format must be "json" or a JSON schema, got {req.format!r}', "format")
    kwargs: dict[str, Any] = {}
    if req.think is False:
        kwargs["enable_thinking"] = False
    elif req.think is not None:
        if not reasoning:
            raise bad_request(
                f"{req.model!r} does not support thinking (start glassbox with --reasoning-parser)"
            )
        kwargs["enable_thinking"] = True
        if isinstance(req.think, str):
            if req.think not in ("low", "medium", "high"):
                raise bad_request(f'think must be true, false, "low", "medium" or "high", got {req.think!r}')
            kwargs["reasoning_effort"] = req.think
    return body, kwargs


def chat_request(req: ChatRequest, model: str, reasoning: bool) -> ChatCompletionRequest:
    """The chat request ``req`` means (``model``: the served name ``req.model`` resolved to)."""
    body, kwargs = _sampling(req, reasoning)
    body["model"] = model
    body["messages"] = [_message(m, i) for i, m in enumerate(req.messages or [])]
    if req.tools:
        body["tools"] = req.tools
    if kwargs:
        body["chat_template_kwargs"] = kwargs
    return _validated(ChatCompletionRequest, body)


def generate_request(
    req: GenerateRequest, model: str, reasoning: bool, templated: bool
) -> ChatCompletionRequest | CompletionRequest:
    """A chat request (the prompt as the user's turn, ``system`` before it) or, for ``raw`` or a model
    without a chat template (``templated`` false), a completion request of the prompt as it is."""
    if req.images:
        raise unsupported("images are not supported (the model reads text)", "images")
    if req.template is not None:
        raise unsupported(
            "template is not supported: the model's chat template renders the prompt", "template"
        )
    if req.suffix:
        raise unsupported("suffix (fill-in-the-middle) is not supported", "suffix")
    body, kwargs = _sampling(req, reasoning)
    body["model"] = model
    if req.raw or not templated:
        return _validated(
            CompletionRequest, {**body, "prompt": req.prompt or "", "max_tokens": body.get("max_tokens")}
        )
    messages = [{"role": "system", "content": req.system}] if req.system else []
    body["messages"] = [*messages, {"role": "user", "content": req.prompt or ""}]
    if kwargs:
        body["chat_template_kwargs"] = kwargs
    return _validated(ChatCompletionRequest, body)


def _message(m: OllamaMessage, i: int) -> dict[str, Any]:
    where = f"messages[{i}]"
    if m.images:
        raise unsupported(
            f"{where}.images: images are not supported (the model reads text)", f"{where}.images"
        )
    if m.role not in ("system", "user", "assistant", "tool"):
        raise bad_request(
            f'{where}.role must be "system", "user", "assistant" or "tool", got {m.role!r}', f"{where}.role"
        )
    out: dict[str, Any] = {"role": m.role, "content": m.content or ""}
    if m.role == "assistant" and m.tool_calls:
        out["tool_calls"] = [
            _history_call(c, f"{where}.tool_calls[{j}]", j) for j, c in enumerate(m.tool_calls)
        ]
    if m.role == "tool":
        if m.tool_name:
            out["name"] = m.tool_name
        if m.tool_call_id:
            out["tool_call_id"] = m.tool_call_id
    return out


def _history_call(call: dict[str, Any], where: str, j: int) -> dict[str, Any]:
    fn = call.get("function")
    if not isinstance(fn, dict) or not isinstance(fn.get("name"), str):
        raise bad_request(f'{where} must be {{"function": {{"name", "arguments"}}}}', where)
    args = fn.get("arguments", {})
    text = args if isinstance(args, str) else json.dumps(args, ensure_ascii=False)
    call_id = call.get("id") if isinstance(call.get("id"), str) else f"call_{j}"
    return {"id": call_id, "type": "function", "function": {"name": fn["name"], "arguments": text}}


def _validated(model: type[ChatCompletionRequest] | type[CompletionRequest], body: dict[str, Any]) -> Any:
    try:
        return model.model_validate(body)
    except ValidationError as e:
        first = e.errors()[0]
        loc = [str(p) for p in first.get("loc", ())]
        if loc and loc[0] in _OPTIONS.values() or loc and loc[0] == "max_tokens":
            loc[0] = "options." + next((k for k, v in _OPTIONS.items() if v == loc[0]), "num_predict")
        where = ".".join(loc)
        raise bad_request(f"{where}: {first.get('msg', 'invalid value')}", where or None) from None
