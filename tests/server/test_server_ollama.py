"""Ollama's API (/api/version, tags, show, ps, chat, generate; GET and HEAD /) on a real `glassbox serve`,
through Ollama's official client (`ollama`) and raw HTTP for NDJSON streams and error shapes.

The server is tests/helpers/dialect_server.py's (a tiny random model, a tool-rendering template, Hermes tools,
qwen3 reasoning, an API key, which Ollama's client sends as a Bearer header). Its text is noise: replies
are compared streamed against whole at greedy, JSON against its schema (jsonschema) at temperature 1,
prompts against the OpenAI door's /tokenize of the same conversation, timings against the anatomy."""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Any

import httpx
import jsonschema
import ollama
import pytest
from dialect_server import API_KEY, MAX_MODEL_LEN, MODEL_NAME, WEATHER_TOOL
from server_harness import ServerProcess

from glassbox.server.chat_output import ChoiceReader
from glassbox.server.ollama import _piece
from glassbox.server.reply import Blocks
from glassbox.server.tool_parsers import TOOL_PARSERS

AUTH = {"Authorization": f"Bearer {API_KEY}"}
NAME = MODEL_NAME + ":latest"
CHAT = [{"role": "user", "content": "What is the weather in Paris?"}]
GREEDY = {"temperature": 0, "num_predict": 10}
SCHEMA = {
    "type": "object",
    "properties": {
        "city": {"type": "string", "maxLength": 12},
        "celsius": {"type": "integer", "minimum": -60, "maximum": 60},
    },
    "required": ["city", "celsius"],
    "additionalProperties": False,
}


@pytest.fixture(scope="module")
def server(dialect_server: ServerProcess) -> ServerProcess:
    return dialect_server


@pytest.fixture(scope="module")
def client(server: ServerProcess) -> ollama.Client:
    return ollama.Client(host=server.url, headers=AUTH, timeout=120)


@pytest.fixture(scope="module")
def http(server: ServerProcess) -> Iterator[httpx.Client]:
    with httpx.Client(base_url=server.url, timeout=120, headers=AUTH) as c:
        yield c


def _lines(http: httpx.Client, path: str, body: dict[str, Any]) -> list[dict[str, Any]]:
    """The NDJSON objects of a streamed reply, sent without a content type as curl sends them."""
    with http.stream("POST", path, content=json.dumps(body).encode()) as r:
        assert r.status_code == 200, r.read()
        assert r.headers["content-type"].startswith("application/x-ndjson")
        return [json.loads(line) for line in r.iter_lines() if line]


def test_version_tags_show_ps(client: ollama.Client, server: ServerProcess) -> None:
    version = httpx.get(f"{server.url}/api/version").json()["version"]  # open without the key
    assert tuple(int(p) for p in version.split(".")) >= (0, 6, 4)  # VS Code Copilot's minimum
    assert httpx.head(f"{server.url}/api/version").status_code == 200
    (model,) = client.list().models
    assert model.model == NAME and model.size and model.size > 0 and model.digest
    assert (
        model.details is not None
        and model.details.family == "llama"
        and model.details.format == "safetensors"
    )
    for name in (NAME, MODEL_NAME):
        show = client.show(name)
        assert show.capabilities == ["completion", "tools", "thinking"]
        info = show.modelinfo or {}
        assert info["general.architecture"] == "llama" and info["llama.context_length"] == MAX_MODEL_LEN
        assert info["llama.embedding_length"] == 64 and info["llama.block_count"] == 2
        assert show.template and "tool_call" in show.template
    (running,) = client.ps().models
    assert running.model == NAME and running.context_length == MAX_MODEL_LEN
    assert running.size and model.size and running.size > model.size  # weights and the KV cache


def test_chat_whole_and_streamed(client: ollama.Client, http: httpx.Client) -> None:
    whole = client.chat(model=NAME, messages=CHAT, options=GREEDY, think=False)
    assert whole.message.role == "assistant" and whole.message.content and whole.done
    assert whole.done_reason == "length" and whole.eval_count == 10 and not whole.message.thinking
    pieces = list(client.chat(model=MODEL_NAME, messages=CHAT, options=GREEDY, think=False, stream=True))
    assert "".join(p.message.content or "" for p in pieces) == whole.message.content
    assert [p.done for p in pieces] == [False] * (len(pieces) - 1) + [True]
    assert pieces[-1].eval_count == 10 and pieces[-1].done_reason == "length"
    # the timings are the anatomy's, in nanoseconds; the prompt is the OpenAI door's rendering
    last = _lines(http, "/api/chat", {"model": NAME, "messages": CHAT, "options": GREEDY, "think": False})[-1]
    m = last["metrics"]
    assert last["eval_duration"] == round(m["decode_s"] * 1e9) and last["prompt_eval_duration"] == round(
        m["prefill_s"] * 1e9
    )
    assert (
        last["total_duration"] == round((m["tokenize_s"] + m["e2e_s"]) * 1e9) and last["load_duration"] == 0
    )
    assert (
        last["prompt_eval_count"] == m["prompt_tokens"]
        and last["prompt_eval_cached_count"] == m["cached_prompt_tokens"] > 0
    )
    ids = http.post(
        "/tokenize", json={"messages": CHAT, "chat_template_kwargs": {"enable_thinking": False}}
    ).json()
    assert m["prompt_tokens"] == ids["count"]


