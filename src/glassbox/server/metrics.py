"""Prometheus metrics (prefix ``glassbox:``) that split a request into queue, prefill and decode.

One :class:`ServerMetrics` per app, on its own CollectorRegistry. It is the AsyncEngine's observer: the
engine thread calls ``on_iteration`` after every loop turn (gauges, step histograms, counters from the
engine's cumulative totals) and ``on_finished`` for each request that ends (latency histograms).
"""

from __future__ import annotations

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, generate_latest

from glassbox.engine.llm_engine import LLMEngine, StepRecord
from glassbox.outputs import RequestOutput

PREFIX = "glassbox:"

_FAST = [0.001, 0.0025, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.25, 0.5, 0.75, 1.0]
TTFT_BUCKETS = _FAST + [2.5, 5.0, 7.5, 10.0, 20.0, 40.0, 80.0, 160.0, 640.0, 2560.0]
ITL_BUCKETS = _FAST + [2.5, 5.0, 7.5, 10.0, 20.0, 40.0, 80.0]
REQUEST_BUCKETS = [
    0.01,
    0.05,
    0.1,
    0.3,
    0.5,
    0.8,
    1.0,
    1.5,
    2.0,
    2.5,
    5.0,
    10.0,
    15.0,
    20.0,
    30.0,
    40.0,
    50.0,
    60.0,
    120.0,
    240.0,
    480.0,
    960.0,
    1920.0,
    7680.0,
]
STEP_BUCKETS = [0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0]
TOKEN_BUCKETS = [1, 2, 4, 8, 16, 32, 64, 128, 256, 512, 1024, 2048, 4096, 8192, 16384]


