"""OpenTelemetry: one span per API request, exported over OTLP/HTTP (``glassbox serve
--otlp-traces-endpoint URL``, vLLM's flag; the SDK and exporter are the ``otel`` extra).

The request span (``llm_request``, kind SERVER, as vLLM names it) runs from the start of tokenization to
the request's end. Its children are the phases that are intervals: ``tokenize``, ``queue``, ``prefill``
(chunks included) and ``decode``, so that a trace viewer draws the request's anatomy as a waterfall.
Detokenization is no interval (it runs a little after every step, overlapped with the next one), so it is
an event on the request span at its end, carrying its summed seconds, rather than a child span that would
draw a false stretch of time. Every number is the request's finalized ``RequestMetrics``, the very object
the response's ``metrics`` is made of (generation.request_metrics), so spans and responses agree exactly;
the roofline fractions (with a probe of this machine cached) are trace's (perf/request_roofline.py).

A client's W3C ``traceparent`` (and ``tracestate``) header makes the request span a child of the
caller's span. The spans are built once the response's last output is in, on the event loop, from the
recorded timestamps (a few microseconds); a BatchSpanProcessor queues them and its own thread exports, so
neither the engine thread nor the event loop waits on the network. A request that ends without all its
outputs (the client left mid-stream, an engine error) gets no span.
"""

from __future__ import annotations

import logging
import time
import urllib.parse
from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any

from glassbox.anatomy import RequestMetrics
from glassbox.outputs import RequestOutput
from glassbox.perf.request_roofline import PROBE_WRONG, RequestRoofline
from glassbox.server.generation import Job, request_metrics, usage

if TYPE_CHECKING:
    from opentelemetry.sdk.trace.export import SpanExporter

    from glassbox.engine.llm_engine import LLMEngine

logger = logging.getLogger(__name__)

OTEL_EXTRA = "glassbox[otel]"
_PATH = "/v1/traces"  # OTLP/HTTP's traces path, added to a bare host:port


def check_endpoint(url: str) -> str:
    """The OTLP/HTTP traces URL from ``--otlp-traces-endpoint`` (``/v1/traces`` added to a bare
    ``http://host:port``); ValueError naming the flag for anything else."""
    hint = f"--otlp-traces-endpoint must be an http(s) URL such as http://localhost:4318{_PATH}, got {url!r}"
    parts = urllib.parse.urlsplit(url.strip())
    try:
        port = parts.port
    except ValueError:
        raise ValueError(f"{hint} (bad port)") from None
    if parts.scheme not in ("http", "https") or not parts.hostname:
        raise ValueError(hint)
    if port == 4317:
        raise ValueError(f"{hint}: 4317 is OTLP/gRPC's port; glassbox exports OTLP/HTTP (4318)")
    path = parts.path if parts.path not in ("", "/") else _PATH
    return urllib.parse.urlunsplit((parts.scheme, parts.netloc, path, parts.query, ""))


def require_otel() -> None:
    """ValueError naming the extra to install when the OpenTelemetry SDK or OTLP exporter is missing."""
    try:
        import opentelemetry.exporter.otlp.proto.http.trace_exporter  # noqa: F401
        import opentelemetry.sdk.trace  # noqa: F401
    except ImportError as e:
        raise ValueError(
            f"--otlp-traces-endpoint needs the OpenTelemetry SDK and OTLP exporter: pip install "
            f"'{OTEL_EXTRA}' (missing: {e.name or e})"
        ) from None


def tracer_for(engine: LLMEngine, endpoint: str) -> RequestTracer:
    """The server's tracer: OTLP/HTTP to ``endpoint``, with roofline fractions when a probe of this
    machine is cached for the engine's device and dtype (never measured here: it would hold up the start
    and compete with the engine; `glassbox hardware --probe` or `glassbox trace` makes one)."""
    from glassbox.models.model_config import dtype_name
    from glassbox.perf.probe import cached_probe
    from glassbox.trace import engine_roofline

    device, dtype = engine.executor.device.type, dtype_name(engine.executor.dtype)
    hw = cached_probe(device, dtype)
    if hw is None:
        logger.warning(
            "OpenTelemetry: no cached probe of this machine (%s, %s): spans carry no roofline fractions "
            "(run `glassbox hardware --probe` once)",
            device,
            dtype,
        )
    else:
        for w in hw.extra.get("warnings", []):
            logger.warning("OpenTelemetry roofline: hardware probe: %s", w)
    logger.info("OpenTelemetry: a span per request to %s", endpoint)
    return RequestTracer.otlp(
        endpoint, engine.model_name, None if hw is None else engine_roofline(engine, hw)
    )


