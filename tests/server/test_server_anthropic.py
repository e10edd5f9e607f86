"""Anthropic's Messages API (POST /v1/messages, /v1/messages/count_tokens) on a real `glassbox serve`, through
Anthropic's official client (`anthropic`) and raw HTTP for the event sequence and the error shapes.

The server is tests/helpers/dialect_server.py's (a tiny random model, a tool-rendering template, Hermes tools,
qwen3 reasoning, an API key). Its text is noise: replies are compared stream against whole at greedy,
tool inputs against their schemas (jsonschema), prompts against the OpenAI door's /tokenize of the same
conversation."""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator, Iterator
from contextlib import aclosing
from typing import Any

import anthropic
import httpx
import jsonschema
import pytest
from dialect_server import API_KEY, MODEL_NAME, WEATHER_TOOL, claude_code_tools
from server_harness import MAX_MODEL_LEN as SHARED_MAX_MODEL_LEN
from server_harness import ServerProcess

from glassbox.server.reply import with_heartbeat

GREEDY = {"temperature": 0}  # the current SDK has no temperature argument; Claude Code still sends one
NO_THINKING: Any = {"type": "disabled"}
TOOL = {
    "name": WEATHER_TOOL["name"],
    "description": WEATHER_TOOL["description"],
    "input_schema": WEATHER_TOOL["parameters"],
}
ASK = [{"role": "user", "content": "What is the weather in Paris?"}]
SYSTEM = "You answer questions about the weather in European capitals, briefly and in plain words. " * 3


@pytest.fixture(scope="module")
def server(dialect_server: ServerProcess) -> ServerProcess:
    return dialect_server


@pytest.fixture(scope="module")
def client(server: ServerProcess) -> anthropic.Anthropic:
    return anthropic.Anthropic(base_url=server.url, api_key=API_KEY, max_retries=0, timeout=120)


@pytest.fixture(scope="module")
def http(server: ServerProcess) -> Iterator[httpx.Client]:
    with httpx.Client(base_url=server.url, timeout=120, headers={"x-api-key": API_KEY}) as c:
        yield c


def _events(http: httpx.Client, body: dict[str, Any], path: str = "/v1/messages") -> list[tuple[str, Any]]:
    """(event name, data) of a streamed reply, checking that each data's type is its event's name."""
    out = []
    with http.stream("POST", path, json={**body, "stream": True}) as r:
        assert r.status_code == 200, r.read()
        assert r.headers["content-type"].startswith("text/event-stream")
        name = None
        for line in r.iter_lines():
            if line.startswith("event: "):
                name = line[len("event: ") :]
            elif line.startswith("data: "):
                data = json.loads(line[len("data: ") :])
                assert data["type"] == name
                out.append((name, data))
    return out


def _tokenize(http: httpx.Client, messages: list[dict[str, Any]], **kw: Any) -> list[int]:
    r = http.post("/tokenize", json={"model": MODEL_NAME, "messages": messages, **kw})
    assert r.status_code == 200, r.text
    return list(r.json()["tokens"])


def test_create_and_stream_give_the_same_reply(client: anthropic.Anthropic, http: httpx.Client) -> None:
    kw: dict[str, Any] = dict(model=MODEL_NAME, max_tokens=12, system=SYSTEM, messages=ASK)
    whole = client.messages.create(**kw, thinking=NO_THINKING, extra_body=GREEDY)
    assert whole.type == "message" and whole.role == "assistant" and whole.id.startswith("msg_")
    assert [b.type for b in whole.content] == ["text"] and whole.stop_reason in ("end_turn", "max_tokens")
    assert whole.usage.output_tokens == whole.model_extra["metrics"]["output_tokens"]  # type: ignore[index]
    # the prompt is the OpenAI door's rendering of the same conversation: system first, thinking closed
    openai_prompt = _tokenize(
        http, [{"role": "system", "content": SYSTEM}, *ASK], chat_template_kwargs={"enable_thinking": False}
    )
    prompt = whole.usage.input_tokens + (whole.usage.cache_read_input_tokens or 0)
    assert prompt == len(openai_prompt) == whole.model_extra["metrics"]["prompt_tokens"]  # type: ignore[index]
    counted = client.messages.count_tokens(
        model=MODEL_NAME, system=SYSTEM, messages=ASK, thinking=NO_THINKING
    )
    assert counted.input_tokens == prompt
    with client.messages.stream(**kw, thinking=NO_THINKING, extra_body=GREEDY) as stream:
        streamed = stream.get_final_message()
    assert [b.type for b in streamed.content] == ["text"]
    assert streamed.content[0].text == whole.content[0].text  # type: ignore[union-attr]
    assert (
        streamed.stop_reason == whole.stop_reason
        and streamed.usage.output_tokens == whole.usage.output_tokens
    )
    assert (streamed.usage.cache_read_input_tokens or 0) > 0  # the same prompt again: a prefix-cache hit


