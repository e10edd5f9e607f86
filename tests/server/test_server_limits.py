"""Request limits on a real `glassbox serve` of the bundled demo model (issue 40, items 4-6): the body
limit (413 in each dialect's shape), no stall of the event loop during 10 MB requests (the gap between
/health answers), the memory kept after large prompts, the warning for a non-loopback bind without a key,
and --special-tokens-in-user-text.

The server binds 0.0.0.0 (clients use 127.0.0.1), accepts bodies up to LIMIT and parses special tokens in
user text by default (the flag), so that each of those is seen to take effect.
"""

from __future__ import annotations

import json
import statistics
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from server_harness import ServerProcess, server_factory, start_server  # noqa: F401  (fixtures)

import glassbox
from glassbox.server.serve_cli import open_bind_warning

DEMO = Path(glassbox.__file__).parent / "demo"
LIMIT = 12 << 20  # --max-request-bytes: a 10 MB request passes, 13 MB does not
TEN_MB = 10_000_000
WARNING = "--host 0.0.0.0 without --api-key"


@pytest.fixture(scope="module")
def server(server_factory: list[ServerProcess], tmp_path_factory: pytest.TempPathFactory) -> ServerProcess:  # noqa: F811
    flags = ("--host", "0.0.0.0", "--max-request-bytes", str(LIMIT), "--special-tokens-in-user-text")
    s = start_server(DEMO, tmp_path_factory.mktemp("limits"), *flags)
    server_factory.append(s)
    return s


@pytest.fixture(scope="module")
def http(server: ServerProcess) -> Iterator[httpx.Client]:
    with httpx.Client(base_url=server.url, timeout=300) as c:
        yield c


def _post_raw(http: httpx.Client, path: str, body: bytes) -> httpx.Response:
    return http.post(path, content=body, headers={"content-type": "application/json"})


# -- 4: the body limit -----------------------------------------------------------------------------------


def test_a_body_over_the_limit_is_413_in_each_dialects_shape(http: httpx.Client) -> None:
    big = json.dumps({"prompt": "a" * (LIMIT + 1)}).encode()
    r = _post_raw(http, "/v1/completions", big)
    assert r.status_code == 413 and r.json()["error"]["code"] == "request_too_large", r.text
    assert "--max-request-bytes" in r.json()["error"]["message"]
    r = _post_raw(http, "/api/embed", big)
    assert r.status_code == 413 and set(r.json()) == {"error"}, r.text

    def chunks() -> Iterator[bytes]:  # no Content-Length: counted as it arrives
        for i in range(0, len(big), 1 << 20):
            yield big[i : i + (1 << 20)]

    r = http.post("/v1/chat/completions", content=chunks(), headers={"content-type": "application/json"})
    assert r.status_code == 413 and r.json()["error"]["code"] == "request_too_large", r.text


# -- 4: no stall of the event loop -----------------------------------------------------------------------


# The poller runs in a process of its own: the gaps are the server's, not this process's (late in the full
# suite, pytest holds gigabytes of objects and one of its own full garbage collections, which keeps the GIL
# from every thread here, takes about a second).
_POLLER = """
import sys, threading, time, httpx
stop = threading.Event()
threading.Thread(target=lambda: (sys.stdin.read(), stop.set()), daemon=True).start()
stamps = []
with httpx.Client(base_url=sys.argv[1], timeout=60) as c:
    assert c.get("/health").status_code == 200
    print("ready", flush=True)
    while not stop.is_set():
        assert c.get("/health").status_code == 200
        stamps.append(time.perf_counter())
print(" ".join(map(repr, stamps)))
"""


def _health_gaps(url: str, during: Callable[[], Any] | None, idle_s: float = 2.0) -> list[float]:
    """Gaps (s) between consecutive /health answers polled back to back (by a separate process) while
    ``during`` runs (or for ``idle_s`` with none)."""
    poller = subprocess.Popen([sys.executable, "-c", _POLLER, url], stdin=subprocess.PIPE,
                              stdout=subprocess.PIPE, text=True)  # fmt: skip
    try:
        assert poller.stdout is not None and poller.stdout.readline().strip() == "ready"
        time.sleep(0.3)
        if during is None:
            time.sleep(idle_s)
        else:
            during()
        time.sleep(0.1)
        out, _ = poller.communicate(input="", timeout=60)
    finally:
        poller.kill()
    assert poller.returncode == 0, out
    stamps = [float(x) for x in out.split()]
    return [b - a for a, b in zip(stamps, stamps[1:], strict=False)]


