"""Memory plan: weights + KV cache (every live sequence) + recurrent state + activations + runtime
<= memory x utilization. Sizes in bytes internally; reported in GiB (2^30). With tensor parallelism
(``engine.tp``) it is one rank's (one box's): 1/N of the weights (norms whole), its KV heads' share of the
cache (perf/tensor_parallel.kv_share), the activations and runtime whole (conservative).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from glassbox.dtypes import element_bytes, kv_element_bytes, parse_dtype
from glassbox.models.facts import ModelFacts
from glassbox.perf.engine_profiles import EngineProfile
from glassbox.perf.hardware import GIB, HardwareSpec
from glassbox.perf.quant import GROUPS, QuantScheme
from glassbox.perf.tensor_parallel import kv_share

# What --kv-cache-dtype may plan ("auto": the model's dtype); canonical names, long spellings accepted.
KV_DTYPES = ("auto", "fp32", "bf16", "fp16", "fp8", "int8", "q8_0")


def kv_bytes_per_element(
    kv_cache_dtype: str, model_dtype: str, row_scale_head_dim: int | None = None
) -> float:
    """Bytes per cached K/V element; with ``row_scale_head_dim``, as glassbox's cache holds fp8/int8 (a
    float32 scale per token and head of that many elements: dtypes.kv_element_bytes), else one byte.
    Raises ValueError naming ``--kv-cache-dtype``."""
    key = parse_dtype(kv_cache_dtype, "--kv-cache-dtype", KV_DTYPES)
    name = model_dtype if key == "auto" else key
    return element_bytes(name) if row_scale_head_dim is None else kv_element_bytes(name, row_scale_head_dim)


def weight_bytes(facts: ModelFacts, scheme: QuantScheme, ranks: int = 1) -> float:
    """Resident weight bytes on one of ``ranks`` (a tied lm_head shares the embedding table)."""
    total = 0.0
    for group in GROUPS:
        if group == "lm_head" and facts.tie_word_embeddings:
            continue
        share = 1 if group == "norms" else ranks
        total += facts.params[group] * scheme.format_for(group).bytes_per_weight / share
    return total


def activation_bytes(facts: ModelFacts, engine: EngineProfile, prompt_tokens: int, num_seqs: int) -> float:
    """Peak activation workspace of one forward pass (bf16), plus fp32 logits for the sampled rows.

    A prefill chunk of T tokens holds about T x (4 x hidden + 2 x FFN width) values at once
    (residual, normed input, attention output, gate and up projections).
    """
    chunk = min(engine.max_batched_tokens or prompt_tokens, max(prompt_tokens, 1))
    per_token = 4 * facts.hidden_size + 2 * facts.ffn_width
    return chunk * per_token * 2.0 + num_seqs * facts.vocab_size * 4.0


@dataclass(frozen=True)
class MemoryPlan:
    """Where the memory goes for ``concurrency`` sequences of ``seq_len`` tokens each (bytes)."""

    weights: float
    kv_bytes_per_token: float
    kv_cache: float
    state: float
    activations: float
    runtime: float
    budget: float
    seq_len: int
    concurrency: int
    max_context_tokens: int  # longest sequence that fits at ``concurrency`` (capped at the model's limit)
    max_concurrency: int  # sequences of ``seq_len`` tokens that fit
    model_max_context: int
    state_bytes_per_seq: float = 0.0  # a hybrid model's recurrent state, one sequence (one rank's share)

    @property
    def overhead(self) -> float:
        return self.state + self.activations + self.runtime

    @property
    def total(self) -> float:
        return self.weights + self.kv_cache + self.overhead

    @property
    def fits(self) -> bool:
        return self.total <= self.budget

    def to_dict(self) -> dict[str, Any]:
        return {
            "weights_gib": round(self.weights / GIB, 3),
            "kv_bytes_per_token": round(self.kv_bytes_per_token),
            "kv_cache_gib": round(self.kv_cache / GIB, 3),
            "state_gib": round(self.state / GIB, 3),
            "state_bytes_per_seq": round(self.state_bytes_per_seq),
            "activations_gib": round(self.activations / GIB, 3),
            "runtime_gib": round(self.runtime / GIB, 3),
            "overhead_gib": round(self.overhead / GIB, 3),
            "total_gib": round(self.total / GIB, 3),
            "budget_gib": round(self.budget / GIB, 3),
            "fits": self.fits,
            "seq_len_tokens": self.seq_len,
            "concurrency": self.concurrency,
            "max_context_tokens": self.max_context_tokens,
            "max_concurrency": self.max_concurrency,
            "model_max_context": self.model_max_context,
        }


def plan_memory(
    facts: ModelFacts,
    scheme: QuantScheme,
    hw: HardwareSpec,
    engine: EngineProfile,
    seq_len: int,
    concurrency: int,
    prompt_tokens: int,
    memory_utilization: float,
    kv_element_bytes: float,
    spec_tokens: int = 0,
) -> MemoryPlan:
    """Plan memory for ``concurrency`` live sequences of ``seq_len`` tokens (context + prompt + output).
    With ``spec_tokens`` drafts per step a hybrid model's sequence holds a state per draft position too
    (the engine's scratch rows, engine/spec_states.py)."""
    ranks = engine.tp.size
    state_per_seq = facts.state_bytes_per_seq * (1 + spec_tokens) / ranks
    weights = weight_bytes(facts, scheme, ranks)
    kv_element_bytes *= kv_share(facts, ranks)  # this rank's KV heads
    activations = activation_bytes(facts, engine, prompt_tokens, concurrency)
    runtime = engine.runtime_gib * GIB
    budget = hw.memory_bytes * memory_utilization
    free = budget - weights - activations - runtime  # what KV and recurrent state may use
    model_max = facts.max_context or 1 << 30

    def per_seq(n_tokens: int) -> float:
        return facts.kv_bytes(n_tokens, kv_element_bytes) + state_per_seq

    max_conc = 0
    if free > 0:
        max_conc = int(free // per_seq(seq_len)) if per_seq(seq_len) > 0 else engine.max_num_seqs
    max_ctx = _max_tokens(lambda n: concurrency * per_seq(n) <= free, model_max) if free > 0 else 0
    return MemoryPlan(
        weights=weights,
        kv_bytes_per_token=facts.kv_bytes_per_token(kv_element_bytes),
        kv_cache=concurrency * facts.kv_bytes(seq_len, kv_element_bytes),
        state=concurrency * state_per_seq,
        activations=activations,
        runtime=runtime,
        budget=budget,
        seq_len=seq_len,
        concurrency=concurrency,
        max_context_tokens=max_ctx,
        max_concurrency=max_conc,
        model_max_context=facts.max_context,
        state_bytes_per_seq=state_per_seq,
    )


def _max_tokens(ok: Callable[[int], bool], limit: int) -> int:
    """Largest n in [0, limit] with ok(n) (ok is monotone: true then false)."""
    if ok(limit):
        return limit
    lo, hi = 0, limit  # ok(lo) holds or lo == 0; ok(hi) fails
    if not ok(0):
        return 0
    while hi - lo > 1:
        mid = (lo + hi) // 2
        if ok(mid):
            lo = mid
        else:
            hi = mid
    return lo