def test_generate_templated_and_raw(client: ollama.Client, http: httpx.Client) -> None:
    whole = client.generate(model=NAME, prompt="Hello", system="Be brief.", options=GREEDY, think=False)
    assert whole.response and whole.done and whole.context
    streamed = list(
        client.generate(
            model=NAME, prompt="Hello", system="Be brief.", options=GREEDY, think=False, stream=True
        )
    )
    assert "".join(p.response or "" for p in streamed) == whole.response
    messages = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Hello"}]
    prompt = http.post(
        "/tokenize", json={"messages": messages, "chat_template_kwargs": {"enable_thinking": False}}
    ).json()
    assert list(whole.context)[: prompt["count"]] == prompt["tokens"]  # context: the prompt, then the reply
    assert len(whole.context) == prompt["count"] + 10
    raw = client.generate(model=NAME, prompt="def main():", raw=True, options=GREEDY)
    assert list(raw.context)[:-10] == http.post("/tokenize", json={"prompt": "def main():"}).json()["tokens"]
    loaded = client.generate(model=NAME, keep_alive="5m")  # nothing to generate: Ollama's (pre)load
    assert loaded.done and loaded.done_reason == "load"


def test_format_schema_holds_at_temperature_1(client: ollama.Client) -> None:
    for seed in range(3):
        r = client.chat(
            model=NAME,
            messages=CHAT,
            format=SCHEMA,
            options={"temperature": 1.0, "seed": seed, "num_predict": 200},
        )
        assert r.done_reason == "stop"
        jsonschema.validate(json.loads(r.message.content or ""), SCHEMA)
    r = client.generate(
        model=NAME, prompt="Data:", format=SCHEMA, options={"temperature": 1.0, "seed": 1, "num_predict": 200}
    )
    jsonschema.validate(json.loads(r.response or ""), SCHEMA)
    # "json": any object (its strings unbounded: a noise model may not close it within num_predict)
    r = client.generate(
        model=NAME, prompt="Data:", format="json", options={"temperature": 1.0, "seed": 1, "num_predict": 8}
    )
    assert (r.response or "").startswith("{")


def test_thinking(client: ollama.Client) -> None:
    r = client.chat(model=NAME, messages=CHAT, think=True, options=GREEDY)
    # the template opened <think> and the noise never closes it: all of it is thinking
    assert r.message.thinking and not r.message.content
    pieces = list(client.chat(model=NAME, messages=CHAT, think=True, options=GREEDY, stream=True))
    assert "".join(p.message.thinking or "" for p in pieces) == r.message.thinking


def test_tools_and_tool_history_reach_the_template(client: ollama.Client, http: httpx.Client) -> None:
    tool = {"type": "function", "function": WEATHER_TOOL}
    call = {"function": {"name": "get_weather", "arguments": {"city": "Paris", "unit": "c"}}}
    history: list[Any] = [
        *CHAT,
        {"role": "assistant", "content": "", "tool_calls": [call]},
        {"role": "tool", "content": "21 C", "tool_name": "get_weather"},
    ]
    r = client.chat(model=NAME, messages=history, tools=[tool], options=GREEDY, think=False)
    assert r.done
    body = {
        "model": NAME,
        "messages": history,
        "tools": [tool],
        "options": GREEDY,
        "think": False,
        "stream": False,
    }
    prompt = http.post("/api/chat", json=body).json()["metrics"]["prompt_tokens"]
    openai_history = [
        *CHAT,
        {
            "role": "assistant",
            "content": "",
            "tool_calls": [
                {
                    "id": "call_0",
                    "type": "function",
                    "function": {
                        "name": "get_weather",
                        "arguments": json.dumps(call["function"]["arguments"]),
                    },
                }
            ],
        },
        {"role": "tool", "content": "21 C", "name": "get_weather"},
    ]
    tokens = http.post(
        "/tokenize",
        json={
            "messages": openai_history,
            "tools": [tool],
            "chat_template_kwargs": {"enable_thinking": False},
        },
    ).json()
    assert prompt == tokens["count"]
    text = http.post("/detokenize", json={"tokens": tokens["tokens"]}).json()["prompt"]
    assert (
        '<tool_call>{"name": "get_weather", "arguments": {"city": "Paris", "unit": "c"}}</tool_call>' in text
    )
    assert "<|tool|>21 C<|eot|>" in text


