"""The server the API-dialect tests share (Anthropic, Ollama, Responses: tests/server/test_server_anthropic.py,
test_server_ollama.py, test_server_responses.py): a tiny random llama with 32K positions whose chat
template renders tools, tool calls and tool results Hermes-style and opens a reasoning block only when
asked (``enable_thinking``), served with the Hermes tool parser, the qwen3 reasoning parser and an API key.

The tiny model's text is noise; the tests check shapes, token counts and constraints, and use forced
tool choices and grammars where they need well-formed output. No tests here.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from server_harness import MODEL_NAME, ServerProcess, start_server

API_KEY = "dialect-secret"
MAX_MODEL_LEN = 32768  # room for a Claude-Code-sized tool list (~20K tokens)
NUM_KV_BLOCKS = 2600  # 41600 token slots of 16

# Hermes-style: the tools listed, calls as <tool_call> JSON, results as tool turns; the reply opens
# <think> only with enable_thinking (else an empty, closed block: the reasoning parser reads content)
TEMPLATE = (
    "{%- if tools %}{{ '<|system|>You may call:\\n' }}{%- for tool in tools %}{{ tool | tojson }}{{ '\\n' }}"
    "{%- endfor %}{{ '<|eot|>' }}{%- endif %}"
    "{%- for message in messages %}"
    "{%- if message.role == 'assistant' and message.tool_calls %}{{ '<|assistant|>' + message.content }}"
    "{%- for call in message.tool_calls %}{{ '<tool_call>' }}"
    "{{ {'name': call.function.name, 'arguments': call.function.arguments} | tojson }}{{ '</tool_call>' }}"
    "{%- endfor %}{{ '<|eot|>' }}"
    "{%- elif message.role == 'tool' %}{{ '<|tool|>' + message.content + '<|eot|>' }}"
    "{%- else %}{{ '<|' + message.role + '|>' + message.content + '<|eot|>' }}{%- endif %}"
    "{%- endfor %}{%- if add_generation_prompt %}{{ '<|assistant|>' }}"
    "{%- if enable_thinking is defined and enable_thinking %}{{ '<think>' }}{%- else %}{{ '<think></think>' }}"
    "{%- endif %}{%- endif %}"
)

WEATHER_TOOL: dict[str, Any] = {
    "name": "get_weather",
    "description": "The weather in a city",
    "parameters": {
        "type": "object",
        "properties": {"city": {"type": "string", "maxLength": 8}, "unit": {"enum": ["c", "f"]}},
        "required": ["city", "unit"],
        "additionalProperties": False,
    },
}


def build_dialect_model(root: Path) -> Path:
    """The tiny llama (32K positions) with TEMPLATE as its chat template."""
    from tiny_models import build_tiny_model

    model = build_tiny_model("llama", root, seed=37, max_position_embeddings=MAX_MODEL_LEN)
    config_path = model / "tokenizer_config.json"
    config = json.loads(config_path.read_text())
    if config.get("chat_template") != TEMPLATE:
        config_path.write_text(json.dumps({**config, "chat_template": TEMPLATE}))
    return model


def start_dialect_server(log_dir: Path) -> ServerProcess:
    model = build_dialect_model(log_dir.parent / "dialect-models")
    return start_server(
        model,
        log_dir,
        "--max-model-len",
        str(MAX_MODEL_LEN),
        "--num-kv-blocks",
        str(NUM_KV_BLOCKS),
        "--max-num-seqs",
        "4",
        "--enable-auto-tool-choice",
        "--tool-call-parser",
        "hermes",
        "--reasoning-parser",
        "qwen3",
        "--api-key",
        API_KEY,
    )


def claude_code_tools(n: int = 16) -> list[dict[str, Any]]:
    """A tool list the size of Claude Code's (~20K tokens of the test tokenizer's): ``n`` tools with long
    descriptions and nested schemas, each with cache_control on the last."""
    words = "read write edit search list files directories patterns replace run commands output ".split()
    tools = []
    for i in range(n):
        text = " ".join(words[(i + k) % len(words)] for k in range(160))
        schema = {
            "type": "object",
            "properties": {
                f"arg_{j}": {"type": "string", "description": f"argument {j} of tool {i}: " + text[:200]}
                for j in range(4)
            },
            "required": ["arg_0"],
        }
        tools.append({"name": f"tool_{i}", "description": text, "input_schema": schema})
    tools[-1]["cache_control"] = {"type": "ephemeral"}
    return tools


__all__ = ["API_KEY", "MODEL_NAME", "WEATHER_TOOL", "claude_code_tools", "start_dialect_server"]
