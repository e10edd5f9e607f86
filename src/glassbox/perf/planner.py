"""``glassbox plan``: assemble memory fit, prefill, decode, TTFT, concurrency and rate rows into one dict.

The concurrency and rate rows come from perf/load_rows.py: the engine's real Scheduler and BlockManager
on a virtual clock, each step timed by ``cost_model.step_time``.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from functools import partial
from typing import Any

from glassbox.perf.cost_model import PhaseCost, decode_cost, prefill_cost, step_cost, step_time
from glassbox.perf.engine_profiles import EngineProfile, get_engine
from glassbox.perf.hardware import HardwareSpec, get_hardware
from glassbox.perf.load_rows import concurrency_rows, rate_rows
from glassbox.perf.memory_plan import kv_bytes_per_element, plan_memory
from glassbox.perf.model_facts import ModelFacts, load_model_facts
from glassbox.perf.quant import QuantScheme, resolve_scheme


@dataclass(frozen=True)
class PlanRequest:
    """What ``glassbox plan`` was asked; validated in ``__post_init__`` (errors name the flag)."""

    model: str
    hardware: str
    quant: str = "native"
    engine: str = "glassbox"
    prompt_tokens: int = 1024
    output_tokens: int = 256
    context_tokens: int = 0  # already in the KV cache before the request (llama-bench -d)
    concurrency: tuple[int, ...] = (1, 4, 16)
    rates: tuple[float, ...] = field(default_factory=tuple)  # requests / second (Poisson)
    memory_utilization: float = 0.9
    kv_cache_dtype: str = "auto"

    def __post_init__(self) -> None:
        if self.prompt_tokens < 1:
            raise ValueError(f"--prompt-tokens must be >= 1, got {self.prompt_tokens}")
        if self.output_tokens < 1:
            raise ValueError(f"--output-tokens must be >= 1, got {self.output_tokens}")
        if self.context_tokens < 0:
            raise ValueError(f"--context must be >= 0, got {self.context_tokens}")
        if not self.concurrency or any(c < 1 for c in self.concurrency):
            raise ValueError(f"--concurrency must be a comma list of integers >= 1, got {self.concurrency}")
        if any(not r > 0 for r in self.rates):
            raise ValueError(f"--rate must be a comma list of numbers > 0, got {self.rates}")
        if not 0.0 < self.memory_utilization <= 1.0:
            raise ValueError(f"--memory-utilization must be in (0, 1], got {self.memory_utilization}")

    @property
    def seq_len(self) -> int:
        return self.context_tokens + self.prompt_tokens + self.output_tokens


@dataclass(frozen=True)
class Setup:
    """Everything a cost evaluation needs, resolved once."""

    facts: ModelFacts
    scheme: QuantScheme
    hw: HardwareSpec
    engine: EngineProfile
    kv_bytes: float  # per K/V element

    def prefill(self, req: PlanRequest, engine: EngineProfile | None = None) -> PhaseCost:
        eng = engine or self.engine
        return prefill_cost(
            self.facts, self.scheme, self.hw, eng, req.prompt_tokens, req.context_tokens, self.kv_bytes
        )

    def step_time_fn(self) -> Callable[[Sequence[tuple[int, int]]], float]:
        """``cost_model.step_time`` bound to this setup: what the SimulatedExecutor calls per step."""
        return partial(
            step_time, self.facts, self.scheme, self.hw, self.engine, kv_bytes_per_element=self.kv_bytes
        )

    def decode_step(self, batch: int, context: int, engine: EngineProfile | None = None) -> float:
        eng = engine or self.engine
        return step_cost(self.facts, self.scheme, self.hw, eng, [(1, context)] * batch, self.kv_bytes).seconds


def resolve(req: PlanRequest) -> Setup:
    facts = load_model_facts(req.model)
    hw = get_hardware(req.hardware)
    engine = get_engine(req.engine)
    scheme = resolve_scheme(req.quant, facts.native_quant, facts.dtype, engine.gguf, engine.mixed_rest_format)
    return Setup(facts, scheme, hw, engine, kv_bytes_per_element(req.kv_cache_dtype, facts.dtype))


def plan(req: PlanRequest) -> dict[str, Any]:
    """The full plan as a JSON-ready dict (see plan_cli for the keys users rely on)."""
    s = resolve(req)
    ceiling = s.engine.ceiling()
    memory = plan_memory(
        s.facts,
        s.scheme,
        s.hw,
        s.engine,
        req.seq_len,
        max(req.concurrency),
        req.prompt_tokens,
        req.memory_utilization,
        s.kv_bytes,
    )
    pre, pre_ceil = s.prefill(req), s.prefill(req, ceiling)
    start = req.context_tokens + req.prompt_tokens
    steps = max(req.output_tokens - 1, 1)  # the first token comes out of the prefill
    dec = decode_cost(s.facts, s.scheme, s.hw, s.engine, 1, start, steps, s.kv_bytes)
    dec_ceil = decode_cost(s.facts, s.scheme, s.hw, ceiling, 1, start, steps, s.kv_bytes)
    ttft = s.engine.request_overhead_s + pre.seconds
    decode_s = dec.seconds if req.output_tokens > 1 else 0.0
    warnings = []
    if s.facts.max_context and req.seq_len > s.facts.max_context:
        warnings.append(
            f"{req.seq_len:,} tokens per sequence exceed the model's {s.facts.max_context:,}-token limit"
        )
    if not memory.fits:
        warnings.append(f"needs {memory.total / 2**30:,.1f} GiB of a {memory.budget / 2**30:,.1f} GiB budget")
    return {
        "warnings": warnings,
        "model": _model_dict(s.facts),
        "hardware": {
            "name": s.hw.name,
            "memory_gib": round(s.hw.memory_gib, 2),
            "bandwidth_gbs": s.hw.bandwidth_gbs,
            "tflops": s.hw.tflops,
            "unified_memory": s.hw.unified_memory,
            "source": s.hw.source,
        },
        "quant": {"requested": req.quant, "scheme": s.scheme.label, "formats": s.scheme.describe()},
        "engine": {
            "name": s.engine.name,
            "eta_bw": s.engine.eta_bw,
            "eta_flops": s.engine.eta_flops,
            "moe_flops_factor": s.engine.moe_flops_factor,
            "step_overhead_s": s.engine.step_overhead_s,
            "request_overhead_s": s.engine.request_overhead_s,
            "fitted_on": s.engine.fitted_on,
        },
        "workload": {
            "prompt_tokens": req.prompt_tokens,
            "output_tokens": req.output_tokens,
            "context_tokens": req.context_tokens,
            "memory_utilization": req.memory_utilization,
            "kv_cache_dtype": req.kv_cache_dtype,
        },
        "memory": memory.to_dict(),
        "prefill": {
            "tok_s": round(req.prompt_tokens / pre.seconds, 2),
            "ceiling_tok_s": round(req.prompt_tokens / pre_ceil.seconds, 2),
            "bound": pre.bound,
            "seconds": round(pre.seconds, 4),
            "steps": pre.steps,
        },
        "decode": {
            "tok_s": round(steps / dec.seconds, 2),
            "ceiling_tok_s": round(steps / dec_ceil.seconds, 2),
            "bound": dec.bound,
            "step_s": round(dec.seconds / steps, 5),
        },
        "ttft_s": round(ttft, 4),
        "e2e_s": round(ttft + decode_s, 4),
        "concurrency": concurrency_rows(req, s, memory),
        "rate": rate_rows(req, s, memory),
    }


def _model_dict(f: ModelFacts) -> dict[str, Any]:
    return {
        "name": f.name,
        "model_type": f.model_type,
        "total_params": f.total_params,
        "active_params": f.active_params,
        "layers": f.num_layers,
        "hidden_size": f.hidden_size,
        "attention": f.describe_attention(),
        "kv_heads": f.num_kv_heads,
        "head_dim": f.head_dim,
        "moe": {"experts": f.num_experts, "top_k": f.experts_per_token, "moe_layers": f.moe_layers}
        if f.is_moe
        else None,
        "native_quant": f.native_quant.describe() if f.native_quant else None,
        "notes": list(f.notes),
    }
