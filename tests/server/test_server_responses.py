"""OpenAI's Responses API (POST /v1/responses, GET and DELETE /v1/responses/{id}) on a real `glassbox
serve`, through the official openai client (responses.create, responses.stream, previous_response_id) and
raw HTTP for the event sequence and the error shapes.

The server is tests/helpers/dialect_server.py's (a tiny random model, a tool-rendering template, Hermes tools,
qwen3 reasoning, an API key). Its text is noise: replies are compared streamed against whole at greedy,
function arguments and JSON against their schemas (jsonschema) at temperature 1, prompts against the
chat door's /tokenize of the same conversation."""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Any

import httpx
import jsonschema
import openai
import pytest
from dialect_server import API_KEY, MODEL_NAME, WEATHER_TOOL
from server_harness import ServerProcess

from glassbox.server.responses_store import ResponseStore, StoredResponse

FUNCTION = {"type": "function", **WEATHER_TOOL}
OFF = {"enable_thinking": False}  # the chat door's rendering of a request without reasoning
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
def client(server: ServerProcess) -> openai.OpenAI:
    return openai.OpenAI(base_url=f"{server.url}/v1", api_key=API_KEY, max_retries=0, timeout=120)


@pytest.fixture(scope="module")
def http(server: ServerProcess) -> Iterator[httpx.Client]:
    with httpx.Client(base_url=server.url, timeout=120, headers={"Authorization": f"Bearer {API_KEY}"}) as c:
        yield c


def _count(http: httpx.Client, messages: list[dict[str, Any]], **kw: Any) -> int:
    r = http.post("/tokenize", json={"messages": messages, "chat_template_kwargs": OFF, **kw})
    assert r.status_code == 200, r.text
    return int(r.json()["count"])


def test_create_retrieve_and_continue(client: openai.OpenAI, http: httpx.Client) -> None:
    first = client.responses.create(
        model=MODEL_NAME, instructions="Be brief.", input="Hello there", max_output_tokens=6, temperature=0
    )
    assert first.id.startswith("resp_") and first.object == "response" and first.status == "incomplete"
    assert first.incomplete_details is not None and first.incomplete_details.reason == "max_output_tokens"
    (message,) = first.output
    assert message.type == "message" and message.id.startswith("msg_") and first.output_text
    usage = first.usage
    assert usage is not None and usage.output_tokens == 6
    turn1 = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Hello there"}]
    assert usage.input_tokens == _count(http, turn1) == first.model_extra["metrics"]["prompt_tokens"]  # type: ignore[index]
    assert client.responses.retrieve(first.id).output_text == first.output_text
    # the stored conversation continues; the earlier instructions are not carried over (OpenAI's rule)
    second = client.responses.create(
        model=MODEL_NAME, previous_response_id=first.id, input="And then?", max_output_tokens=4, temperature=0
    )
    assert second.previous_response_id == first.id
    turn2 = [
        turn1[1],
        {"role": "assistant", "content": first.output_text},
        {"role": "user", "content": "And then?"},
    ]
    assert second.usage is not None and second.usage.input_tokens == _count(http, turn2)


def test_stream_events_and_the_final_response(client: openai.OpenAI, http: httpx.Client) -> None:
    kw: dict[str, Any] = dict(model=MODEL_NAME, input="Tell me more", max_output_tokens=300, temperature=0)
    kw |= {"text": {"format": {"type": "json_schema", "name": "weather", "schema": SCHEMA, "strict": True}}}
    whole = client.responses.create(**kw)
    assert whole.status == "completed"
    jsonschema.validate(json.loads(whole.output_text), SCHEMA)
    with client.responses.stream(**kw) as stream:
        types = [event.type for event in stream]
        final = stream.get_final_response()
    assert final.output_text == whole.output_text and final.status == "completed"
    assert types[:4] == [
        "response.created",
        "response.in_progress",
        "response.output_item.added",
        "response.content_part.added",
    ]
    assert types[-4:] == [
        "response.output_text.done",
        "response.content_part.done",
        "response.output_item.done",
        "response.completed",
    ]
    assert set(types[4:-4]) == {"response.output_text.delta"}
    with http.stream("POST", "/v1/responses", json={**kw, "stream": True}) as r:
        data = [json.loads(line[6:]) for line in r.iter_lines() if line.startswith("data: ")]
    assert [d["sequence_number"] for d in data] == list(range(len(data)))
    assert data[-1]["response"]["metrics"]["output_tokens"] == data[-1]["response"]["usage"]["output_tokens"]


