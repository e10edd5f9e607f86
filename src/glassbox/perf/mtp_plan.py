"""What a multi-token-prediction (MTP) draft costs in a plan (``glassbox plan --mtp``): the model's own MTP
layer (Qwen3-Next / Qwen3.5: fc, one full-attention decoder layer with the model's layer-0 FFN, norms)
and the shared LM head run once per drafted token (engine/mtp_proposer.py: k passes a step, the first
after a catch-up of the accepted tokens, each one row per proposing sequence).

A pass of one row per sequence is memory-bound: it reads

- the weights once: fc (2 H x H), the attention layer (as one of the model's full-attention layers), the
  FFN's active share (the router, the shared expert and k routed experts of an MoE layer 0; the dense
  MLP otherwise), the norms (5 H), the LM head (V x H), each group at the plan's format for that group;
- per sequence, the MTP layer's K/V over its context (2 x kv heads x head_dim per token).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

from glassbox.models.facts import ModelFacts
from glassbox.perf.engine_profiles import EngineProfile
from glassbox.perf.hardware import HardwareSpec
from glassbox.perf.quant import QuantScheme


def mtp_weight_params(facts: ModelFacts) -> dict[str, float]:
    """Parameters one MTP pass reads, by the planner's weight groups."""
    spec = facts.hybrid
    if spec is None or spec.mtp_layers < 1 or spec.gdn is None:
        raise ValueError(f"--mtp: {facts.architecture} has no multi-token-prediction layers the engine runs")
    h, p = facts.hidden_size, facts.params
    attn = p["attention"] / max(1, spec.layer_mixers.count("full"))
    out = {"attention": attn + 2.0 * h * h, "norms": 5.0 * h, "lm_head": float(p["lm_head"])}  # + fc
    if facts.layer_moe and facts.layer_moe[0]:
        out["moe_shared"] = p["moe_shared"] / facts.moe_layers
        out["experts"] = float(facts.experts_per_token * facts.params_per_expert)
    else:
        out["mlp"] = p["mlp"] / max(1, facts.num_layers - facts.moe_layers)
    return out


def mtp_pass_seconds(
    facts: ModelFacts,
    scheme: QuantScheme,
    hw: HardwareSpec,
    engine: EngineProfile,
    kv_bytes_per_element: float,
    batch: Sequence[tuple[int, int]],  # [(rows, context), ...] of the proposing sequences
) -> float:
    """One MTP pass over ``batch``: its weight bytes once, each sequence's MTP K/V, at the engine's
    bandwidth."""
    weights = sum(n * scheme.format_for(g).bytes_per_weight for g, n in mtp_weight_params(facts).items())
    kv = sum(2 * facts.num_kv_heads * facts.head_dim * c * kv_bytes_per_element for _, c in batch)
    return (weights + kv) / (hw.bandwidth_bytes_s * engine.eta_bw)


def mtp_time_fn(
    facts: ModelFacts,
    scheme: QuantScheme,
    hw: HardwareSpec,
    engine: EngineProfile,
    kv_bytes_per_element: float,
    k: int,
) -> Callable[[Sequence[tuple[int, int]]], float]:
    """A step's proposals: ``k`` MTP passes over the proposing sequences."""
    mtp_weight_params(facts)  # the refusal, before any step
    return lambda batch: k * mtp_pass_seconds(facts, scheme, hw, engine, kv_bytes_per_element, batch)
