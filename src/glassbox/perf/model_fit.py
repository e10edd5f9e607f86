"""What one served model holds in memory, from the planner's memory plan (torch-free): its weights as the
engine keeps them, its KV cache as the engine sizes it, the activations of one step and the runtime.

The multi-model server (server/router.py) asks this before it loads a model, to check that it fits beside
the models already loaded; `glassbox show` reports it. The weights come from perf/memory_plan.weight_bytes
over the checkpoint's own formats, the activations from activation_bytes, the runtime from the engine's
profile (perf/engine_profiles.py: glassbox-cpu or glassbox), the KV cache from engine/kv_plan.py's rules
(the same functions the engine sizes its cache with) times ModelFacts' KV bytes per token.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from glassbox.config import EngineConfig
from glassbox.dtypes import canonical
from glassbox.engine.kv_plan import blocks_that_fit, cpu_kv_budget, default_kv_tokens
from glassbox.models.facts import ModelFacts
from glassbox.perf.engine_profiles import get_engine
from glassbox.perf.hardware import GIB
from glassbox.perf.memory_plan import activation_bytes, kv_bytes_per_element, weight_bytes
from glassbox.perf.quant import resolve_scheme

CPU_BATCHED_TOKENS = 2048  # EngineConfig: --max-num-batched-tokens' default on the CPU (8192 on CUDA)


@dataclass(frozen=True)
class Footprint:
    """Bytes one served model holds (its plan, before it is loaded)."""

    weights: float
    kv_cache: float
    kv_blocks: int
    kv_tokens: int
    activations: float
    runtime: float
    max_model_len: int

    @property
    def total(self) -> float:
        return self.weights + self.kv_cache + self.activations + self.runtime

    def to_dict(self) -> dict[str, Any]:
        return {
            "weights_gib": round(self.weights / GIB, 3),
            "kv_cache_gib": round(self.kv_cache / GIB, 3),
            "kv_cache_tokens": self.kv_tokens,
            "activations_gib": round(self.activations / GIB, 3),
            "runtime_gib": round(self.runtime / GIB, 3),
            "total_gib": round(self.total / GIB, 3),
            "max_model_len": self.max_model_len,
        }

    def describe(self) -> str:
        """One line of the numbers (for a refusal)."""
        g = GIB
        return (
            f"{self.total / g:.2f} GiB (weights {self.weights / g:.2f} + KV cache {self.kv_cache / g:.2f} for "
            f"{self.kv_tokens:,} tokens + activations {self.activations / g:.2f} + runtime {self.runtime / g:.2f})"
        )


def footprint(facts: ModelFacts, config: EngineConfig, device: str, available_ram: int) -> Footprint:
    """What ``facts`` served with ``config`` holds on ``device`` ("cpu" or "cuda"); ``available_ram``
    caps the CPU cache as the engine caps it (engine/kv_plan.cpu_kv_budget)."""
    engine = get_engine("glassbox-cpu" if device == "cpu" else "glassbox")
    dtype = _engine_dtype(config.dtype, facts.dtype, device)
    scheme = resolve_scheme("native", facts.native_quant, dtype, engine.gguf, engine.mixed_rest_format)
    limit = facts.max_positions
    max_len = min(config.max_model_len or limit, limit)
    row_scales = facts.head_dim if engine.kv_row_scales else None
    per_token = facts.kv_bytes_per_token(kv_bytes_per_element(config.kv_cache_dtype, dtype, row_scales))
    bs = config.block_size
    if config.num_kv_blocks is not None:
        blocks = config.num_kv_blocks
    elif config.kv_cache_memory_gib is not None:
        blocks = blocks_that_fit(config.kv_cache_memory_gib * GIB, per_token, bs)
    elif device == "cpu":
        budget = cpu_kv_budget(per_token, bs, max_len, config.max_num_seqs, available_ram)
        blocks = blocks_that_fit(budget, per_token, bs)
    else:  # the router gives each model on a GPU this many blocks (its default would take the device)
        blocks = -(-default_kv_tokens(max_len, config.max_num_seqs) // bs)
    blocks = max(1, blocks)
    batched = config.max_num_batched_tokens or (CPU_BATCHED_TOKENS if device == "cpu" else 8192)
    return Footprint(
        weights=weight_bytes(facts, scheme),
        kv_cache=blocks * round(per_token * bs),
        kv_blocks=blocks,
        kv_tokens=blocks * bs,
        activations=activation_bytes(facts, engine, batched, min(config.max_num_seqs, batched)),
        runtime=engine.runtime_gib * GIB,
        max_model_len=max_len,
    )


def _engine_dtype(requested: str, stored: str, device: str) -> str:
    """The engine's weights dtype (engine/device.resolve_dtype): --dtype, else the checkpoint's (fp16 runs
    as bf16 on the CPU)."""
    if requested != "auto":
        return canonical(requested)
    return "bf16" if stored == "fp16" and device == "cpu" else stored