class RequestTracer:
    """Turns finished API requests into spans, sent to ``exporter`` (batched on a background thread unless
    ``batch`` is False: the tests' in-memory exporter)."""

    def __init__(
        self,
        exporter: SpanExporter,
        model: str,
        roofline: RequestRoofline | None = None,
        batch: bool = True,
    ) -> None:
        from opentelemetry.sdk.resources import Resource
        from opentelemetry.sdk.trace import TracerProvider
        from opentelemetry.sdk.trace.export import BatchSpanProcessor, SimpleSpanProcessor
        from opentelemetry.trace.propagation.tracecontext import TraceContextTextMapPropagator

        self.provider = TracerProvider(resource=Resource.create({"service.name": "glassbox"}))
        processor = BatchSpanProcessor(exporter) if batch else SimpleSpanProcessor(exporter)
        self.provider.add_span_processor(processor)
        self.tracer = self.provider.get_tracer("glassbox.server")
        self.propagator = TraceContextTextMapPropagator()
        self.model = model
        self.roofline = roofline

    @classmethod
    def otlp(cls, endpoint: str, model: str, roofline: RequestRoofline | None = None) -> RequestTracer:
        """A tracer exporting to an OTLP/HTTP collector at ``endpoint`` (checked by check_endpoint)."""
        require_otel()
        from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter

        return cls(OTLPSpanExporter(endpoint=endpoint, timeout=10), model, roofline)

    def shutdown(self) -> None:
        """Export what is queued (bounded by the exporter's timeout) and stop the export thread."""
        self.provider.shutdown()

    def record(
        self, headers: Mapping[str, str], job: Job, finals: Sequence[RequestOutput], endpoint: str
    ) -> None:
        """The spans of one finished API request (never raises: a tracing failure is logged)."""
        try:
            self._record(headers, job, list(finals), endpoint)
        except Exception:
            logger.exception("OpenTelemetry: could not record the spans of %s", job.id)

    def _record(
        self, headers: Mapping[str, str], job: Job, finals: list[RequestOutput], endpoint: str
    ) -> None:
        from opentelemetry.trace import SpanKind, Status, StatusCode

        m = request_metrics(finals)
        if m is None:
            return
        wall_ns, perf = time.time_ns(), time.perf_counter()

        def ns(t: float) -> int:
            return wall_ns + int((t - perf) * 1e9)

        end = m.finished_time if m.finished_time is not None else perf
        start = m.arrival_time - m.tokenize_s
        parent = self.propagator.extract(carrier=headers)
        root = self.tracer.start_span(
            "llm_request", context=parent, kind=SpanKind.SERVER, start_time=ns(start), attributes=None
        )
        reasons = [o.finish_reason or "abort" for r in finals for o in r.outputs]
        root.set_attributes(self._request_attributes(job, finals, m, reasons, endpoint))
        phases = self._roofline_phases(m, len(finals))
        if phases is not None:
            root.set_attributes(_roofline_attributes(phases, self.roofline))
        from opentelemetry import trace

        ctx = trace.set_span_in_context(root, parent)
        computed = m.prompt_tokens - m.cached_prompt_tokens
        spans: list[tuple[str, float | None, float | None, dict[str, Any]]] = [
            ("tokenize", start, m.arrival_time, {"glassbox.tokens": m.prompt_tokens}),
            ("queue", m.arrival_time, m.first_scheduled_time, {}),
            (
                "prefill",
                m.first_scheduled_time,
                m.first_token_time,
                {
                    "glassbox.tokens": computed,
                    "glassbox.cached_tokens": m.cached_prompt_tokens,
                    "glassbox.tok_s": m.prefill_tok_s,
                },
            ),
            (
                "decode",
                m.first_token_time,
                m.finished_time,
                {
                    "glassbox.tokens": max(0, m.output_tokens - m.sequences),
                    "glassbox.tok_s": m.decode_tok_s,
                    "glassbox.preemptions": m.preemptions,
                },
            ),
        ]
        for name, t0, t1, attrs in spans:
            if t0 is None or t1 is None:
                continue  # never reached (an aborted request)
            if phases is not None and name in phases and "fraction" in phases[name]:
                attrs = {**attrs, **_phase_roofline(phases[name])}
            child = self.tracer.start_span(name, context=ctx, start_time=ns(t0), attributes=attrs)
            child.end(end_time=ns(max(t0, t1)))
        root.add_event("detokenize", {"glassbox.detokenize_s": m.detokenize_s}, timestamp=ns(end))
        if "abort" in reasons:
            root.set_status(Status(StatusCode.ERROR, "aborted"))
        root.end(end_time=ns(end))

    def _request_attributes(
        self, job: Job, finals: list[RequestOutput], m: RequestMetrics, reasons: list[str], endpoint: str
    ) -> dict[str, Any]:
        """OpenTelemetry's GenAI names (and vLLM's latency ones) where they exist, then every key of the
        response's ``metrics`` object as ``glassbox.<key>``."""
        use, params = usage(job, finals), job.params[0]
        attrs: dict[str, Any] = {
            "gen_ai.operation.name": "chat" if endpoint.endswith("/chat/completions") else "text_completion",
            "gen_ai.request.id": job.id,
            "gen_ai.request.model": self.model,
            "gen_ai.response.model": self.model,
            "gen_ai.request.n": params.n,
            "gen_ai.request.temperature": params.temperature,
            "gen_ai.request.top_p": params.top_p,
            "gen_ai.usage.prompt_tokens": use["prompt_tokens"],
            "gen_ai.usage.completion_tokens": use["completion_tokens"],
            "gen_ai.usage.num_sequences": m.sequences,
            "gen_ai.response.finish_reasons": reasons,
            "gen_ai.latency.time_in_queue": m.queue_s,
            "gen_ai.latency.time_to_first_token": m.ttft_s,
            "gen_ai.latency.e2e": m.e2e_s,
            "url.path": endpoint,
        }
        if params.max_tokens is not None:
            attrs["gen_ai.request.max_tokens"] = params.max_tokens
        if m.decode_tok_s > 0:  # TPOT = decode time per decoded token, the inverse of the decode rate
            attrs["gen_ai.latency.time_per_output_token"] = 1.0 / m.decode_tok_s
        attrs.update({f"glassbox.{k}": v for k, v in m.as_dict().items()})
        return attrs

    def _roofline_phases(self, m: RequestMetrics, prompts: int) -> dict[str, dict[str, Any]] | None:
        """Batch-1 ceilings hold for one sequence of one prompt only (n > 1 or a batch of prompts would
        read as above 100% of a ceiling that is not theirs)."""
        if self.roofline is None or prompts != 1 or m.sequences != 1 or m.first_token_time is None:
            return None
        return self.roofline.phases(
            m.prompt_tokens, m.cached_prompt_tokens, m.output_tokens, m.prefill_tok_s, m.decode_tok_s
        )


