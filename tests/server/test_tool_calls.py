"""Tool calling and reasoning content in /v1/chat/completions.

The parsers read canned model outputs in each format (plain text, one call, two calls, malformed JSON)
whole and piece by piece (through the stream chunks a client sees, reassembled as the openai client does);
the chat history's tool calls are rendered the way transformers renders them (its apply_chat_template
on the same template is the reference); and a real `glassbox serve` on a tiny random model sampled at
temperature 1.0 (its free text is noise) returns forced calls valid against their schemas (jsonschema),
streamed and not, through the official openai client."""

from __future__ import annotations

import json
import random
import shutil
from pathlib import Path
from typing import Any

import httpx
import jsonschema
import pytest
from openai import OpenAI
from server_harness import (  # noqa: F401  (fixtures)
    MODEL_NAME,
    ServerProcess,
    server_factory,
    sse_events,
    start_server,
    tiny_model,
)

from glassbox.server.chat_output import ChoiceReader, choice_chunks
from glassbox.server.chat_prompt import render_chat
from glassbox.server.errors import ApiError
from glassbox.server.protocol import ChatMessage
from glassbox.server.reasoning import REASONING_PARSERS
from glassbox.server.serve_cli import REASONING_PARSER_NAMES, TOOL_PARSER_NAMES
from glassbox.server.tool_parsers import TOOL_PARSERS
from glassbox.server.tools import ToolChoice, check_tools
from glassbox.tokenizer.hf_tokenizer import Tokenizer

WEATHER = {"city": "Paris", "unit": "c"}
SUM = {"a": 2, "b": [1, {"x": "}{"}]}
# parser: (plain text, one call, two calls, malformed); the calls are get_weather(WEATHER), add(SUM)
CANNED = {
    "hermes": (
        "Paris is sunny today.",
        'Let me look.\n<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris", "unit": "c"}}\n</tool_call>',
        '<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris", "unit": "c"}}\n</tool_call>\n'
        '<tool_call>\n{"name": "add", "arguments": {"a": 2, "b": [1, {"x": "}{"}]}}\n</tool_call>',
        '<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris", </tool_call>',
    ),
    "llama3_json": (
        "It is {sunny} in Paris.",
        '{"name": "get_weather", "parameters": {"city": "Paris", "unit": "c"}}',
        '<|python_tag|>{"name": "get_weather", "parameters": {"city": "Paris", "unit": "c"}}; '
        '{"name": "add", "parameters": {"a": 2, "b": [1, {"x": "}{"}]}}',
        '{"name": "get_weather", "parameters": {"city": "Paris", "unit": "c"}',
    ),
    "mistral": (
        "Paris is sunny [today].",
        'Sure. [TOOL_CALLS][{"name": "get_weather", "arguments": {"city": "Paris", "unit": "c"}}]',
        '[TOOL_CALLS]get_weather{"city": "Paris", "unit": "c"}[TOOL_CALLS]add{"a": 2, "b": [1, {"x": "}{"}]}',
        '[TOOL_CALLS][{"name": "get_weather", "arguments": {"city": "Paris", "unit": "c"}]',
    ),
}
CONTENT_BEFORE = {"hermes": "Let me look.\n", "llama3_json": None, "mistral": "Sure. "}


def _stream(reader: ChoiceReader, text: str, seed: int) -> list[dict[str, Any]]:
    """The chunks a client gets for ``text`` arriving in random pieces (1 to 4 characters)."""
    rng, chunks, i = random.Random(seed), [], 0
    head = {"id": "x", "object": "chat.completion.chunk", "created": 0, "model": "m"}
    while i < len(text):
        j = min(len(text), i + rng.randint(1, 4))
        chunks += choice_chunks(head, 0, reader, text[i:j], None, None, None)
        i = j
    return chunks + choice_chunks(head, 0, reader, "", None, "stop", None)


