"""OpenTelemetry spans (`glassbox serve --otlp-traces-endpoint`): the server app in-process on the tiny
model, its spans caught by the SDK's in-memory exporter and, end to end, by a real OTLP/HTTP receiver
(a local HTTP server decoding the protobuf with opentelemetry-proto). Each span's numbers must be the
response's own ``metrics``; a client's ``traceparent`` must be the request span's parent."""

from __future__ import annotations

import argparse
import json
import sys
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, HTTPServer
from pathlib import Path
from typing import Any

import pytest

pytest.importorskip("opentelemetry.sdk.trace", reason="the otel extra (opentelemetry-sdk) is not installed")
pytest.importorskip("opentelemetry.exporter.otlp.proto.http", reason="the otel extra is not installed")

from opentelemetry.sdk.trace import ReadableSpan  # noqa: E402
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter  # noqa: E402
from server_harness import MODEL_NAME, sse_events, tiny_model  # noqa: E402, F401
from starlette.testclient import TestClient  # noqa: E402

from glassbox import cli  # noqa: E402
from glassbox.anatomy import METRIC_KEYS  # noqa: E402
from glassbox.perf.probe import get_hardware  # noqa: E402
from glassbox.server.tracing import RequestTracer, check_endpoint, require_otel  # noqa: E402
from glassbox.trace import engine_roofline  # noqa: E402

TRACE_ID = "4bf92f3577b34da6a3ce929d0e0e4736"
PARENT_SPAN = "00f067aa0ba902b7"
PHASES = {"tokenize", "queue", "prefill", "decode"}


@pytest.fixture(scope="module")
def app(tiny_model: Path) -> Iterator[tuple[Any, TestClient]]:  # noqa: F811
    """The server app on the tiny model, driven in-process (its lifespan runs the engine thread)."""
    from glassbox.engine.async_engine import AsyncEngine
    from glassbox.engine.llm_engine import LLMEngine
    from glassbox.engine_args import add_engine_args, config_from_args
    from glassbox.server.app import build_app
    from glassbox.server.metrics import ServerMetrics
    from glassbox.server.state import ServerSettings

    parser = argparse.ArgumentParser()
    add_engine_args(parser, positional_model=True)
    args = parser.parse_args(
        [str(tiny_model), "--device", "cpu", "--max-model-len", "256", "--num-kv-blocks", "64"]
    )
    engine = LLMEngine(config_from_args(args, served_model_name=MODEL_NAME))
    metrics = ServerMetrics()
    application = build_app(AsyncEngine(engine, metrics), ServerSettings(), metrics)
    with TestClient(application) as client:
        yield application, client


@pytest.fixture()
def spans(app: tuple[Any, TestClient]) -> Iterator[InMemorySpanExporter]:
    """A tracer with the in-memory exporter (spans exported as they end) and a preset's roofline."""
    application, _ = app
    state = application.state.glassbox
    exporter = InMemorySpanExporter()
    roofline = engine_roofline(state.engine.engine, get_hardware("strix-halo"))
    state.tracer = RequestTracer(exporter, MODEL_NAME, roofline, batch=False)
    yield exporter
    state.tracer.shutdown()
    state.tracer = None


def _tree(exporter: InMemorySpanExporter) -> tuple[ReadableSpan, dict[str, ReadableSpan]]:
    finished = exporter.get_finished_spans()
    (root,) = [s for s in finished if s.name == "llm_request"]
    children = {s.name: s for s in finished if s.name != "llm_request"}
    assert set(children) == PHASES and len(finished) == 5
    assert all(s.parent is not None and s.parent.span_id == root.context.span_id for s in children.values())
    assert all(s.context.trace_id == root.context.trace_id for s in children.values())
    return root, children


def _seconds(span: ReadableSpan) -> float:
    assert span.start_time is not None and span.end_time is not None
    return (span.end_time - span.start_time) / 1e9