def test_the_event_sequence(http: httpx.Client) -> None:
    body = {"model": MODEL_NAME, "max_tokens": 6, "messages": ASK, "thinking": NO_THINKING, **GREEDY}
    events = _events(http, body)
    names = [n for n, _ in events]
    assert names[:2] == ["message_start", "ping"] and names[-2:] == ["message_delta", "message_stop"]
    blocks = names[2:-2]
    assert blocks[0] == "content_block_start" and blocks[-1] == "content_block_stop"
    assert set(blocks[1:-1]) == {"content_block_delta"}
    start = events[0][1]["message"]
    assert start["content"] == [] and start["stop_reason"] is None and start["usage"]["input_tokens"] > 0
    delta = events[-2][1]
    assert delta["delta"]["stop_reason"] == "max_tokens" and delta["usage"]["output_tokens"] == 6
    assert delta["metrics"]["output_tokens"] == 6 and delta["metrics"]["ttft_s"] > 0
    text = "".join(d["delta"]["text"] for n, d in events if n == "content_block_delta")
    assert text and all(d["index"] == 0 for n, d in events if n.startswith("content_block"))


def test_forced_tool_use_round_trip(client: anthropic.Anthropic, http: httpx.Client) -> None:
    """A named tool and "any" give tool_use blocks valid against the schema, streamed as the SDK assembles
    them; the tool_result goes back through the chat template as the OpenAI door renders a tool turn."""
    named = {"type": "tool", "name": "get_weather"}
    first = client.messages.create(
        model=MODEL_NAME,
        max_tokens=80,
        messages=ASK,
        tools=[TOOL],
        tool_choice=named,
        extra_body=GREEDY,  # type: ignore[arg-type]
    )
    (use,) = first.content
    assert use.type == "tool_use" and use.name == "get_weather" and use.id.startswith("toolu_")
    jsonschema.validate(use.input, WEATHER_TOOL["parameters"])
    assert first.stop_reason == "tool_use"
    with client.messages.stream(
        model=MODEL_NAME,
        max_tokens=80,
        messages=ASK,
        tools=[TOOL],
        tool_choice=named,
        extra_body=GREEDY,  # type: ignore[arg-type]
    ) as stream:
        streamed = stream.get_final_message()
    assert [(b.type, b.input) for b in streamed.content] == [("tool_use", use.input)]  # type: ignore[union-attr]
    anyone = client.messages.create(
        model=MODEL_NAME,
        max_tokens=120,
        messages=ASK,
        tools=[TOOL],
        tool_choice={"type": "any", "disable_parallel_tool_use": True},
        extra_body={"temperature": 1.0},
    )
    assert [b.type for b in anyone.content] == ["tool_use"] and anyone.stop_reason == "tool_use"
    jsonschema.validate(anyone.content[0].input, WEATHER_TOOL["parameters"])  # type: ignore[union-attr]

    result = {"type": "tool_result", "tool_use_id": use.id, "content": [{"type": "text", "text": "21 C"}]}
    history: list[Any] = [
        *ASK,
        {"role": "assistant", "content": first.content},
        {"role": "user", "content": [result]},
    ]
    answer = client.messages.create(
        model=MODEL_NAME,
        max_tokens=4,
        messages=history,
        tools=[TOOL],
        tool_choice={"type": "none"},
        thinking=NO_THINKING,
    )
    assert answer.stop_reason in ("end_turn", "max_tokens") and all(b.type == "text" for b in answer.content)
    openai_history = [
        *ASK,
        {
            "role": "assistant",
            "content": "",
            "tool_calls": [
                {
                    "id": use.id,
                    "type": "function",
                    "function": {"name": use.name, "arguments": json.dumps(use.input)},
                }
            ],
        },
        {"role": "tool", "tool_call_id": use.id, "content": "21 C"},
    ]
    tokens = _tokenize(
        http,
        openai_history,
        tools=[{"type": "function", "function": WEATHER_TOOL}],
        chat_template_kwargs={"enable_thinking": False},
    )
    text = http.post("/detokenize", json={"tokens": tokens}).json()["prompt"]
    assert "<|tool|>21 C<|eot|>" in text and '"name": "get_weather"' in text
    counted = client.messages.count_tokens(
        model=MODEL_NAME, messages=history, tools=[TOOL], thinking=NO_THINKING
    )
    assert counted.input_tokens == len(tokens) == answer.model_extra["metrics"]["prompt_tokens"]  # type: ignore[index]


