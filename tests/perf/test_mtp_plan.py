"""``glassbox plan --mtp``: an MTP draft pays one pass of the model's MTP layer and LM head per drafted
token (perf/mtp_plan.py), by hand for Qwen3.5-122B-A10B in bf16 on a DGX Spark."""

from __future__ import annotations

import pytest

from glassbox.perf.hardware import PRESETS as HARDWARE
from glassbox.perf.plan_request import PlanRequest, resolve
from glassbox.perf.spec_plan import speculative_row


def _request(**kw: object) -> PlanRequest:
    base = dict(model="qwen3.5-122b-a10b", hardware="dgx-spark", quant="bf16", engine="vllm", concurrency=[1])
    return PlanRequest(**(base | kw))  # type: ignore[arg-type]


def test_a_draft_reads_one_layer_and_the_lm_head() -> None:
    """H 3072, 32 q heads and 2 KV heads of 256, 256 experts (8 active) of width 1024, a shared expert of
    1024, vocabulary 248320; bf16 weights, a 1000-token context's MTP K/V in bf16."""
    h, v = 3072, 248320
    attention = h * 2 * 32 * 256 + 2 * h * 2 * 256 + 32 * 256 * h + 2 * 256  # q (+gate), k, v, o, q/k norms
    fc = 2 * h * h
    ffn = h * 256 + 3 * h * 1024 + h + 8 * 3 * h * 1024  # router, shared expert and its gate, 8 experts
    params = attention + fc + ffn + 5 * h + v * h  # + the five norms, the LM head
    kv = 2 * 2 * 256 * 1000 * 2
    s = resolve(_request(spec_tokens=2, acceptance_rate=0.7, mtp=True))
    bw = HARDWARE["dgx-spark"].bandwidth_bytes_s * s.engine.eta_bw
    fn = s.draft_time_fn(2)
    assert fn is not None
    assert fn([(1, 1000)]) == pytest.approx(2 * (params * 2 + kv) / bw, rel=1e-12)
    assert fn([(1, 1000), (1, 1000)]) == pytest.approx(2 * (params * 2 + 2 * kv) / bw, rel=1e-12)
    row = speculative_row(s, _request(spec_tokens=2, acceptance_rate=0.7, mtp=True), 30.0)
    assert row is not None and row["draft_s"] > 0


def test_mtp_flag_errors() -> None:
    with pytest.raises(ValueError, match="--mtp needs --spec-tokens"):
        _request(mtp=True)
    with pytest.raises(ValueError, match="--mtp: .* has no multi-token-prediction layers"):
        resolve(_request(model="nemotron-3-super-120b-a12b", spec_tokens=2, acceptance_rate=0.5, mtp=True))
