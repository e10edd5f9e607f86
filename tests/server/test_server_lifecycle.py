"""Server limits and lifecycle on real `glassbox serve` processes: --api-key (401), --max-queue-len (429 with
Retry-After), and SIGTERM (503 for new work, in-flight requests finish or are aborted, exit within 10 s); both servers
post-process with --async-output (the CUDA default) to cover its aborts and drain."""

from __future__ import annotations

import os
import signal
import threading
import time
from pathlib import Path
from typing import Any

import httpx
import openai
import pytest
from server_harness import (  # noqa: F401  (fixtures)
    MODEL_NAME,
    ServerProcess,
    server_factory,
    sse_events,
    start_server,
    tiny_model,
)

KEY = "sekret-key"


@pytest.fixture(scope="module")
def guarded(
    tiny_model: Path,  # noqa: F811
    server_factory: list[ServerProcess],  # noqa: F811
    tmp_path_factory: pytest.TempPathFactory,
) -> ServerProcess:
    s = start_server(
        tiny_model,
        tmp_path_factory.mktemp("logs"),
        "--api-key",
        KEY,
        "--max-queue-len",
        "0",
        "--max-num-seqs",
        "1",
        "--num-kv-blocks",
        "128",
        "--async-output",  # the CUDA default, here on the CPU: aborts and drains with text work pending
    )
    server_factory.append(s)
    return s


def test_api_key(guarded: ServerProcess) -> None:
    good = openai.OpenAI(base_url=f"{guarded.url}/v1", api_key=KEY, max_retries=0)
    assert [m.id for m in good.models.list().data] == [MODEL_NAME]
    bad = openai.OpenAI(base_url=f"{guarded.url}/v1", api_key="wrong", max_retries=0)
    with pytest.raises(openai.AuthenticationError):
        bad.completions.create(model=MODEL_NAME, prompt="hi", max_tokens=2)
    for path in ("/v1/models", "/v1/completions", "/v1/chat/completions", "/tokenize"):
        r = httpx.request("GET" if path == "/v1/models" else "POST", guarded.url + path, json={})
        assert r.status_code == 401, (path, r.text)
        assert r.json()["error"]["code"] == "invalid_api_key", (path, r.text)
        assert r.json()["error"]["type"] == "invalid_request_error", (path, r.text)  # OpenAI's type for it
        assert "access-control-allow-origin" not in r.headers  # CORS is off without --allowed-origins
    assert httpx.get(f"{guarded.url}/health").status_code == 200  # probes and scrapes need no key
    assert httpx.get(f"{guarded.url}/metrics").status_code == 200
    assert good.completions.create(model=MODEL_NAME, prompt="hi", max_tokens=2).choices[0].text is not None
    # the dashboard: the page holds no data and is open; its data needs the key, which a browser's
    # EventSource can only send as the page's cookie or ?api_key= (a Bearer header works too)
    assert httpx.get(f"{guarded.url}/dashboard").status_code == 200
    for path in ("/dashboard/events", "/dashboard/plan"):
        for wrong in (
            {},
            {"params": {"api_key": "wrong"}},
            {"headers": {"Cookie": "glassbox_api_key=wrong"}},
        ):
            r = httpx.get(guarded.url + path, **wrong)  # type: ignore[arg-type]
            assert r.status_code == 401, (path, wrong, r.text)
            assert (
                r.json()["error"]["code"] == "invalid_api_key" and "api_key" in r.json()["error"]["message"]
            )
    keyed: list[dict[str, Any]] = [
        {"headers": {"Authorization": f"Bearer {KEY}"}},
        {"headers": {"Cookie": f"glassbox_api_key={KEY}"}},
        {"params": {"api_key": KEY}},
    ]
    for given in keyed:
        with httpx.stream("GET", f"{guarded.url}/dashboard/events", **given) as r:
            assert r.status_code == 200, given
            assert next(r.iter_lines()) == "event: hello"
    r = httpx.get(f"{guarded.url}/v1/models", params={"api_key": KEY})  # only the dashboard takes it so
    assert r.status_code == 401