class ServerMetrics:
    """The server's Prometheus collectors; an EngineObserver (called on the engine thread)."""

    def __init__(self) -> None:
        self.registry = CollectorRegistry()
        r = self.registry

        def gauge(name: str, doc: str) -> Gauge:
            return Gauge(PREFIX + name, doc, registry=r)

        def counter(name: str, doc: str, labels: tuple[str, ...] = ()) -> Counter:
            return Counter(PREFIX + name, doc, labels, registry=r)

        def histogram(name: str, doc: str, buckets: list[float], labels: tuple[str, ...] = ()) -> Histogram:
            return Histogram(PREFIX + name, doc, labels, buckets=buckets, registry=r)

        self.num_requests_running = gauge("num_requests_running", "Sequences in the running batch.")
        self.num_requests_waiting = gauge("num_requests_waiting", "Sequences waiting for a slot.")
        self.kv_cache_usage_perc = gauge("kv_cache_usage_perc", "Share of KV blocks in use (1 = full).")
        self.kv_cache_free_blocks = gauge("kv_cache_free_blocks", "Free KV cache blocks.")
        self.kv_cache_total_blocks = gauge("kv_cache_total_blocks", "KV cache blocks in the pool.")
        self.prompt_tokens = counter(
            "prompt_tokens_total",
            "Prompt tokens prefilled, per sequence: computed or served by the prefix cache.",
        )
        self.prompt_tokens_cached = counter(
            "prompt_tokens_cached_total", "Of prompt_tokens_total, those served by the prefix cache."
        )
        self.generation_tokens = counter("generation_tokens_total", "Tokens generated.")
        self.num_preemptions = counter(
            "num_preemptions_total", "Sequences preempted (KV dropped, recomputed)."
        )
        self.prefix_cache_queries = counter(
            "prefix_cache_queries_total", "Prompt tokens looked up in the prefix cache."
        )
        self.prefix_cache_hits = counter(
            "prefix_cache_hits_total", "Prompt tokens served by the prefix cache."
        )
        self.request_success = counter(
            "request_success_total", "Requests ended, by finish reason.", ("finished_reason",)
        )
        self.ttft = histogram(
            "time_to_first_token_seconds", "Time to first token (incl. queue).", TTFT_BUCKETS
        )
        self.itl = histogram("inter_token_latency_seconds", "Gaps between a request's tokens.", ITL_BUCKETS)
        self.e2e = histogram("e2e_request_latency_seconds", "End-to-end request latency.", REQUEST_BUCKETS)
        self.queue = histogram(
            "request_queue_time_seconds", "Time waiting before the first schedule.", REQUEST_BUCKETS
        )
        self.prefill = histogram(
            "request_prefill_time_seconds", "First schedule to first token.", REQUEST_BUCKETS
        )
        self.decode = histogram("request_decode_time_seconds", "First token to the last.", REQUEST_BUCKETS)
        self.iteration_tokens = histogram(
            "iteration_tokens_total",
            "Tokens the model computed per engine step (the scheduled tokens: prompt chunks, recomputation, "
            "one per decoding sequence; prefix-cache hits excluded).",
            [float(b) for b in TOKEN_BUCKETS],
        )
        self.step_duration = histogram(
            "step_duration_seconds", "Engine step time by phase.", STEP_BUCKETS, ("phase",)
        )
        # speculative decoding, vLLM's names (spec_decode_*); zero without --speculative-config
        self.spec_drafts = counter("spec_decode_num_drafts", "Speculative decoding drafts (rows verified).")
        self.spec_draft_tokens = counter("spec_decode_num_draft_tokens", "Draft tokens proposed.")
        self.spec_accepted_tokens = counter("spec_decode_num_accepted_tokens", "Draft tokens accepted.")
        self.spec_accepted_per_pos = counter(
            "spec_decode_num_accepted_tokens_per_pos",
            "Accepted draft tokens per draft position.",
            ("position",),
        )
        self._seen = {"prompt": 0, "cached": 0, "generation": 0, "preemptions": 0, "queries": 0, "hits": 0}
        self._seen.update({"spec_drafts": 0, "spec_draft_tokens": 0, "spec_accepted": 0})
        self._seen_per_pos: list[int] = []

    # -- EngineObserver (engine thread) ---------------------------------------------
    def on_iteration(self, engine: LLMEngine, record: StepRecord | None) -> None:
        bm = engine.block_manager
        self.num_requests_running.set(engine.num_running)
        self.num_requests_waiting.set(engine.num_waiting)
        self.kv_cache_usage_perc.set(bm.usage)
        self.kv_cache_free_blocks.set(bm.num_free_blocks)
        self.kv_cache_total_blocks.set(bm.num_blocks)
        c = engine.counters
        totals = {
            "spec_drafts": c.spec_drafts,
            "spec_draft_tokens": c.spec_draft_tokens,
            "spec_accepted": c.spec_accepted_tokens,
            "prompt": engine.counters.prompt_tokens,
            "cached": engine.counters.cached_prompt_tokens,
            "generation": engine.counters.generation_tokens,
            "preemptions": engine.scheduler.num_preemptions,
            "queries": bm.stats.queries,
            "hits": bm.stats.hits,
        }
        counters = {
            "spec_drafts": self.spec_drafts,
            "spec_draft_tokens": self.spec_draft_tokens,
            "spec_accepted": self.spec_accepted_tokens,
            "prompt": self.prompt_tokens,
            "cached": self.prompt_tokens_cached,
            "generation": self.generation_tokens,
            "preemptions": self.num_preemptions,
            "queries": self.prefix_cache_queries,
            "hits": self.prefix_cache_hits,
        }
        for key, total in totals.items():
            delta = total - self._seen[key]
            if delta > 0:
                counters[key].inc(delta)
                self._seen[key] = total
        for pos, total in enumerate(c.spec_accepted_per_pos):
            if pos == len(self._seen_per_pos):
                self._seen_per_pos.append(0)
            if total > self._seen_per_pos[pos]:
                self.spec_accepted_per_pos.labels(position=str(pos)).inc(total - self._seen_per_pos[pos])
                self._seen_per_pos[pos] = total
        if record is not None:
            self.iteration_tokens.observe(record.num_prefill_tokens + record.num_decode_tokens)
            self.step_duration.labels(phase=record.phase).observe(record.duration_s)

    def on_finished(self, output: RequestOutput) -> None:
        reason = (output.outputs[0].finish_reason if output.outputs else None) or "abort"
        self.request_success.labels(finished_reason=reason).inc()
        m = output.metrics
        if m is None or reason == "abort":
            return
        self.e2e.observe(m.e2e_s)
        self.queue.observe(m.queue_s)
        if m.first_token_time is not None:
            self.ttft.observe(m.ttft_s)
            self.prefill.observe(m.prefill_s)
            self.decode.observe(m.decode_s)
        times = m.token_times
        for a, b in zip(times, times[1:], strict=False):
            self.itl.observe(b - a)

    # -- exposition ------------------------------------------------------------------
    def render(self) -> bytes:
        return generate_latest(self.registry)
