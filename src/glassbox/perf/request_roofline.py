"""One request's prefill and decode held against this machine's roofline: the planner's own cost model
under the ``ideal`` profile (so that `trace`, the server's spans and `plan --hardware local` use one and
the same ceilings), at batch 1.

A measured rate above its ceiling means the hardware figure is too low, never that the engine beat
physics: ``judge`` marks it (``probe_wrong``) and every report that prints such a fraction says so.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from glassbox.models.facts import ModelFacts
from glassbox.perf.cost_model import step_cost
from glassbox.perf.engine_profiles import get_engine
from glassbox.perf.hardware import HardwareSpec
from glassbox.perf.quant import QuantScheme

PROBE_WRONG = (
    "a measured rate above 100% of its roofline ceiling means the hardware probe was wrong (too low: "
    "taken on a busy machine, or not the way this engine reads); re-run `glassbox hardware --probe "
    "--force` on a quiet machine"
)


@dataclass(frozen=True)
class RequestRoofline:
    """The ceilings of one model (``facts``, weights ``scheme``, compute ``dtype``, KV bytes per element)
    on one machine ``hw``."""

    facts: ModelFacts
    scheme: QuantScheme
    hw: HardwareSpec
    dtype: str
    kv_bytes: float

    def phases(
        self,
        prompt_tokens: int,
        cached_tokens: int,
        output_tokens: int,
        prefill_tok_s: float,
        decode_tok_s: float,
        sequences: int = 1,
    ) -> dict[str, dict[str, Any]]:
        """``prefill`` (absent when the prefix cache served the whole prompt) and ``decode``: each its
        ceiling (tok/s), bound and, when the phase ran any token, the measured ``fraction`` of it."""
        ideal = get_engine("ideal")
        out: dict[str, dict[str, Any]] = {}
        computed = prompt_tokens - cached_tokens  # a prefix-cache hit is not prefilled
        if computed > 0:
            pre = step_cost(
                self.facts, self.scheme, self.hw, ideal, [(computed, cached_tokens)], self.kv_bytes
            )
            out["prefill"] = judge(
                {
                    "ceiling_tok_s": computed / pre.seconds,
                    "bound": pre.bound,
                    "flops_per_token": pre.flops / computed,
                },
                prefill_tok_s,
            )
        context = prompt_tokens + output_tokens // 2
        dec = step_cost(self.facts, self.scheme, self.hw, ideal, [(1, context)], self.kv_bytes)
        decode = {"ceiling_tok_s": 1.0 / dec.seconds, "bound": dec.bound, "bytes_per_token": dec.bytes_moved}
        decoded = output_tokens - sequences  # each continuation's first token is prefill's
        out["decode"] = judge(decode, decode_tok_s) if decoded > 0 else {**decode, "limited_by": None}
        return out


def judge(phase: dict[str, Any], tok_s: float) -> dict[str, Any]:
    """Add ``fraction`` (measured / ceiling), ``limited_by`` and, above 1, ``probe_wrong``."""
    fraction = tok_s / phase["ceiling_tok_s"] if phase["ceiling_tok_s"] > 0 else 0.0
    phase["fraction"] = fraction
    # far under its ceiling a phase is paying for something the roofline does not count: on a small
    # model that is the host (Python, kernel dispatch), not bandwidth or FLOP/s
    phase["limited_by"] = phase["bound"] if fraction >= 0.5 else "overhead"
    if fraction > 1.0:
        phase["probe_wrong"] = True
    return phase


def percent(phase: dict[str, Any]) -> str:
    """'83%', or '113% (above 100%: the probe was wrong)' for a fraction over 1."""
    text = f"{phase['fraction'] * 100:.0f}%"
    return text + " (above 100%: the probe was wrong)" if phase.get("probe_wrong") else text