def test_thinking_blocks_from_the_reasoning_parser(client: anthropic.Anthropic, http: httpx.Client) -> None:
    thinking: Any = {"type": "enabled", "budget_tokens": 1024}
    m = client.messages.create(
        model=MODEL_NAME, max_tokens=8, messages=ASK, thinking=thinking, extra_body=GREEDY
    )
    # the template opened <think> and the noise never closes it: all of it is reasoning
    assert [b.type for b in m.content] == ["thinking"] and m.content[0].thinking  # type: ignore[union-attr]
    events = _events(
        http, {"model": MODEL_NAME, "max_tokens": 8, "messages": ASK, "thinking": thinking, **GREEDY}
    )
    start = next(d for n, d in events if n == "content_block_start")
    assert start["content_block"] == {"type": "thinking", "thinking": "", "signature": ""}
    deltas = [d["delta"] for n, d in events if n == "content_block_delta"]
    assert {d["type"] for d in deltas} == {"thinking_delta"}
    assert "".join(d["thinking"] for d in deltas) == m.content[0].thinking  # type: ignore[union-attr]


def test_stop_sequences_and_prefill(client: anthropic.Anthropic, http: httpx.Client) -> None:
    kw: dict[str, Any] = dict(model=MODEL_NAME, messages=ASK, thinking=NO_THINKING, extra_body=GREEDY)
    text = client.messages.create(max_tokens=24, **kw).content[0].text  # type: ignore[union-attr]
    # a two-character ASCII stop string whose first occurrence is past the reply's start
    stops = [
        text[i : i + 2]
        for i in range(2, len(text) - 2)
        if text[i : i + 2].isascii() and text[i : i + 2].strip()
    ]
    stop = next(s for s in stops if text.index(s) >= 2)
    stopped = client.messages.create(max_tokens=24, stop_sequences=[stop], **kw)
    assert stopped.stop_reason == "stop_sequence" and stopped.stop_sequence == stop
    assert stopped.content[0].text == text[: text.index(stop)]  # type: ignore[union-attr]
    # a last assistant turn is continued (the OpenAI door's continue_final_message), not answered anew
    prefill = [*ASK, {"role": "assistant", "content": "The weather"}]
    cont = client.messages.create(model=MODEL_NAME, max_tokens=3, messages=prefill, thinking=NO_THINKING)
    assert [b.type for b in cont.content] == ["text"]
    continued = _tokenize(
        http, prefill, continue_final_message=True, chat_template_kwargs={"enable_thinking": False}
    )
    assert cont.model_extra["metrics"]["prompt_tokens"] == len(continued)  # type: ignore[index]