def _assemble(chunks: list[dict[str, Any]]) -> dict[str, Any]:
    """A streamed message put together as the openai client does: text concatenated, tool call deltas
    merged by index (the first carries id, type and name)."""
    msg: dict[str, Any] = {"content": "", "reasoning_content": "", "tool_calls": [], "finish_reason": None}
    for chunk in chunks:
        for choice in chunk["choices"]:
            delta = choice["delta"]
            msg["content"] += delta.get("content") or ""
            msg["reasoning_content"] += delta.get("reasoning_content") or ""
            for call in delta.get("tool_calls") or []:
                calls = msg["tool_calls"]
                if call["index"] == len(calls):
                    assert (
                        set(call) == {"index", "id", "type", "function"}
                        and call["function"]["arguments"] == ""
                    )
                    calls.append({"id": call["id"], "name": call["function"]["name"], "arguments": ""})
                else:
                    assert set(call) == {"index", "function"} and set(call["function"]) == {"arguments"}
                    calls[call["index"]]["arguments"] += call["function"]["arguments"]
            if choice["finish_reason"] is not None:
                assert msg["finish_reason"] is None
                msg["finish_reason"] = choice["finish_reason"]
                if msg["tool_calls"]:
                    assert delta == {}  # OpenAI's last chunk of a tool call stream
    return msg


def _calls(message: dict[str, Any]) -> list[tuple[str, Any]]:
    return [(c["function"]["name"], json.loads(c["function"]["arguments"])) for c in message["tool_calls"]]


@pytest.mark.parametrize("name", sorted(CANNED))
def test_parsers_read_their_format_whole_and_streamed(name: str) -> None:
    plain, one, two, malformed = CANNED[name]
    expected = {
        plain: (plain, []),
        one: (CONTENT_BEFORE[name], [("get_weather", WEATHER)]),
        two: (None, [("get_weather", WEATHER), ("add", SUM)]),
        malformed: (malformed, []),
    }
    for k, (text, (content, calls)) in enumerate(expected.items()):
        message = ChoiceReader(None, TOOL_PARSERS[name]()).message(text)
        assert (message["content"], _calls(message)) == (content, calls), text
        ids = [c["id"] for c in message["tool_calls"]]
        assert len(set(ids)) == len(ids) and all(i.startswith("call_") and len(i) == 29 for i in ids)
        streamed = _assemble(_stream(ChoiceReader(None, TOOL_PARSERS[name]()), text, seed=k))
        assert (streamed["content"] or None) == content
        assert [(c["name"], json.loads(c["arguments"])) for c in streamed["tool_calls"]] == calls
        assert streamed["finish_reason"] == ("tool_calls" if calls else "stop")


def test_text_that_only_looks_like_a_call_start_is_content() -> None:
    reader = ChoiceReader(None, TOOL_PARSERS["hermes"]())
    chunks = _stream(reader, "a <tool_cal b <tool", seed=0)
    assert _assemble(chunks)["content"] == "a <tool_cal b <tool"


REASONING = [  # parser, prompt, enable_thinking, output -> reasoning, content
    ("deepseek_r1", "", True, "<think>Two and two.</think>It is 4.", "Two and two.", "It is 4."),
    (
        "deepseek_r1",
        "<think>\n",
        True,
        "Two and two.\n</think>\n\nIt is 4.",
        "Two and two.\n",
        "\n\nIt is 4.",
    ),
    ("deepseek_r1", "", True, "Still thinking <thi", "Still thinking <thi", None),  # cut short: all reasoning
    ("deepseek_r1", "<think>\n\n</think>\n\n", True, "It is 4.", None, "It is 4."),  # the prompt closed it
    ("qwen3", "", True, "<think>\nHm.\n</think>\n\nIt is 4.", "\nHm.\n", "\n\nIt is 4."),
    ("qwen3", "", True, 'Hm.<tool_call>{"name": "f"}', "Hm.", '<tool_call>{"name": "f"}'),
    ("qwen3", "", False, "It is 4.", None, "It is 4."),
    ("qwen3", "", True, "No tags at all", "No tags at all", None),
]


@pytest.mark.parametrize("case", REASONING)
def test_reasoning_parsers_split_whole_and_streamed(case: tuple[Any, ...]) -> None:
    name, prompt, thinking, text, reasoning, content = case
    parser = REASONING_PARSERS[name]
    message = ChoiceReader(parser(prompt, thinking)).message(text)
    assert (message["reasoning_content"], message["content"]) == (reasoning, content)
    assert message["reasoning"] == reasoning  # vLLM's newer name
    for seed in range(3):
        streamed = _assemble(_stream(ChoiceReader(parser(prompt, thinking)), text, seed))
        assert (streamed["reasoning_content"] or None, streamed["content"] or None) == (reasoning, content)


