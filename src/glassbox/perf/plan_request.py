"""What ``glassbox plan`` was asked (PlanRequest) and everything a cost evaluation needs, resolved once
(Setup): the model's facts, the quantization scheme, the hardware and the engine profile."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field, replace
from functools import partial

from glassbox.models.facts import ModelFacts
from glassbox.perf.cost_model import PhaseCost, prefill_cost, step_time
from glassbox.perf.engine_profiles import EngineProfile, get_engine
from glassbox.perf.hardware import HardwareSpec
from glassbox.perf.memory_plan import kv_bytes_per_element
from glassbox.perf.model_presets import load_model_facts
from glassbox.perf.mtp_plan import mtp_time_fn, mtp_weight_params
from glassbox.perf.probe import get_hardware
from glassbox.perf.quant import QuantScheme, resolve_scheme
from glassbox.perf.tensor_parallel import TensorParallel, check_tp, get_interconnect


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
    spec_tokens: int = 0  # speculative decoding: drafts verified per decode step (0: off)
    acceptance_rate: float | None = None  # the chance that each draft is accepted, given the ones before
    draft_model: str | None = None  # drafts from this model (k passes a step), not n-gram lookup
    mtp: bool = False  # drafts from the model's own MTP layer (k passes a step: perf/mtp_plan.py)
    draft_quant: str = "native"
    tensor_parallel_size: int = 1  # ranks (boxes or GPUs), each holding 1/N of every layer
    interconnect: str | None = None  # the link between ranks (perf/tensor_parallel.INTERCONNECTS)

    def __post_init__(self) -> None:
        if self.tensor_parallel_size < 1:
            raise ValueError(f"--tensor-parallel-size must be >= 1, got {self.tensor_parallel_size}")
        if self.tensor_parallel_size > 1 and self.interconnect is None:
            raise ValueError("--tensor-parallel-size > 1 needs --interconnect (the link between ranks)")
        if self.interconnect is not None:
            get_interconnect(self.interconnect)  # names the choices
        if not 0 <= self.spec_tokens <= 32:
            raise ValueError(f"--spec-tokens must be in [0, 32], got {self.spec_tokens}")
        if self.spec_tokens and self.acceptance_rate is None:
            raise ValueError("--spec-tokens needs --acceptance-rate (the chance that each draft is accepted)")
        if self.acceptance_rate is not None:
            if not self.spec_tokens:
                raise ValueError("--acceptance-rate needs --spec-tokens >= 1")
            if not 0.0 <= self.acceptance_rate <= 1.0:  # also rejects NaN
                raise ValueError(f"--acceptance-rate must be in [0, 1], got {self.acceptance_rate}")
        if self.draft_model is not None and not self.spec_tokens:
            raise ValueError("--draft-model needs --spec-tokens and --acceptance-rate")
        if self.mtp and (not self.spec_tokens or self.draft_model is not None):
            raise ValueError("--mtp needs --spec-tokens and --acceptance-rate, and no --draft-model")
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
    draft: Setup | None = None  # speculative decoding's draft model (--draft-model), on the same hardware
    mtp: bool = False  # drafts from the model's MTP layer (--mtp)

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

    def draft_time_fn(self, k: int) -> Callable[[Sequence[tuple[int, int]]], float] | None:
        """What a step's proposals cost with a draft model: ``k`` of its decode passes over the proposing
        sequences, [(1, context), ...] (None without a draft model)."""
        if self.mtp:
            return mtp_time_fn(self.facts, self.scheme, self.hw, self.engine, self.kv_bytes, k)
        if self.draft is None:
            return None
        one = self.draft.step_time_fn()
        return lambda batch: k * one(batch)


def resolve(req: PlanRequest) -> Setup:
    facts = load_model_facts(req.model)
    hw = get_hardware(req.hardware)
    check_tp(facts, req.tensor_parallel_size)
    link = get_interconnect(req.interconnect) if req.interconnect else None
    engine = replace(get_engine(req.engine), tp=TensorParallel(req.tensor_parallel_size, link))
    scheme = resolve_scheme(req.quant, facts.native_quant, facts.dtype, engine.gguf, engine.mixed_rest_format)
    row_scales = facts.head_dim if engine.kv_row_scales else None
    draft = None
    if req.draft_model is not None:
        plain = replace(req, spec_tokens=0, acceptance_rate=None, draft_model=None)
        draft = resolve(replace(plain, model=req.draft_model, quant=req.draft_quant))
    kv_bytes = kv_bytes_per_element(req.kv_cache_dtype, facts.dtype, row_scales)
    if req.mtp:
        mtp_weight_params(facts)  # the refusal of a model without MTP layers, naming the flag
    return Setup(facts, scheme, hw, engine, kv_bytes, draft, req.mtp)
