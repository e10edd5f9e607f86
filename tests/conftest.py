"""Test-wide: tests/ on sys.path (the helper modules), and the one server the server tests share."""

import pathlib
import sys
from collections.abc import Iterator
from typing import Any

import pytest

sys.path.insert(0, str(pathlib.Path(__file__).parent))


@pytest.fixture(scope="session")
def shared_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Any]:
    """A `glassbox serve` process on the tiny model that test_server.py and test_server_api.py share
    (flags in test_server_harness.start_shared_server); stopped when the session ends."""
    from test_server_harness import start_shared_server

    server = start_shared_server(tmp_path_factory.mktemp("shared-server-logs"))
    yield server
    server.stop()
