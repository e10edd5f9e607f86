"""The dashboard's data over HTTP, no browser (tests/server/test_dashboard_browser.py drives the page): the SSE
stream at /dashboard/events against the responses' own ``metrics``, and /dashboard/plan (the planner for
the served model beside the measured medians), on the server test_server.py shares."""

from __future__ import annotations

import importlib.util
import json
import re
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from server_harness import MODEL_NAME, STEP_BUDGET, ServerProcess

# token ids no other server test prompts with (no prefix-cache hits from them), 80 long: three chunks of 32
PROMPT = [(11 * i) % 300 + 50 for i in range(80)]


@pytest.fixture(scope="module")
def server(shared_server: ServerProcess) -> ServerProcess:
    return shared_server


def sse(lines: Iterator[str]) -> Iterator[tuple[str, dict[str, Any]]]:
    """(event name, data) of each server-sent event."""
    name, data = "message", ""
    for line in lines:
        if line.startswith("event: "):
            name = line[len("event: ") :]
        elif line.startswith("data: "):
            data = line[len("data: ") :]
        elif line == "" and data:
            yield name, json.loads(data)
            name, data = "message", ""


def test_page_and_index(server: ServerProcess) -> None:
    index = httpx.get(server.url + "/", headers={"accept": "text/html"})  # as a browser asks (Ollama's
    assert index.status_code == 200 and 'href="/dashboard"' in index.text  # clients get their line)
    page = httpx.get(server.url + "/dashboard")
    assert page.status_code == 200 and "text/html" in page.headers["content-type"]
    for name in ("dashboard.js", "timeline.js", "charts.js", "playground.js", "dashboard.css"):
        assert f"/dashboard/static/{name}" in page.text
        assert httpx.get(f"{server.url}/dashboard/static/{name}").status_code == 200
    assert httpx.get(server.url + "/dashboard/static/nothing.js").status_code == 404


def test_events_carry_each_request_as_its_metrics_say(server: ServerProcess) -> None:
    """Two requests (the second a prefix-cache hit) appear in the stream with their responses' own
    ``metrics``, prompt chunks that add up to the computed prompt, and the steps that ran them."""
    bodies = [
        {"prompt": PROMPT, "max_tokens": 6, "ignore_eos": True, "temperature": 0},
        {"prompt": PROMPT[:64] + [7, 8, 9], "max_tokens": 3, "ignore_eos": True, "temperature": 0},
    ]
    responses: list[dict[str, Any]] = []
    seen: dict[str, dict[str, Any]] = {}
    steps: list[dict[str, Any]] = []
    with httpx.Client(base_url=server.url, timeout=30) as http:
        with http.stream("GET", "/dashboard/events", params={"interval": "0.05", "history": "0"}) as r:
            assert r.status_code == 200 and r.headers["content-type"].startswith("text/event-stream")
            events = sse(r.iter_lines())
            name, hello = next(events)
            assert name == "hello" and hello["model"] == MODEL_NAME
            assert hello["max_num_batched_tokens"] == STEP_BUDGET and "ttft_s" in hello["metric_keys"]

            def send() -> None:
                for body in bodies:
                    responses.append(httpx.post(f"{server.url}/v1/completions", json=body, timeout=30).json())

            sender = threading.Thread(target=send)
            sender.start()
            deadline = time.monotonic() + 20
            for name, update in events:
                assert name == "update"
                steps += update["steps"]
                seen.update({q["id"]: q for q in update["requests"]})
                done = [q for q in seen.values() if q["state"] == "finished"]
                if len(responses) == 2 and {q["id"] for q in done} >= {resp["id"] for resp in responses}:
                    break
                assert time.monotonic() < deadline, "the requests did not show up finished"
            sender.join()
    for resp in responses:
        q = seen[resp["id"]]
        assert q["metrics"] == resp["metrics"]  # the same numbers as the response's anatomy
        assert q["finish_reason"] == "length" and q["output"] == resp["usage"]["completion_tokens"]
        assert q["prompt"] == resp["usage"]["prompt_tokens"]
        assert q["cached"] == resp["metrics"]["cached_prompt_tokens"]
        chunks = q["chunks"]
        assert sum(c[2] for c in chunks) == q["prompt"] - q["cached"]  # each chunk's tokens, once
        assert [c[3] for c in chunks][0] == q["cached"] and all(c[2] <= STEP_BUDGET for c in chunks)
        assert q["scheduled"] <= chunks[0][0] and chunks[-1][1] == pytest.approx(q["first_token"], abs=1e-9)
        assert q["first_token"] - q["scheduled"] == pytest.approx(resp["metrics"]["prefill_s"], abs=1e-9)
        assert q["end"] - q["first_token"] == pytest.approx(resp["metrics"]["decode_s"], abs=1e-9)
    first, second = (seen[resp["id"]] for resp in responses)
    assert first["cached"] == 0 and len(first["chunks"]) == 3  # 32 + 32 + 16
    assert second["cached"] == 64 and len(second["chunks"]) == 1  # the shared 64 tokens came from the cache
    # the steps that ran them: every prompt chunk is a step's prefill tokens, every later token a decode row
    t0, t1 = first["arrival"], second["end"]
    ran = [s for s in steps if t0 <= s["t"] <= t1]
    assert sum(s["pf"] for s in ran) == sum(c[2] for q in (first, second) for c in q["chunks"])
    assert sum(s["dc"] for s in ran) == (6 - 1) + (3 - 1)
    assert all(s["used"] + s["free"] == hello["num_blocks"] and s["bs"] >= 1 for s in ran)


