"""The multi-model server's limits (server/router.py): --max-loaded-models 1 evicts the least recently used
model, --idle-unload-seconds frees an idle one and the next request reloads it with the same greedy output
(held against transformers), and a model that does not fit beside a busy one is refused with the plan's
numbers, then loads by evicting it once it is idle. Two copies of the demo model keep the loads short
(5-15 s each on this machine's shared cores)."""

from __future__ import annotations

import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from prometheus_client.parser import text_string_to_metric_families
from router_harness import DEMO_REPO, alive, gib_after, start_router, status, wait_state
from server_harness import ServerProcess
from store_factory import add_hf_repo
from tiny_models import hf_greedy
from tokenizers import Tokenizer

from glassbox.config import EngineConfig
from glassbox.engine.device import available_ram_bytes
from glassbox.models.config_reader import facts_from_dir
from glassbox.models.sources import DEMO_MODEL_DIR, DEMO_NAME
from glassbox.perf.model_fit import footprint

LOAD_S = 180  # one load, generous for a loaded 2-core machine
IDLE_S = 4.0
PROMPT = "def main():"


def _env(root: Path) -> dict[str, str]:
    demo = {p.name: p for p in DEMO_MODEL_DIR.iterdir() if p.is_file() and p.name != "README.md"}
    add_hf_repo(root / "hf" / "hub", DEMO_REPO, demo)
    return {"HF_HOME": str(root / "hf"), "OLLAMA_MODELS": str(root / "none")}


def _unloads(server: ServerProcess) -> dict[tuple[str, str], float]:
    text = httpx.get(f"{server.url}/metrics", timeout=30).text
    family = {f.name: f for f in text_string_to_metric_families(text)}["glassbox:model_unloads"]
    return {
        (s.labels["model"], s.labels["reason"]): s.value for s in family.samples if s.name.endswith("_total")
    }


def _complete(server: ServerProcess, model: str, **extra: Any) -> httpx.Response:
    body = {"model": model, "prompt": PROMPT, "max_tokens": 10, "temperature": 0, "ignore_eos": True, **extra}
    return httpx.post(f"{server.url}/v1/completions", json=body, timeout=LOAD_S)


@pytest.fixture(scope="module")
def lru(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServerProcess]:
    root = tmp_path_factory.mktemp("router-lru")
    server = start_router(root, _env(root), "--models", f"{DEMO_REPO},{DEMO_NAME}", "--max-loaded-models", "1",
                          "--idle-unload-seconds", str(IDLE_S), "--dtype", "float32")  # fmt: skip
    yield server
    server.stop(30)


def test_lru_eviction_and_idle_unload_reload_the_same_output(lru: ServerProcess) -> None:
    tokenizer = Tokenizer.from_file(str(DEMO_MODEL_DIR / "tokenizer.json"))
    ((expected, _),) = hf_greedy(DEMO_MODEL_DIR, [tokenizer.encode(PROMPT).ids], 10)  # float32, as served
    first = _complete(lru, DEMO_REPO)  # (the reference first: IDLE_S must not pass between the requests)
    assert first.status_code == 200, first.text
    text = first.json()["choices"][0]["text"]
    assert text == tokenizer.decode(expected)
    pid = status(lru)[DEMO_REPO]["pid"]
    other = _complete(lru, DEMO_NAME)  # one model at most: the first is evicted
    assert other.status_code == 200, other.text
    now = status(lru)
    assert now[DEMO_REPO]["status"]["value"] == "unloaded" and now[DEMO_NAME]["status"]["value"] == "loaded"
    assert not alive(pid) and _unloads(lru).get((DEMO_REPO, "lru")) == 1
    idle = wait_state(lru, DEMO_NAME, "unloaded", IDLE_S + 30)  # the watcher looks every 0.25 s
    assert idle["pid"] is None and _unloads(lru).get((DEMO_NAME, "idle")) == 1
    t0 = time.monotonic()
    again = _complete(lru, DEMO_REPO)
    assert again.status_code == 200 and again.json()["choices"][0]["text"] == text
    assert 0 < again.json()["metrics"]["load_s"] <= time.monotonic() - t0  # the load, its own phase
    assert status(lru)[DEMO_REPO]["loads"] == 2


@pytest.fixture(scope="module")
def tight(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[ServerProcess, float]]:
    """Two models and room for one: a budget 1.5x one demo model's plan (its resident set is well over
    half its plan, so two never fit)."""
    root = tmp_path_factory.mktemp("router-tight")
    plan = footprint(facts_from_dir(DEMO_MODEL_DIR), EngineConfig(), "cpu", available_ram_bytes()).total
    budget_gib = 1.5 * plan / (1 << 30)
    server = start_router(root, _env(root), "--models", f"{DEMO_REPO},{DEMO_NAME}", "--max-loaded-models", "2",
                          "--models-memory-gib", f"{budget_gib:.4f}")  # fmt: skip
    yield server, budget_gib
    server.stop(30)


def test_no_room_beside_a_busy_model_is_a_409_then_eviction(tight: tuple[ServerProcess, float]) -> None:
    server, budget_gib = tight
    assert _complete(server, DEMO_REPO).status_code == 200
    busy = {"model": DEMO_REPO, "prompt": "x", "max_tokens": 1500, "ignore_eos": True, "stream": True}
    with httpx.stream("POST", f"{server.url}/v1/completions", json=busy, timeout=120) as stream:
        lines = stream.iter_lines()  # kept: a dropped iterator closes the stream (a client gone)
        next(lines)  # the first model is serving
        refused = _complete(server, DEMO_NAME)
    assert refused.status_code == 409, refused.text
    message = refused.json()["error"]["message"]
    plan = status(server)[DEMO_NAME]["plan"]
    assert gib_after("needs", message) == pytest.approx(plan["total_gib"], abs=0.006), message
    assert gib_after("of the", message) == pytest.approx(budget_gib, abs=0.006), message
    assert "Retry-After" in refused.headers and DEMO_REPO in message
    assert status(server)[DEMO_NAME]["status"]["value"] == "unloaded"
    wait = time.monotonic() + 60  # the aborted stream's request ends when its client is gone
    while status(server)[DEMO_REPO]["requests_in_flight"] and time.monotonic() < wait:
        time.sleep(0.2)
    loaded = _complete(server, DEMO_NAME)  # the first is idle now: evicted to make room
    assert loaded.status_code == 200, loaded.text
    now = status(server)
    assert now[DEMO_REPO]["status"]["value"] == "unloaded" and now[DEMO_NAME]["status"]["value"] == "loaded"
    assert _unloads(server).get((DEMO_REPO, "memory")) == 1