def test_a_claude_code_request(client: anthropic.Anthropic) -> None:
    """What Claude Code sends: ?beta=true (the SDK's beta resource), anthropic-beta, a system prompt in
    blocks with cache_control, ~20K tokens of tools, its own ctx/msg roles, metadata, a streamed reply."""
    tools = claude_code_tools()
    system: Any = [
        {"type": "text", "text": "You are a coding agent.", "cache_control": {"type": "ephemeral"}}
    ]
    messages: Any = [
        {"role": "ctx", "content": "<env>cwd: /repo</env>"},
        {
            "role": "user",
            "content": [{"type": "text", "text": "List the files.", "cache_control": {"type": "ephemeral"}}],
        },
    ]
    kw: dict[str, Any] = dict(model=MODEL_NAME, system=system, messages=messages, tools=tools)
    counted = client.beta.messages.count_tokens(**kw).input_tokens
    assert counted > 20000
    headers = {"anthropic-beta": "claude-code-20250219,interleaved-thinking-2025-05-14"}
    with client.beta.messages.stream(
        max_tokens=4, **kw, metadata={"user_id": "u1"}, extra_headers=headers, extra_body=GREEDY
    ) as stream:
        reply = stream.get_final_message()
    assert reply.usage.input_tokens + (reply.usage.cache_read_input_tokens or 0) == counted
    as_msg = [{"role": "msg", "content": "List the files."}]
    assert client.messages.count_tokens(model=MODEL_NAME, messages=as_msg).input_tokens > 0


def test_max_tokens_is_cut_to_the_room_left(shared_server: ServerProcess) -> None:
    """Claude Code asks for 32000 tokens whatever the model's context: the reply runs until the context is
    full (stop_reason model_context_window_exceeded), where the OpenAI door answers 400."""
    client = anthropic.Anthropic(base_url=shared_server.url, api_key="none", max_retries=0, timeout=120)
    long = [{"role": "user", "content": "Tell me a story." + " word" * 120}]
    prompt = client.messages.count_tokens(model=MODEL_NAME, messages=long).input_tokens
    room = SHARED_MAX_MODEL_LEN - prompt
    assert 0 < room < 400
    cut = client.messages.create(
        model=MODEL_NAME, max_tokens=32000, messages=long, extra_body={"ignore_eos": True}
    )
    assert cut.stop_reason == "model_context_window_exceeded" and cut.usage.output_tokens == room
    exact = client.messages.create(
        model=MODEL_NAME, max_tokens=room, messages=long, extra_body={"ignore_eos": True}
    )
    assert exact.stop_reason == "max_tokens" and exact.usage.output_tokens == room


def test_the_api_key_as_x_api_key_or_bearer(server: ServerProcess) -> None:
    kw: dict[str, Any] = dict(model=MODEL_NAME, max_tokens=2, messages=ASK)
    bearer = anthropic.Anthropic(base_url=server.url, auth_token=API_KEY, max_retries=0)
    assert bearer.messages.create(**kw).stop_reason is not None
    wrong = anthropic.Anthropic(base_url=server.url, api_key="wrong", max_retries=0)
    with pytest.raises(anthropic.AuthenticationError) as e:
        wrong.messages.create(**kw)
    assert e.value.status_code == 401 and e.value.body["error"]["type"] == "authentication_error"  # type: ignore[index]


def _prompt_of(tokens: int) -> str:
    return "word " * tokens


