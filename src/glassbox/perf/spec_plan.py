"""Speculative decoding in a plan: what verifying k drafts per decode step, each accepted with
probability a (given the ones before it), does to one request's decode speed.

A verification step reads the weights once and runs k + 1 query rows (the last token and the drafts, LM
head included); it yields the accepted drafts plus the token drawn after them, on average
sum_{i=0..k} a^i = (1 - a^(k+1)) / (1 - a) tokens (k + 1 at a = 1). The concurrency and rate rows get the
same steps from the simulator (perf/simulator.py ``DraftProposer``), which draws each acceptance. With a
draft model (``--draft-model``) a step also pays k of the draft's own decode passes, one row each (its
catch-up of one or two tokens, then k - 1 proposals), as engine/draft_model.py runs them.
"""

from __future__ import annotations

from typing import Any

from glassbox.perf.cost_model import step_cost
from glassbox.perf.plan_request import PlanRequest, Setup


def expected_tokens_per_step(k: int, a: float) -> float:
    """Tokens one verification step yields with ``k`` drafts accepted in turn with probability ``a``."""
    if a >= 1.0:
        return k + 1.0
    return (1.0 - a ** (k + 1)) / (1.0 - a)


def speculative_row(s: Setup, req: PlanRequest, plain_tok_s: float) -> dict[str, Any] | None:
    """One request's decode with speculation (None when the plan has no --spec-tokens)."""
    k, a = req.spec_tokens, req.acceptance_rate
    if not k or a is None:
        return None
    per_step = expected_tokens_per_step(k, a)
    start = req.context_tokens + req.prompt_tokens
    tokens = max(req.output_tokens - 1, 1)
    # the step time is linear in context: four evenly spaced samples, as cost_model.decode_cost
    samples = [start + (tokens - 1) * (i + 0.5) / 4 for i in range(4)]
    costs = [
        step_cost(s.facts, s.scheme, s.hw, s.engine, [(k + 1, round(c))], s.kv_bytes, logit_rows=k + 1)
        for c in samples
    ]
    step_s = sum(c.seconds for c in costs) / len(costs)
    memory_s = sum(c.memory_s for c in costs)
    compute_s = sum(c.compute_s for c in costs)
    draft = s.draft_time_fn(k)
    draft_s = sum(draft([(1, round(c))]) for c in samples) / len(samples) if draft is not None else 0.0
    step_s += draft_s
    tok_s = per_step / step_s
    return {
        "spec_tokens": k,
        "acceptance_rate": a,
        "tokens_per_step": round(per_step, 4),
        "step_s": round(step_s, 6),
        "draft_s": round(draft_s, 6),  # of step_s: the draft model's passes (0 for n-gram drafts)
        "tok_s": round(tok_s, 2),
        "speedup": round(tok_s / plain_tok_s, 3) if plain_tok_s > 0 else None,
        "bound": "memory" if memory_s >= compute_s else "compute",
    }
