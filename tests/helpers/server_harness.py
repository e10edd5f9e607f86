"""Helpers for the server tests: a tiny model and a real `glassbox serve` process on a free port.

No tests here; test_server*.py import these.
"""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import httpx
import pytest

MODEL_NAME = "tiny"


@pytest.fixture(scope="session")
def tiny_model(tmp_path_factory: pytest.TempPathFactory) -> Path:
    from tiny_models import build_tiny_model

    return build_tiny_model("llama", tmp_path_factory.getbasetemp() / "server-models")


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@dataclass
class ServerProcess:
    proc: subprocess.Popen[bytes]
    url: str
    log_path: Path

    def log(self) -> str:
        return self.log_path.read_text(errors="replace")

    def health(self) -> dict[str, float]:
        return dict(httpx.get(f"{self.url}/health", timeout=5).json())

    def stop(self, timeout: float = 15.0) -> int:
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(timeout)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(5)
        return int(self.proc.returncode)


def start_server(model_dir: Path, log_dir: Path, *flags: str, timeout: float = 120.0) -> ServerProcess:
    """Start `python -m glassbox.cli serve MODEL` and wait until /health answers 200."""
    port = free_port()
    log_path = log_dir / f"server-{port}.log"
    cmd = [
        sys.executable,
        "-m",
        "glassbox.cli",
        "serve",
        str(model_dir),
        "--port",
        str(port),
        "--served-model-name",
        MODEL_NAME,
        "--device",
        "cpu",
        "--disable-uvicorn-access-log",
        "--uvicorn-log-level",
        "warning",
        *flags,
    ]
    return launch(cmd, port, log_path, {}, timeout)


def launch(
    cmd: list[str], port: int, log_path: Path, env: dict[str, str], timeout: float, what: str = "server"
) -> ServerProcess:
    """Run ``cmd`` (a server on ``port``, one OpenMP thread, ``env`` over this process's) logging to
    ``log_path``; wait until /health answers 200, else stop it and raise with its log."""
    full_env = {**os.environ, **env, "OMP_NUM_THREADS": "1", "PYTHONUNBUFFERED": "1"}
    with open(log_path, "wb") as log:
        proc = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, env=full_env)
    server = ServerProcess(proc, f"http://127.0.0.1:{port}", log_path)
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"{what} exited with {proc.returncode}:\n{server.log()}")
        try:
            if httpx.get(f"{server.url}/health", timeout=2).status_code == 200:
                return server
        except httpx.HTTPError:
            pass
        time.sleep(0.2)
    server.stop()
    raise RuntimeError(f"{what} did not come up in {timeout} s:\n{server.log()}")


# the server test_server.py and test_server_api.py share (conftest.py's session fixture: one start)
MAX_MODEL_LEN = 512
MAX_NUM_SEQS = 4
NUM_KV_BLOCKS = 160
STEP_BUDGET = 32  # --max-num-batched-tokens: a longer prompt is prefilled in chunks
ORIGIN = "http://allowed.example"  # --allowed-origins


def start_shared_server(log_dir: Path) -> ServerProcess:
    """The server conftest.py's ``shared_server`` fixture starts once per session."""
    from tiny_models import build_tiny_model

    model = build_tiny_model("llama", log_dir.parent / "server-models")
    return start_server(
        model,
        log_dir,
        "--max-num-seqs",
        str(MAX_NUM_SEQS),
        "--max-model-len",
        str(MAX_MODEL_LEN),
        "--num-kv-blocks",
        str(NUM_KV_BLOCKS),
        "--max-num-batched-tokens",
        str(STEP_BUDGET),
        "--allowed-origins",
        ORIGIN,
    )


@pytest.fixture(scope="module")
def server_factory(tmp_path_factory: pytest.TempPathFactory) -> Iterator[list[ServerProcess]]:
    """Servers started through this list are stopped (SIGTERM) when the module ends."""
    started: list[ServerProcess] = []
    yield started
    for s in started:
        s.stop()


def sse_events(lines: Iterator[str]) -> list[dict[str, object] | str]:
    """Parse server-sent event lines: each ``data: {...}`` becomes a dict, ``data: [DONE]`` the string."""
    events: list[dict[str, object] | str] = []
    for line in lines:
        if not line.startswith("data: "):
            assert line == "", f"unexpected SSE line {line!r}"
            continue
        data = line[len("data: ") :]
        events.append(data if data == "[DONE]" else json.loads(data))
    return events


def metric_value(text: str, name: str, labels: str = "") -> float:
    """A sample's value from Prometheus text (``name{labels} value``)."""
    key = f"{name}{{{labels}}}" if labels else name
    for line in text.splitlines():
        if line.startswith(key + " "):
            return float(line.split()[-1])
    raise KeyError(key)