BIG_REQUESTS: list[tuple[str, str, Any, int]] = [
    ("text prompt", "/v1/completions", {"prompt": "hello world " * (TEN_MB // 12), "max_tokens": 1}, 400),
    (
        "chat message",
        "/v1/chat/completions",
        {"messages": [{"role": "user", "content": "ab\n" * (TEN_MB // 4)}]},
        400,
    ),
    ("token ids", "/v1/completions", {"prompt": [7] * (TEN_MB // 3)}, 400),
    ("token ids at the value cap", "/v1/completions", {"prompt": [7] * 262_000, "max_tokens": True}, 400),
    ("token ids under the value cap", "/v1/completions", {"prompt": [7] * 262_000}, 400),
    (
        "prompt at the length check",
        "/tokenize",
        {"prompt": "hello world " * 6900},
        200,
    ),  # tokenized: 82,800 chars
]


def test_large_requests_stall_no_other_request(server: ServerProcess, http: httpx.Client) -> None:
    """The event loop answers /health while each request is read, parsed, checked and tokenized.

    Bound: the largest gap between /health answers during a request is at most twice the idle baseline's
    largest gap + 100 ms. The baseline (taken in this test) is the machine's scheduling noise for one
    wake-up of the event loop; while a request is worked on, a second thread of the server wants the CPU
    and the GIL too, so an answer can wait for two wake-ups (x 2). The 100 ms is the issue's budget for
    what the request itself may hold the loop: the body arrives in 64 KiB reads; JSON over 64 KiB is parsed
    (and, over 1 MiB, validated) in a worker thread, where no single C call, which keeps the GIL, reads
    more than 1 MiB or a 16K-character window of a string (server/json_body.py); tokenization runs in a
    worker thread without the GIL; and a thread running Python code gives the GIL up every 5 ms."""
    baseline = max(_health_gaps(server.url, None))
    for name, path, body, status in BIG_REQUESTS:
        raw = json.dumps(body).encode()
        assert len(raw) >= TEN_MB or "cap" in name or status == 200
        answers: list[httpx.Response] = []
        gaps = _health_gaps(server.url, lambda r=raw, p=path, out=answers: out.append(_post_raw(http, p, r)))  # type: ignore[misc]
        assert answers[0].status_code == status, (name, answers[0].text[:300])
        assert max(gaps) <= 2 * baseline + 0.1, (
            f"{name}: /health waited {max(gaps) * 1000:.0f} ms (idle: {baseline * 1000:.0f} ms, median "
            f"{statistics.median(gaps) * 1000:.1f} ms over {len(gaps)} answers)"
        )


# -- 5: memory -------------------------------------------------------------------------------------------


def _rss_mb(server: ServerProcess) -> float:
    with open(f"/proc/{server.proc.pid}/status") as f:
        return next(int(line.split()[1]) for line in f if line.startswith("VmRSS")) / 1024


def test_rss_stays_flat_after_ten_large_prompts(server: ServerProcess, http: httpx.Client) -> None:
    """Ten prompts of 2 MB (each 400: longer than 2048 tokens can hold) grow the server's RSS by under
    64 MB: each request's own bytes (the body and its parsed text, 4 MB) might all stay in the allocator,
    40 MB; tokenizing one such prompt used to keep ~650 MB (the tokenizer's per-token allocations)."""
    if not Path(f"/proc/{server.proc.pid}/status").exists():
        pytest.skip("RSS is read from /proc")
    before = _rss_mb(server)
    for i in range(10):
        text = f"{i} the quick brown fox jumps over the lazy dog " * 45_000  # 2 MB
        r = http.post("/v1/completions", json={"prompt": text, "max_tokens": 1})
        assert r.status_code == 400 and r.json()["error"]["code"] == "context_length_exceeded", r.text
    assert _rss_mb(server) - before < 64


# -- 6 and 3: the flags ----------------------------------------------------------------------------------


def test_a_non_loopback_bind_without_a_key_warns(server: ServerProcess) -> None:
    assert WARNING in server.log()
    for host, key, warns in (("127.0.0.1", None, False), ("localhost", None, False), ("::1", None, False),
                             ("127.0.0.2", None, False), ("0.0.0.0", "k", False), ("::", None, True),
                             ("192.168.1.5", None, True), ("myhost", None, True)):  # fmt: skip
        assert (open_bind_warning(host, key) is not None) == warns, host


def test_the_server_flag_parses_special_tokens_unless_the_request_says_not(http: httpx.Client) -> None:
    import transformers

    ref = transformers.AutoTokenizer.from_pretrained(DEMO)
    prompt = "<|end_of_text|> the end"
    default = http.post("/tokenize", json={"prompt": prompt}).json()["tokens"]
    assert default == ref(prompt).input_ids and ref.eos_token_id in default
    asked = http.post("/tokenize", json={"prompt": prompt, "special_tokens_in_user_text": False}).json()
    assert asked["tokens"] == ref(prompt, split_special_tokens=True).input_ids != default