def test_reasoning_then_a_hermes_call() -> None:
    text = '<think>Weather, so a tool.</think>\n<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris", "unit": "c"}}\n</tool_call>'
    for seed in range(3):
        reader = ChoiceReader(REASONING_PARSERS["qwen3"](""), TOOL_PARSERS["hermes"]())
        streamed = _assemble(_stream(reader, text, seed))
        assert streamed["reasoning_content"] == "Weather, so a tool."
        assert [(c["name"], json.loads(c["arguments"])) for c in streamed["tool_calls"]] == [
            ("get_weather", WEATHER)
        ]


def test_forced_replies_stream_arguments_as_they_come() -> None:
    tools = [{"type": "function", "function": {"name": n}} for n in ("get_weather", "add")]
    text = json.dumps([{"name": "get_weather", "arguments": WEATHER}, {"name": "add", "arguments": SUM}])
    for choice, named, reply, expected in (
        ("required", False, text, [("get_weather", WEATHER), ("add", SUM)]),
        ("add", True, json.dumps(SUM), [("add", SUM)]),
    ):
        forced = ToolChoice(tools, choice, named, True)
        assert _calls(ChoiceReader(None, None, forced).message(reply)) == expected
        chunks = _stream(ChoiceReader(None, None, forced), reply, seed=1)
        streamed = _assemble(chunks)
        assert [(c["name"], json.loads(c["arguments"])) for c in streamed["tool_calls"]] == expected
        assert sum(1 for c in chunks if c["choices"][0]["delta"].get("tool_calls")) > 2 * len(expected)


def test_flag_choices_name_every_parser() -> None:
    assert set(TOOL_PARSER_NAMES) == set(TOOL_PARSERS)
    assert set(REASONING_PARSER_NAMES) == set(REASONING_PARSERS)


def test_auto_without_the_flag_is_refused() -> None:
    tools = [{"type": "function", "function": {"name": "f"}}]
    with pytest.raises(ApiError, match="--enable-auto-tool-choice") as e:
        check_tools(tools, None, None, auto_enabled=False)
    assert e.value.status == 400 and e.value.param == "tool_choice"
    assert check_tools(tools, "auto", None, auto_enabled=True) is not None


# A Hermes-style template (as Qwen2.5's): the tools listed, calls as <tool_call> JSON, results as turns.
TOOL_TEMPLATE = (
    "{%- if tools %}{{ '<|system|>You may call:\\n' }}{%- for tool in tools %}{{ tool | tojson }}{{ '\\n' }}"
    "{%- endfor %}{{ '<|eot|>' }}{%- endif %}"
    "{%- for message in messages %}"
    "{%- if message.role == 'assistant' and message.tool_calls %}{{ '<|assistant|>' + message.content }}"
    "{%- for call in message.tool_calls %}{{ '<tool_call>' }}"
    "{{ {'name': call.function.name, 'arguments': call.function.arguments} | tojson }}{{ '</tool_call>' }}"
    "{%- endfor %}{{ '<|eot|>' }}"
    "{%- elif message.role == 'tool' %}{{ '<|user|><tool_response>' + message.content + '</tool_response><|eot|>' }}"
    "{%- else %}{{ '<|' + message.role + '|>' + message.content + '<|eot|>' }}{%- endif %}"
    "{%- endfor %}{%- if add_generation_prompt %}{{ '<|assistant|>' }}{%- endif %}"
)
TOOLS = [
    {
        "type": "function",
        "function": {
            "name": "get_weather",
            "description": "The weather in a city",
            "parameters": {
                "type": "object",
                "properties": {"city": {"type": "string", "maxLength": 8}, "unit": {"enum": ["c", "f"]}},
                "required": ["city", "unit"],
                "additionalProperties": False,
            },
        },
    },
    {
        "type": "function",
        "function": {
            "name": "add",
            "parameters": {
                "type": "object",
                "properties": {
                    "a": {"type": "integer", "minimum": 0, "maximum": 99},
                    "b": {"type": "integer", "minimum": -9, "maximum": 9},
                },
                "required": ["a"],
                "additionalProperties": False,
            },
        },
    },
]


