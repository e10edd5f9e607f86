"""Schemathesis against a real server's /openapi.json: positive and negative data, >= 50 examples per
operation (no NUL characters: as vLLM's schema test), and not one 5xx. The server runs with a small body
limit and special-token parsing on, so that the request limits' paths see the fuzz too."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
from server_harness import ServerProcess, server_factory, start_server, tiny_model  # noqa: F401

ST = Path(sys.executable).with_name("st")


@pytest.mark.skipif(not ST.exists(), reason="schemathesis is not installed")
def test_schemathesis_finds_no_server_error(
    tiny_model: Path,  # noqa: F811
    server_factory: list[ServerProcess],  # noqa: F811
    tmp_path: Path,
) -> None:
    server = start_server(
        tiny_model,
        tmp_path,
        *("--max-model-len", "256", "--max-num-seqs", "8", "--num-kv-blocks", "256"),
        *("--max-request-bytes", "65536", "--special-tokens-in-user-text"),
    )
    server_factory.append(server)
    cmd = [
        str(ST),
        "run",
        f"{server.url}/openapi.json",
        "--checks",
        "not_a_server_error",
        "--mode",
        "all",
        "--max-examples",
        "50",
        "--generation-allow-x00",
        "false",
        "--workers",
        "1",
        "--seed",
        "1",
        "--generation-database",
        "none",
        "--request-timeout",
        "60",
        "--no-color",
    ]
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=600, cwd=tmp_path)
    assert proc.returncode == 0, proc.stdout[-6000:] + proc.stderr[-2000:] + server.log()[-3000:]
    assert "passed" in proc.stdout and "Operations:       13 selected" in proc.stdout
    assert "Traceback" not in server.log(), server.log()[-3000:]