def _check_numbers(root: ReadableSpan, children: dict[str, ReadableSpan], metrics: dict[str, Any]) -> None:
    """The span tree says what the response's ``metrics`` says."""
    attrs = dict(root.attributes or {})
    assert set(metrics) == set(METRIC_KEYS)
    for key, value in metrics.items():
        assert attrs[f"glassbox.{key}"] == value, key
    assert attrs["gen_ai.latency.time_to_first_token"] == metrics["ttft_s"]
    assert attrs["gen_ai.latency.time_in_queue"] == metrics["queue_s"]
    assert attrs["gen_ai.usage.prompt_tokens"] == metrics["prompt_tokens"]
    assert attrs["gen_ai.usage.completion_tokens"] == metrics["output_tokens"]
    if metrics["decode_tok_s"] > 0:
        assert attrs["gen_ai.latency.time_per_output_token"] == pytest.approx(
            1 / metrics["decode_tok_s"], rel=1e-12
        )
    # the intervals are the metrics' own (nanosecond rounding aside)
    assert _seconds(root) == pytest.approx(metrics["e2e_s"], abs=5e-6)
    for phase, key in (
        ("tokenize", "tokenize_s"),
        ("queue", "queue_s"),
        ("prefill", "prefill_s"),
        ("decode", "decode_s"),
    ):
        assert _seconds(children[phase]) == pytest.approx(metrics[key], abs=5e-6), phase
    (event,) = [e for e in root.events if e.name == "detokenize"]
    assert dict(event.attributes or {})["glassbox.detokenize_s"] == metrics["detokenize_s"]
    prefill = dict(children["prefill"].attributes or {})
    assert prefill["glassbox.tokens"] == metrics["prompt_tokens"] - metrics["cached_prompt_tokens"]
    ceiling = attrs["glassbox.roofline.prefill.ceiling_tok_s"]
    assert prefill["glassbox.roofline.fraction"] == attrs["glassbox.roofline.prefill.fraction"]
    assert attrs["glassbox.roofline.prefill.fraction"] == pytest.approx(
        metrics["prefill_tok_s"] / ceiling, rel=1e-12
    )
    decode = dict(children["decode"].attributes or {})
    assert decode["glassbox.tokens"] == metrics["output_tokens"] - 1
    assert decode["glassbox.preemptions"] == metrics["preemptions"]


def test_completion_span_carries_the_response_metrics_and_the_client_parent(
    app: tuple[Any, TestClient], spans: InMemorySpanExporter
) -> None:
    _, client = app
    body = {"model": MODEL_NAME, "prompt": "the quick brown fox", "max_tokens": 6, "ignore_eos": True}
    headers = {"traceparent": f"00-{TRACE_ID}-{PARENT_SPAN}-01"}
    r = client.post("/v1/completions", json=body, headers=headers)
    assert r.status_code == 200, r.text
    metrics = r.json()["metrics"]
    root, children = _tree(spans)
    assert f"{root.context.trace_id:032x}" == TRACE_ID  # the client's trace
    assert root.parent is not None and f"{root.parent.span_id:016x}" == PARENT_SPAN and root.parent.is_remote
    _check_numbers(root, children, metrics)
    assert metrics["output_tokens"] == 6 and dict(root.attributes or {})["gen_ai.request.max_tokens"] == 6


def test_streamed_chat_span_without_a_parent(
    app: tuple[Any, TestClient], spans: InMemorySpanExporter
) -> None:
    """No traceparent: a trace of its own; the numbers are the last chunk's ``metrics``."""
    _, client = app
    body = {
        "model": MODEL_NAME,
        "messages": [{"role": "user", "content": "hi"}],
        "max_tokens": 5,
        "stream": True,
    }
    with client.stream("POST", "/v1/chat/completions", json=body) as r:
        assert r.status_code == 200
        events = sse_events(r.iter_lines())
    (metrics,) = [e["metrics"] for e in events if isinstance(e, dict) and "metrics" in e]
    root, children = _tree(spans)
    assert root.parent is None
    _check_numbers(root, children, metrics)
    assert dict(root.attributes or {})["gen_ai.operation.name"] == "chat"