def test_plan_beside_measured(server: ServerProcess) -> None:
    r = httpx.get(
        f"{server.url}/dashboard/plan", params={"prompt_tokens": 64, "output_tokens": 8}, timeout=60
    )
    assert r.status_code == 200, r.text
    body = r.json()
    assert body["error"] is None, body["error"]
    assert body["workload"] == {"prompt_tokens": 64, "output_tokens": 8, "concurrency": 1}
    p = body["predicted"]
    assert p["hardware"]["name"] == "local" and p["ttft_s"] > 0 and p["decode_tok_s"] > 0
    assert p["concurrency"][0]["concurrency"] == 1
    m = body["measured"]
    assert m["requests"] >= 1 and m["ttft_s"] > 0  # the requests the other tests sent


# -- the Grafana dashboard (docs/grafana/glassbox.json) -----------------------------------------------------

ROOT = Path(__file__).resolve().parents[2]


def test_grafana_dashboard_queries_the_served_metrics() -> None:
    """Every PromQL query names metrics /metrics serves, every family is charted, the layout is Grafana's
    (unique ids, 24-column grid, a Prometheus data-source variable), and the file is the generator's."""
    from glassbox.server.metrics import ServerMetrics

    served: dict[str, str] = {}  # sample name -> family
    for fam in ServerMetrics().registry.collect():
        suffixes = {"counter": ("_total",), "histogram": ("_bucket", "_sum", "_count")}.get(fam.type, ("",))
        served.update({fam.name + s: fam.name for s in suffixes})
    board = json.loads((ROOT / "docs" / "grafana" / "glassbox.json").read_text())
    spec = importlib.util.spec_from_file_location(
        "grafana_dashboard", ROOT / "tools" / "grafana_dashboard.py"
    )
    assert spec is not None and spec.loader is not None
    generator = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(generator)
    assert board == generator.dashboard()  # regenerate with python tools/grafana_dashboard.py
    assert board["uid"] and board["title"] and board["schemaVersion"] >= 36
    assert board["templating"]["list"][0] == {
        **board["templating"]["list"][0],
        "type": "datasource",
        "query": "prometheus",
    }
    ids = [p["id"] for p in board["panels"]]
    assert len(set(ids)) == len(ids)
    charted: set[str] = set()
    for p in board["panels"]:
        pos = p["gridPos"]
        assert 0 <= pos["x"] and pos["x"] + pos["w"] <= 24 and pos["h"] >= 1, p["title"]
        if p["type"] == "row":
            continue
        assert p["datasource"] == {"type": "prometheus", "uid": "${datasource}"} and p["targets"], p["title"]
        assert len({t["refId"] for t in p["targets"]}) == len(p["targets"])
        for t in p["targets"]:
            assert t["expr"].count("(") == t["expr"].count(")"), t["expr"]
            names = set(re.findall(r"glassbox:[A-Za-z0-9_:]+", t["expr"]))
            assert names and names <= set(served), (p["title"], names - set(served))
            charted |= {served[n] for n in names}
    assert set(served.values()) - charted == {"glassbox:spec_decode_num_accepted_tokens_per_pos"}