def _history(arguments_as_text: bool) -> list[dict[str, Any]]:
    args: Any = json.dumps(WEATHER) if arguments_as_text else WEATHER
    call = {"id": "call_1", "type": "function", "function": {"name": "get_weather", "arguments": args}}
    return [
        {"role": "user", "content": "Weather in Paris?"},
        {"role": "assistant", "content": None if arguments_as_text else "", "tool_calls": [call]},
        {"role": "tool", "tool_call_id": "call_1", "content": "21 C and sunny"},
    ]


def test_tool_history_renders_as_transformers_renders_it(tiny_model: Path, tmp_path: Path) -> None:  # noqa: F811
    import transformers

    for name in ("tokenizer.json", "tokenizer_config.json"):
        shutil.copy(tiny_model / name, tmp_path / name)
    config = json.loads((tmp_path / "tokenizer_config.json").read_text())
    (tmp_path / "tokenizer_config.json").write_text(json.dumps({**config, "chat_template": TOOL_TEMPLATE}))
    # transformers takes the arguments as a dict; the OpenAI API sends them as JSON text, content null
    reference = transformers.AutoTokenizer.from_pretrained(tmp_path).apply_chat_template(
        _history(False), tools=TOOLS, tokenize=False, add_generation_prompt=True
    )
    chat = [ChatMessage(**m).model_dump(exclude_none=True) for m in _history(True)]
    ours, _ = render_chat(Tokenizer.from_dir(tmp_path), chat, variables={"tools": TOOLS})
    assert ours == reference
    assert "<tool_response>21 C and sunny</tool_response>" in ours and '"maxLength": 8' in ours


@pytest.fixture(scope="module")
def server(
    tiny_model: Path,  # noqa: F811
    server_factory: list[ServerProcess],  # noqa: F811
    tmp_path_factory: pytest.TempPathFactory,
) -> ServerProcess:
    flags = ("--max-num-seqs", "8", "--max-model-len", "512", "--enable-auto-tool-choice")
    s = start_server(
        tiny_model,
        tmp_path_factory.mktemp("logs"),
        *flags,
        "--tool-call-parser",
        "hermes",
        "--reasoning-parser",
        "qwen3",
    )
    server_factory.append(s)
    return s


@pytest.fixture(scope="module")
def client(server: ServerProcess) -> OpenAI:
    return OpenAI(base_url=f"{server.url}/v1", api_key="none", timeout=120)


CHAT = [{"role": "user", "content": "What is the weather in Paris?"}]
BY_NAME = {t["function"]["name"]: t["function"]["parameters"] for t in TOOLS}


def test_required_and_named_calls_follow_the_schemas(client: OpenAI) -> None:
    r = client.chat.completions.create(
        model=MODEL_NAME,
        messages=CHAT,
        tools=TOOLS,
        tool_choice="required",
        parallel_tool_calls=False,
        temperature=1.0,
        max_tokens=120,
        n=6,
        seed=11,
    )
    for choice in r.choices:
        assert choice.finish_reason == "tool_calls" and choice.message.content is None
        (call,) = choice.message.tool_calls or []
        jsonschema.validate(json.loads(call.function.arguments), BY_NAME[call.function.name])
    named = {"type": "function", "function": {"name": "add"}}
    r = client.chat.completions.create(
        model=MODEL_NAME, messages=CHAT, tools=TOOLS, tool_choice=named, temperature=1.0, max_tokens=120, n=3
    )
    for choice in r.choices:
        (call,) = choice.message.tool_calls or []
        assert call.function.name == "add" and call.type == "function" and call.id.startswith("call_")
        jsonschema.validate(json.loads(call.function.arguments), BY_NAME["add"])


def test_streamed_calls_reassemble_to_the_same_calls(server: ServerProcess, client: OpenAI) -> None:
    body = {
        "messages": CHAT,
        "tools": TOOLS,
        "tool_choice": "required",
        "temperature": 1.0,
        "max_tokens": 120,
    }
    body |= {"parallel_tool_calls": False, "seed": 5}
    whole = client.chat.completions.create(model=MODEL_NAME, **body)
    with httpx.stream(
        "POST", f"{server.url}/v1/chat/completions", json={**body, "stream": True}, timeout=60
    ) as s:
        events = sse_events(s.iter_lines())
    assert events[-1] == "[DONE]"
    streamed = _assemble([e for e in events[:-1] if isinstance(e, dict) and e.get("choices")])
    expected = [(c.function.name, c.function.arguments) for c in whole.choices[0].message.tool_calls or []]
    assert [(c["name"], c["arguments"]) for c in streamed["tool_calls"]] == expected
    assert streamed["finish_reason"] == whole.choices[0].finish_reason == "tool_calls"