def test_n_above_one_has_no_batch_one_roofline(
    app: tuple[Any, TestClient], spans: InMemorySpanExporter
) -> None:
    """Two continuations share a decode: a batch-1 ceiling is not theirs, so no fraction is claimed."""
    _, client = app
    body = {"model": MODEL_NAME, "prompt": "abc", "max_tokens": 4, "n": 2, "ignore_eos": True}
    r = client.post("/v1/completions", json=body)
    assert r.status_code == 200
    root, _ = _tree(spans)
    attrs = dict(root.attributes or {})
    assert attrs["glassbox.output_tokens"] == r.json()["metrics"]["output_tokens"] == 8
    assert not any(k.startswith("glassbox.roofline") for k in attrs)


class _Receiver(BaseHTTPRequestHandler):
    bodies: list[tuple[str, str, bytes]] = []

    def do_POST(self) -> None:  # noqa: N802 (http.server's name)
        data = self.rfile.read(int(self.headers["Content-Length"]))
        type(self).bodies.append((self.path, self.headers["Content-Type"], data))
        self.send_response(200)
        self.send_header("Content-Type", "application/x-protobuf")
        self.send_header("Content-Length", "0")
        self.end_headers()

    def log_message(self, *args: Any) -> None:
        pass


def test_otlp_http_export_end_to_end(app: tuple[Any, TestClient]) -> None:
    """The real OTLP/HTTP exporter, batched on its own thread, to a local receiver: nothing is sent while
    the response is served; on shutdown the protobuf POST to /v1/traces holds the same numbers."""
    from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceRequest

    application, client = app
    server = HTTPServer(("127.0.0.1", 0), _Receiver)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    state = application.state.glassbox
    try:
        endpoint = check_endpoint(f"http://127.0.0.1:{server.server_port}")
        state.tracer = RequestTracer.otlp(endpoint, MODEL_NAME)
        body = {"model": MODEL_NAME, "prompt": "hello there", "max_tokens": 4, "ignore_eos": True}
        r = client.post(
            "/v1/completions", json=body, headers={"traceparent": f"00-{TRACE_ID}-{PARENT_SPAN}-01"}
        )
        assert r.status_code == 200
        assert _Receiver.bodies == []  # queued, not sent on the request's way (BatchSpanProcessor)
        state.tracer.shutdown()  # flushes
    finally:
        state.tracer = None
        server.shutdown()
    (path, content_type, data) = _Receiver.bodies[0]
    assert path == "/v1/traces" and content_type == "application/x-protobuf"
    req = ExportTraceServiceRequest.FromString(data)
    got = [s for rs in req.resource_spans for ss in rs.scope_spans for s in ss.spans]
    assert sorted(s.name for s in got) == sorted(PHASES | {"llm_request"})
    (root,) = [s for s in got if s.name == "llm_request"]
    assert root.trace_id.hex() == TRACE_ID and root.parent_span_id.hex() == PARENT_SPAN
    attrs = {a.key: a.value for a in root.attributes}

    def value(v: Any) -> Any:
        return getattr(v, v.WhichOneof("value"))

    for key, want in r.json()["metrics"].items():
        assert value(attrs[f"glassbox.{key}"]) == want, key


def test_endpoint_checks_and_the_cli_error(
    capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    assert check_endpoint("http://localhost:4318") == "http://localhost:4318/v1/traces"
    assert check_endpoint("https://otel.example:443/custom/path") == "https://otel.example:443/custom/path"
    for bad in ("localhost:4318", "grpc://x:4317", "http://:4318", "http://h:99999", "http://h:4317"):
        with pytest.raises(ValueError, match="--otlp-traces-endpoint must be an http"):
            check_endpoint(bad)
    # the flag is checked before any model loads: a clear error, exit status 2
    assert cli.main(["serve", "glassbox-demo", "--otlp-traces-endpoint", "collector:4318"]) == 2
    err = capsys.readouterr().err
    assert (
        "glassbox serve: error: --otlp-traces-endpoint must be an http(s) URL" in err
        and "collector:4318" in err
    )
    monkeypatch.setitem(sys.modules, "opentelemetry.exporter.otlp.proto.http.trace_exporter", None)
    with pytest.raises(ValueError, match=r"pip install 'glassbox\[otel\]'"):
        require_otel()
    assert json.dumps(check_endpoint("http://[::1]:4318"))  # IPv6 literal
