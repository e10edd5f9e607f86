"""One model's engine in its own process: a `glassbox serve` child on 127.0.0.1 that the router forwards to.

The child is the single-model server unchanged (every API dialect, its metrics, dashboard and drain);
its output goes to a log file whose last lines explain a failed start. On Linux the child gets SIGTERM
when the router dies (PR_SET_PDEATHSIG), so no engine outlives its router. Torch-free.
"""

from __future__ import annotations

import asyncio
import ctypes
import logging
import os
import signal
import socket
import sys
import time
from pathlib import Path

import httpx

logger = logging.getLogger(__name__)

PR_SET_PDEATHSIG = 1
LOG_TAIL_LINES = 12


class LoadFailed(Exception):
    """A model's process did not come up (it exited, or did not answer in time); the message says why."""


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _die_with_parent() -> None:  # runs in the child between fork and exec
    if sys.platform.startswith("linux"):
        try:
            ctypes.CDLL(None).prctl(PR_SET_PDEATHSIG, signal.SIGTERM)
        except (OSError, AttributeError):
            pass


def describe_exit(code: int | None) -> str:
    if code is None:
        return "is running"
    if code < 0:
        try:
            return f"was killed by {signal.Signals(-code).name}"
        except ValueError:
            return f"was killed by signal {-code}"
    return f"exited with code {code}"


class ModelProcess:
    """A `glassbox serve MODEL` child on its own port (start, health, RSS, stop)."""

    def __init__(self, name: str, argv: list[str], log_path: Path, env: dict[str, str]) -> None:
        self.name = name
        self.port = free_port()
        self.argv = [*argv, "--host", "127.0.0.1", "--port", str(self.port)]
        self.log_path = log_path
        self.env = env
        self.url = f"http://127.0.0.1:{self.port}"
        self.proc: asyncio.subprocess.Process | None = None
        self.stopping = False  # the router asked it to stop: its exit is no crash

    @property
    def pid(self) -> int | None:
        return self.proc.pid if self.proc is not None else None

    @property
    def returncode(self) -> int | None:
        return self.proc.returncode if self.proc is not None else None

    async def start(self, client: httpx.AsyncClient, timeout_s: float) -> None:
        """Spawn the child and wait until its /health answers 200; LoadFailed (the child stopped) if it
        exits first or does not answer within ``timeout_s``."""
        self.log_path.parent.mkdir(parents=True, exist_ok=True)
        with open(self.log_path, "ab") as log:
            self.proc = await asyncio.create_subprocess_exec(
                *self.argv, stdout=log, stderr=asyncio.subprocess.STDOUT, env=self.env,
                preexec_fn=_die_with_parent,
            )  # fmt: skip
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            if self.proc.returncode is not None:
                raise LoadFailed(f"its process {describe_exit(self.proc.returncode)}: {self.log_tail()}")
            try:
                if (await client.get(self.url + "/health", timeout=2.0)).status_code == 200:
                    return
            except httpx.HTTPError:
                pass
            await asyncio.sleep(0.1)
        await self.stop(5.0)
        raise LoadFailed(
            f"it did not answer within {timeout_s:.0f} s (--model-load-timeout): {self.log_tail()}"
        )

    async def stop(self, timeout_s: float) -> None:
        """SIGTERM (the child drains its requests for its --shutdown-timeout), then SIGKILL."""
        self.stopping = True
        proc = self.proc
        if proc is None or proc.returncode is not None:
            return
        proc.send_signal(signal.SIGTERM)
        try:
            await asyncio.wait_for(proc.wait(), timeout_s)
        except asyncio.TimeoutError:
            logger.warning("model %s did not stop in %.0f s: killing it", self.name, timeout_s)
            proc.kill()
            await proc.wait()

    def rss(self) -> int | None:
        """Resident bytes of the child (Linux /proc), or None."""
        if self.proc is None or self.proc.returncode is not None:
            return None
        try:
            for line in Path(f"/proc/{self.proc.pid}/status").read_text().splitlines():
                if line.startswith("VmRSS:"):
                    return int(line.split()[1]) * 1024
        except (OSError, ValueError):
            return None
        return None

    def log_tail(self) -> str:
        """The child's last log lines (where its error is), on one line."""
        try:
            lines = self.log_path.read_text(errors="replace").splitlines()
        except OSError:
            return "(no log)"
        tail = [x.strip() for x in lines[-LOG_TAIL_LINES:] if x.strip()]
        errors = [x for x in tail if "error" in x.lower()]
        return " | ".join(errors[-3:] or tail[-3:]) or "(empty log)"


def child_env(api_key: str | None) -> dict[str, str]:
    """The child's environment: the router's, with the API key passed here rather than on its command line."""
    env = {k: v for k, v in os.environ.items() if k != "GLASSBOX_API_KEY"}
    if api_key:
        env["GLASSBOX_API_KEY"] = api_key
    env.setdefault("PYTHONUNBUFFERED", "1")
    return env