def test_a_tool_result_goes_back_through_the_template(server: ServerProcess, client: OpenAI) -> None:
    first = client.chat.completions.create(
        model=MODEL_NAME,
        messages=CHAT,
        tools=TOOLS,
        tool_choice={"type": "function", "function": {"name": "get_weather"}},
        max_tokens=60,
        temperature=1.0,
    )
    message = first.choices[0].message
    call = (message.tool_calls or [])[0]
    history = [
        *CHAT,
        message.model_dump(exclude_none=True),
        {"role": "tool", "tool_call_id": call.id, "content": "21 C"},
    ]
    answer = client.chat.completions.create(
        model=MODEL_NAME, messages=history, tools=TOOLS, tool_choice="none", max_tokens=5
    )
    assert answer.choices[0].message.tool_calls in (None, [])
    ids = httpx.post(f"{server.url}/tokenize", json={"messages": history, "tools": TOOLS}).json()["tokens"]
    text = httpx.post(f"{server.url}/detokenize", json={"tokens": ids}).json()["prompt"]
    assert text.endswith("<|tool|>21 C<|eot|><|assistant|>")


def test_reasoning_is_split_from_the_content(server: ServerProcess, client: OpenAI) -> None:
    # no </think> in a random model's text: with thinking on (qwen3's default) it is all reasoning
    body = {"messages": CHAT, "max_tokens": 12, "temperature": 1.0, "seed": 9}
    off = client.chat.completions.create(
        model=MODEL_NAME, **body, extra_body={"chat_template_kwargs": {"enable_thinking": False}}
    )
    on = client.chat.completions.create(model=MODEL_NAME, **body)
    text = off.choices[0].message.content
    assert text and on.choices[0].message.content is None
    assert (
        on.choices[0].message.model_extra["reasoning_content"]
        == on.choices[0].message.model_extra["reasoning"]
        == text
    )
    with httpx.stream(
        "POST", f"{server.url}/v1/chat/completions", json={**body, "stream": True}, timeout=60
    ) as s:
        events = sse_events(s.iter_lines())
    assert (
        _assemble([e for e in events if isinstance(e, dict) and e.get("choices")])["reasoning_content"]
        == text
    )


@pytest.mark.parametrize(
    ("change", "param"),
    [
        ({"tools": [{"type": "retrieval"}]}, "tools[0]"),
        ({"tools": [{"type": "function", "function": {"name": "get weather"}}]}, "tools[0].function.name"),
        (
            {"tools": [{"type": "function", "function": {"name": "f", "parameters": {"type": "string"}}}]},
            "tools[0].function.parameters",
        ),
        (
            {
                "tools": [
                    {
                        "type": "function",
                        "function": {
                            "name": "f",
                            "parameters": {"type": "object", "properties": {"a": {"type": "integr"}}},
                        },
                    }
                ],
                "tool_choice": "required",
            },
            "tools[0].function.parameters",
        ),
        ({"tools": TOOLS + TOOLS[:1]}, "tools"),
        ({"tools": TOOLS, "tool_choice": "sometimes"}, "tool_choice"),
        ({"tools": TOOLS, "tool_choice": {"type": "function", "function": {"name": "nope"}}}, "tool_choice"),
        ({"tool_choice": "required"}, "tool_choice"),
        (
            {"tools": TOOLS, "tool_choice": "required", "response_format": {"type": "json_object"}},
            "tool_choice",
        ),
        (
            {
                "messages": [
                    {
                        "role": "assistant",
                        "content": None,
                        "tool_calls": [
                            {"id": "c", "type": "function", "function": {"name": "f", "arguments": "{oops"}}
                        ],
                    }
                ]
            },
            "messages[0].tool_calls[0].function.arguments",
        ),
        ({"chat_template_kwargs": {"tools": []}}, "chat_template_kwargs"),
    ],
)
def test_bad_tools_are_400(server: ServerProcess, change: dict[str, Any], param: str) -> None:
    r = httpx.post(
        f"{server.url}/v1/chat/completions", json={"model": MODEL_NAME, "messages": CHAT, **change}
    )
    assert r.status_code == 400, r.text
    assert r.json()["error"]["param"] == param, r.text