def test_tool_calls_read_by_the_official_client() -> None:
    """A reply's tool calls (the Hermes parser on a canned reply) in Ollama's shape, as the client reads
    them: arguments as an object, one call per block."""
    text = 'Sure.<tool_call>{"name": "get_weather", "arguments": {"city": "Paris", "unit": "c"}}</tool_call>'
    reader, blocks = ChoiceReader(None, TOOL_PARSERS["hermes"]()), Blocks()
    blocks.feed(reader.feed(text))
    blocks.feed(reader.finish())
    body = _piece(NAME, False, blocks.joined("text"), "", blocks.of("call"))
    message = ollama.ChatResponse.model_validate({**body, "done": True}).message
    assert message.content == "Sure." and message.tool_calls is not None
    (call,) = message.tool_calls
    assert call.function.name == "get_weather" and call.function.arguments == {"city": "Paris", "unit": "c"}


def test_root_answers_ollamas_probe_and_browsers(server: ServerProcess) -> None:
    r = httpx.get(server.url + "/")
    assert r.status_code == 200 and r.text == "Ollama is running"
    assert httpx.head(server.url + "/").status_code == 200
    page = httpx.get(server.url + "/", headers={"accept": "text/html,application/xhtml+xml"})
    assert "text/html" in page.headers["content-type"] and 'href="/dashboard"' in page.text


BAD: list[tuple[str, str, dict[str, Any], int]] = [  # what, path, body, status
    ("unknown model", "/api/chat", {"model": "llama3:8b", "messages": CHAT}, 404),
    ("no model", "/api/chat", {"messages": CHAT}, 400),
    ("a bad role", "/api/chat", {"model": NAME, "messages": [{"role": "bot", "content": "x"}]}, 400),
    ("an image", "/api/chat", {"model": NAME, "messages": [{**CHAT[0], "images": ["aGk="]}]}, 400),
    ("a bad option", "/api/chat", {"model": NAME, "messages": CHAT, "options": {"temperature": "hot"}}, 400),
    ("num_predict 0", "/api/chat", {"model": NAME, "messages": CHAT, "options": {"num_predict": 0}}, 400),
    ("a bad format", "/api/chat", {"model": NAME, "messages": CHAT, "format": "yaml"}, 400),
    ("a bad schema", "/api/chat", {"model": NAME, "messages": CHAT, "format": {"type": "objec"}}, 400),
    (
        "a bad tool",
        "/api/chat",
        {"model": NAME, "messages": CHAT, "tools": [{"type": "function", "function": {"name": "a b"}}]},
        400,
    ),
    ("a bad think", "/api/chat", {"model": NAME, "messages": CHAT, "think": "max"}, 400),
    (
        "a prompt beyond the context",
        "/api/chat",
        {"model": NAME, "messages": [{"role": "user", "content": "word " * 40000}]},
        400,
    ),
    ("a suffix", "/api/generate", {"model": NAME, "prompt": "x", "suffix": "y"}, 400),
    ("a template", "/api/generate", {"model": NAME, "prompt": "x", "template": "{{ .Prompt }}"}, 400),
    (
        "context outside the vocabulary",
        "/api/generate",
        {"model": NAME, "prompt": "x", "context": [10**6]},
        400,
    ),
    ("show an unknown model", "/api/show", {"model": "nope"}, 404),
    ("pull", "/api/pull", {"model": NAME}, 404),
]


@pytest.mark.parametrize(("what", "path", "body", "status"), BAD, ids=[b[0] for b in BAD])
def test_bad_input_is_a_4xx_in_ollama_shape(
    http: httpx.Client, what: str, path: str, body: dict[str, Any], status: int
) -> None:
    for stream in (False, True):
        r = http.post(path, content=json.dumps({**body, "stream": stream}).encode())
        assert r.status_code == status, r.text
        assert set(r.json()) == {"error"} and isinstance(r.json()["error"], str) and r.json()["error"]


def test_errors_through_the_client_and_the_key(client: ollama.Client, server: ServerProcess) -> None:
    with pytest.raises(ollama.ResponseError) as e:
        client.chat(model="llama3:8b", messages=CHAT)
    assert e.value.status_code == 404 and "not found" in e.value.error
    keyless = ollama.Client(host=server.url)
    with pytest.raises(ollama.ResponseError) as e:
        keyless.list()
    assert e.value.status_code == 401 and "API key" in e.value.error
    for r in (
        httpx.post(f"{server.url}/api/chat", content=b"{oops", headers=AUTH),
        httpx.get(f"{server.url}/api/chat", headers=AUTH),
    ):
        assert r.status_code in (400, 405) and set(r.json()) == {"error"}