def test_function_calls_and_their_outputs(client: openai.OpenAI, http: httpx.Client) -> None:
    """Forced calls follow the schema (hosted tools in the list are left out); a function_call_output
    after previous_response_id reaches the template as a tool turn; namespaced functions keep their
    namespace."""
    tools: Any = [FUNCTION, {"type": "web_search"}]
    kw: dict[str, Any] = dict(model=MODEL_NAME, input="Weather in Paris?", tools=tools, temperature=1.0)
    for choice in ("required", {"type": "function", "name": "get_weather"}):
        r = client.responses.create(
            **kw, tool_choice=choice, parallel_tool_calls=False, max_output_tokens=200
        )
        (call,) = r.output
        assert (
            call.type == "function_call"
            and call.name == "get_weather"
            and call.id
            and call.id.startswith("fc_")
        )
        jsonschema.validate(json.loads(call.arguments), WEATHER_TOOL["parameters"])
    with client.responses.stream(**kw, tool_choice="required", max_output_tokens=200) as stream:
        types = [event.type for event in stream]
        streamed = stream.get_final_response()
    assert (
        "response.function_call_arguments.delta" in types and "response.function_call_arguments.done" in types
    )
    assert all(o.type == "function_call" for o in streamed.output)
    answer = client.responses.create(
        model=MODEL_NAME,
        previous_response_id=r.id,
        input=[{"type": "function_call_output", "call_id": call.call_id, "output": "21 C"}],
        tools=tools,
        tool_choice="none",
        max_output_tokens=3,
    )
    history = [
        {"role": "user", "content": "Weather in Paris?"},
        {
            "role": "assistant",
            "content": "",
            "tool_calls": [
                {
                    "id": call.call_id,
                    "type": "function",
                    "function": {"name": call.name, "arguments": call.arguments},
                }
            ],
        },
        {"role": "tool", "tool_call_id": call.call_id, "content": "21 C"},
    ]
    tools_openai = [{"type": "function", "function": WEATHER_TOOL}]
    assert answer.usage is not None and answer.usage.input_tokens == _count(http, history, tools=tools_openai)
    namespace: Any = {
        "type": "namespace",
        "name": "weather",
        "description": "weather tools",
        "tools": [FUNCTION],
    }
    r = client.responses.create(
        model=MODEL_NAME,
        input="Weather?",
        tools=[namespace],
        tool_choice="required",
        max_output_tokens=200,
        temperature=1.0,
    )
    assert r.output[0].type == "function_call" and r.output[0].namespace == "weather"


def test_reasoning_items(client: openai.OpenAI, http: httpx.Client) -> None:
    r = client.responses.create(
        model=MODEL_NAME, input="Think.", reasoning={"effort": "low"}, max_output_tokens=8, temperature=0
    )
    # the template opened <think> and the noise never closes it: all of it is reasoning
    (item,) = r.output
    assert item.type == "reasoning" and item.id.startswith("rs_") and item.content and item.content[0].text
    assert r.usage is not None and r.usage.output_tokens_details.reasoning_tokens > 0
    with http.stream(
        "POST",
        "/v1/responses",
        json={
            "model": MODEL_NAME,
            "input": "Think.",
            "reasoning": {"effort": "low"},
            "max_output_tokens": 8,
            "temperature": 0,
            "stream": True,
        },
    ) as s:
        data = [json.loads(line[6:]) for line in s.iter_lines() if line.startswith("data: ")]
    deltas = [d["delta"] for d in data if d["type"] == "response.reasoning_text.delta"]
    assert "".join(deltas) == item.content[0].text
    assert data[-1]["type"] == "response.incomplete"


