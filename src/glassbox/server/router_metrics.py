"""The multi-model server's Prometheus metrics: its own (loads, load time, unloads and why, what each
model holds) and every loaded model's, each sample labelled ``model="NAME"`` (torch-free).

A loaded model's process keeps its single-model metrics (prefix ``glassbox:``); /metrics reads each one's
text, parses it with prometheus_client's parser, adds the label and renders one exposition in which a
family appears once with every model's samples.
"""

from __future__ import annotations

from collections.abc import Iterable

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, generate_latest
from prometheus_client.metrics_core import Metric
from prometheus_client.parser import text_string_to_metric_families

PREFIX = "glassbox:"  # server/metrics.py's (that module imports the engine)
LOAD_BUCKETS = [0.5, 1.0, 2.5, 5.0, 10.0, 20.0, 40.0, 80.0, 160.0, 320.0, 640.0]


class RouterMetrics:
    """The router's collectors (server/router.Events)."""

    def __init__(self) -> None:
        self.registry = CollectorRegistry()
        r = self.registry
        self.loads = Counter(
            PREFIX + "model_loads_total", "Model processes started and ready.", ["model"], registry=r
        )
        self.load_seconds = Histogram(
            PREFIX + "model_load_seconds", "Seconds from a model's start to its first health answer.", ["model"],
            buckets=LOAD_BUCKETS, registry=r,
        )  # fmt: skip
        self.unloads = Counter(
            PREFIX + "model_unloads_total", "Models unloaded, by reason (idle, lru, memory, request, shutdown).",
            ["model", "reason"], registry=r,
        )  # fmt: skip
        self.failures = Counter(
            PREFIX + "model_failures_total", "Model processes that failed to load or crashed.", ["model", "reason"],
            registry=r,
        )  # fmt: skip
        self.loaded_gauge = Gauge(
            PREFIX + "model_loaded", "1 while a model is loaded.", ["model"], registry=r
        )
        self.held = Gauge(
            PREFIX + "model_memory_bytes", "What a loaded model holds: its process's resident set, its weights "
            "and its KV cache.", ["model", "part"], registry=r,
        )  # fmt: skip

    def loaded(self, name: str, seconds: float) -> None:
        self.loads.labels(name).inc()
        self.load_seconds.labels(name).observe(seconds)
        self.loaded_gauge.labels(name).set(1)

    def unloaded(self, name: str, reason: str) -> None:
        self.unloads.labels(name, reason).inc()
        self.loaded_gauge.labels(name).set(0)

    def failed(self, name: str, reason: str) -> None:
        self.failures.labels(name, reason).inc()
        self.loaded_gauge.labels(name).set(0)

    def render(self, children: Iterable[tuple[str, str]]) -> bytes:
        """The exposition: the router's metrics, then the children's (``(model, text)``) labelled."""
        merged: dict[str, Metric] = {}
        for model, text in children:
            for family in text_string_to_metric_families(text):
                into = merged.get(family.name)
                if into is None:
                    into = merged[family.name] = Metric(
                        family.name, family.documentation, family.type, family.unit
                    )
                for s in family.samples:
                    into.add_sample(s.name, {**s.labels, "model": model}, s.value, s.timestamp, s.exemplar)
        registry = CollectorRegistry()
        registry.register(_Fixed(list(merged.values())))
        return generate_latest(self.registry) + generate_latest(registry)


class _Fixed:
    """A collector of metric families already gathered."""

    def __init__(self, families: list[Metric]) -> None:
        self.families = families

    def collect(self) -> Iterable[Metric]:
        return self.families