BAD: list[tuple[str, dict[str, Any], int, str]] = [  # what, body change, status, Anthropic's error type
    ("no max_tokens", {"max_tokens": None}, 400, "invalid_request_error"),
    ("max_tokens 0", {"max_tokens": 0}, 400, "invalid_request_error"),
    ("unknown model", {"model": "claude-opus-4-1"}, 404, "not_found_error"),
    ("a system role", {"messages": [{"role": "system", "content": "x"}]}, 400, "invalid_request_error"),
    ("no messages", {"messages": []}, 400, "invalid_request_error"),
    (
        "an image",
        {"messages": [{"role": "user", "content": [{"type": "image", "source": {}}]}]},
        400,
        "invalid_request_error",
    ),
    (
        "a server tool",
        {"tools": [{"type": "web_search_20250305", "name": "web_search"}]},
        400,
        "invalid_request_error",
    ),
    (
        "an unknown named tool",
        {"tools": [TOOL], "tool_choice": {"type": "tool", "name": "nope"}},
        400,
        "invalid_request_error",
    ),
    (
        "a bad tool schema",
        {"tools": [{**TOOL, "input_schema": {"type": "string"}}], "tool_choice": {"type": "any"}},
        400,
        "invalid_request_error",
    ),
    ("a tool name with a space", {"tools": [{**TOOL, "name": "get weather"}]}, 400, "invalid_request_error"),
    ("a negative temperature", {"temperature": -1}, 400, "invalid_request_error"),
    ("a bad thinking type", {"thinking": {"type": "sometimes"}}, 400, "invalid_request_error"),
    ("a bad output format", {"output_config": {"format": {"type": "yaml"}}}, 400, "invalid_request_error"),
    (
        "a tool_result without its id",
        {"messages": [{"role": "user", "content": [{"type": "tool_result"}]}]},
        400,
        "invalid_request_error",
    ),
    ("a lone surrogate", {"messages": [{"role": "user", "content": "\ud800"}]}, 400, "invalid_request_error"),
    (
        "a prompt beyond the context",
        {"messages": [{"role": "user", "content": _prompt_of(40000)}]},
        400,
        "invalid_request_error",
    ),
]


@pytest.mark.parametrize(("what", "change", "status", "kind"), BAD, ids=[b[0] for b in BAD])
def test_bad_input_is_a_4xx_in_anthropic_shape(
    http: httpx.Client, what: str, change: dict[str, Any], status: int, kind: str
) -> None:
    body = {"model": MODEL_NAME, "max_tokens": 4, "messages": ASK, **change}
    body = {k: v for k, v in body.items() if v is not None}
    for stream in (False, True):
        data = json.dumps({**body, "stream": stream})  # ASCII: a lone surrogate travels as its escape
        r = http.post("/v1/messages?beta=true", content=data, headers={"content-type": "application/json"})
        assert r.status_code == status, r.text
        err = r.json()
        assert err["type"] == "error" and err["error"]["type"] == kind and err["error"]["message"], err
    if what == "a prompt beyond the context":
        assert err["error"]["message"].startswith("prompt is too long: ")


def test_malformed_bodies_and_wrong_methods(http: httpx.Client, server: ServerProcess) -> None:
    for r in (
        http.post("/v1/messages", content=b"{not json", headers={"content-type": "application/json"}),
        http.post("/v1/messages/count_tokens", json={"model": MODEL_NAME}),
        http.get("/v1/messages"),
        httpx.post(f"{server.url}/v1/messages", json={"model": MODEL_NAME, "max_tokens": 1, "messages": ASK}),
    ):
        assert 400 <= r.status_code < 500, r.text
        assert r.json()["type"] == "error" and r.json()["error"]["message"]
    client = anthropic.Anthropic(base_url=server.url, api_key=API_KEY, max_retries=0)
    with pytest.raises(anthropic.BadRequestError):
        client.messages.create(
            model=MODEL_NAME, max_tokens=4, messages=[{"role": "user", "content": _prompt_of(40000)}]
        )


def test_pings_while_the_reply_is_waited_for() -> None:
    """The stream's keep-alive: a None (a ping) each interval without output, the items in order, and the
    reply's own generator closed (its request aborted) when the stream is."""
    closed: list[bool] = []

    async def slow(delays: list[float]) -> AsyncIterator[int]:
        try:
            for i, d in enumerate(delays):
                await asyncio.sleep(d)
                yield i
        finally:
            closed.append(True)

    async def collect() -> list[int | None]:
        return [x async for x in with_heartbeat(slow([0.25, 0.0, 0.25]), 0.04)]

    out = asyncio.run(collect())
    assert [x for x in out if x is not None] == [0, 1, 2] and out.count(None) >= 2 and closed == [True]

    async def leave_early() -> None:
        async with aclosing(with_heartbeat(slow([5.0]), 0.02)) as beats:
            async for beat in beats:
                assert beat is None
                break

    closed.clear()
    asyncio.run(leave_early())
    assert closed == [True]