def test_store_false_delete_and_the_bounded_store(client: openai.OpenAI) -> None:
    kept = client.responses.create(model=MODEL_NAME, input="Hi", max_output_tokens=2)
    unkept = client.responses.create(model=MODEL_NAME, input="Hi", max_output_tokens=2, store=False)
    with pytest.raises(openai.NotFoundError):
        client.responses.retrieve(unkept.id)
    with pytest.raises(openai.BadRequestError) as e:
        client.responses.create(model=MODEL_NAME, input="Hi", previous_response_id=unkept.id)
    assert e.value.body["param"] == "previous_response_id"  # type: ignore[index]
    client.responses.delete(kept.id)
    with pytest.raises(openai.NotFoundError):
        client.responses.retrieve(kept.id)
    with pytest.raises(openai.NotFoundError):
        client.responses.delete(kept.id)
    store = ResponseStore(max_entries=3, max_chars=10**6)
    for i in range(5):
        store.put(
            f"r{i}",
            StoredResponse(
                {"id": f"r{i}"}, [{"role": "user", "content": str(i)}], f"r{i - 1}" if i else None
            ),
        )
    assert list(store.entries) == ["r2", "r3", "r4"]
    with pytest.raises(KeyError, match="r1"):
        store.conversation("r4")  # its chain reaches a dropped response
    small = ResponseStore(max_entries=10, max_chars=200)
    small.put("a", StoredResponse({"id": "a"}, [{"role": "user", "content": "x" * 150}], None))
    small.put("b", StoredResponse({"id": "b"}, [{"role": "user", "content": "y" * 150}], "a"))
    assert list(small.entries) == ["b"] and small.chars <= 200


BAD: list[tuple[str, dict[str, Any], int]] = [
    ("unknown model", {"model": "gpt-5"}, 404),
    (
        "an image part",
        {"input": [{"role": "user", "content": [{"type": "input_image", "image_url": "x"}]}]},
        400,
    ),
    ("an unknown item", {"input": [{"type": "item_reference", "id": "x"}]}, 400),
    ("a bad role", {"input": [{"role": "tool", "content": "x"}]}, 400),
    ("a call output without its id", {"input": [{"type": "function_call_output", "output": "x"}]}, 400),
    ("background", {"background": True}, 400),
    (
        "allowed_tools",
        {"tools": [FUNCTION], "tool_choice": {"type": "allowed_tools", "mode": "auto", "tools": []}},
        400,
    ),
    ("a bad format", {"text": {"format": {"type": "yaml"}}}, 400),
    (
        "a bad schema",
        {"text": {"format": {"type": "json_schema", "name": "x", "schema": {"type": "objec"}}}},
        400,
    ),
    ("max_output_tokens 0", {"max_output_tokens": 0}, 400),
    ("an unknown tool type", {"tools": [{"type": "teleport"}]}, 400),
    ("a tool type that is an object", {"tools": [{"type": {"name": "f"}}]}, 400),  # fuzzing found a 500
    ("a namespace without a list", {"tools": [{"type": "namespace", "name": "n", "tools": 3}]}, 400),
    ("auto without tools", {"tool_choice": "required"}, 400),
    ("an empty input", {"input": []}, 400),
    ("a prompt beyond the context", {"input": "word " * 40000}, 400),
    ("an unknown previous response", {"previous_response_id": "resp_nope"}, 400),
]


@pytest.mark.parametrize(("what", "change", "status"), BAD, ids=[b[0] for b in BAD])
def test_bad_input_is_a_4xx_in_openai_shape(
    http: httpx.Client, what: str, change: dict[str, Any], status: int
) -> None:
    for stream in (False, True):
        r = http.post("/v1/responses", json={"model": MODEL_NAME, "input": "Hi", **change, "stream": stream})
        assert r.status_code == status, r.text
        error = r.json()["error"]
        assert error["message"] and error["type"] == "invalid_request_error"
    for r in (http.get("/v1/responses/resp_nope"), http.delete("/v1/responses/resp_nope")):
        assert r.status_code == 404 and r.json()["error"]["code"] == "not_found"