def test_queue_full_is_429_with_retry_after(guarded: ServerProcess) -> None:
    headers = {"Authorization": f"Bearer {KEY}"}
    body = {"prompt": "a long one", "max_tokens": 900, "ignore_eos": True, "stream": True}
    with httpx.Client(base_url=guarded.url, headers=headers, timeout=30) as c:
        for _attempt in range(3):
            with c.stream("POST", "/v1/completions", json=body) as first:
                assert first.status_code == 200  # in flight: the one slot is taken, the queue (0) is full
                r = c.post("/v1/completions", json={"prompt": "hi", "max_tokens": 2})
                if r.status_code == 200:  # only if the first one finished meanwhile (a very loaded machine)
                    assert "data: [DONE]" in list(first.iter_lines())
                    continue
                assert r.status_code == 429 and int(r.headers["Retry-After"]) >= 1, r.text
                assert r.json()["error"]["type"] == "rate_limit_error"
                break
        else:
            pytest.fail("the first request never stayed in flight long enough")
        deadline = time.monotonic() + 3  # the disconnect aborted the first request; the slot frees at once
        while (r := c.post("/v1/completions", json={"prompt": "hi", "max_tokens": 2})).status_code == 429:
            assert time.monotonic() < deadline
            time.sleep(0.05)
        assert r.status_code == 200


def _children(pid: int) -> list[int]:
    kids = []
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                stat = Path(f"/proc/{entry}/stat").read_text()
            except OSError:
                continue
            if int(stat.rsplit(")", 1)[1].split()[1]) == pid:
                kids.append(int(entry))
    return kids


def test_sigterm_drains_and_exits(tiny_model: Path, tmp_path: Path) -> None:  # noqa: F811
    s = start_server(
        tiny_model,
        tmp_path,
        "--max-num-seqs",
        "4",
        "--num-kv-blocks",
        "256",
        "--shutdown-timeout",
        "1",
        "--async-output",
    )
    results: dict[str, list[Any]] = {}
    ready = threading.Barrier(15)
    running = threading.Event()  # the short request has its first token: it runs, the others queue after it

    def stream(name: str, max_tokens: int) -> None:
        body = {"prompt": f"story {name}", "max_tokens": max_tokens, "ignore_eos": True, "stream": True}
        lines: list[str] = []
        try:
            with httpx.stream("POST", f"{s.url}/v1/completions", json=body, timeout=30) as r:
                assert r.status_code == 200
                it = r.iter_lines()
                while name == "short" and not running.is_set():
                    lines.append(next(it))
                    if lines[-1].startswith("data:"):
                        running.set()
                ready.wait(10)  # the response has started: the request is queued or running
                lines.extend(it)
        except httpx.HTTPError as e:
            lines.append(f"error: {e!r}")
        results[name] = sse_events(iter(x for x in lines if not x.startswith("error")))

    threads = [threading.Thread(target=stream, args=("short", 40), daemon=True)]
    threads += [threading.Thread(target=stream, args=(f"long{i}", 1000), daemon=True) for i in range(13)]
    threads[0].start()
    assert running.wait(20), "the short request never started"
    for t in threads[1:]:
        t.start()
    try:
        ready.wait(20)  # every request is in flight (4 running, 10 waiting)
        time.sleep(0.2)
        kids = _children(s.proc.pid)
        t0 = time.monotonic()
        s.proc.send_signal(signal.SIGTERM)
        time.sleep(0.2)
        late = httpx.post(f"{s.url}/v1/completions", json={"prompt": "hi", "max_tokens": 2}, timeout=5)
        assert late.status_code == 503 and late.json()["error"]["type"] == "service_unavailable_error"
        s.proc.wait(10)
        took = time.monotonic() - t0
    finally:
        s.stop()
    assert took < 10, s.log()
    assert s.proc.returncode == 0, s.log()
    for t in threads:
        t.join(5)
    reasons = {}
    for name, events in results.items():
        assert events, name
        finals = [
            e["choices"][0]["finish_reason"]
            for e in events
            if isinstance(e, dict) and e.get("choices") and e["choices"][0]["finish_reason"]
        ]
        if events[-1] == "[DONE]":  # finished in time: one finish reason, an OpenAI one
            assert len(finals) == 1 and finals[0] in ("length", "stop"), (name, finals)
            reasons[name] = finals[0]
        else:  # aborted: no made-up finish_reason, an error event as OpenAI streams one, and no [DONE]
            last = events[-1]
            assert not finals and isinstance(last, dict), (name, events[-3:])
            assert last["error"]["type"] == "service_unavailable_error", (name, last)
            reasons[name] = "aborted"
    assert len(reasons) == 14 and reasons["short"] == "length"
    assert "aborted" in reasons.values()
    assert not [k for k in kids if Path(f"/proc/{k}").exists()], "orphan processes left behind"
    print(f"SIGTERM: exit in {took:.2f} s; finish reasons {sorted(reasons.values())}")