def _phase_roofline(phase: dict[str, Any]) -> dict[str, Any]:
    out = {
        "glassbox.roofline.fraction": phase["fraction"],
        "glassbox.roofline.ceiling_tok_s": phase["ceiling_tok_s"],
        "glassbox.roofline.bound": phase["bound"],
        "glassbox.roofline.limited_by": phase["limited_by"],
    }
    if phase.get("probe_wrong"):
        out["glassbox.roofline.probe_wrong"] = True
    return out


def _roofline_attributes(phases: dict[str, dict[str, Any]], rl: RequestRoofline | None) -> dict[str, Any]:
    assert rl is not None
    attrs: dict[str, Any] = {"glassbox.roofline.hardware": rl.hw.source}
    for name, phase in phases.items():
        attrs[f"glassbox.roofline.{name}.ceiling_tok_s"] = phase["ceiling_tok_s"]
        attrs[f"glassbox.roofline.{name}.bound"] = phase["bound"]
        if "fraction" in phase:
            attrs[f"glassbox.roofline.{name}.fraction"] = phase["fraction"]
    warnings = list(rl.hw.extra.get("warnings", []))
    if any(ph.get("probe_wrong") for ph in phases.values()):
        warnings.append(PROBE_WRONG)
    if warnings:
        attrs["glassbox.roofline.warnings"] = warnings
    return attrs
