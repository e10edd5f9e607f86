"""The planner's tensor parallelism: the ring all-reduce formula, per-rank memory and step cost worked by
hand, the simulator on the same cost, and the published shape (TP2 nearly halving a memory-bound decode)."""

from __future__ import annotations

import argparse
import dataclasses
import json

import pytest

from glassbox.perf import plan_cli
from glassbox.perf.cost_model import step_cost
from glassbox.perf.memory_plan import plan_memory, weight_bytes
from glassbox.perf.model_presets import load_model_facts
from glassbox.perf.planner import PlanRequest, plan, resolve
from glassbox.perf.tensor_parallel import (
    INTERCONNECTS,
    Interconnect,
    TensorParallel,
    kv_share,
    ring_allgather_s,
    ring_allreduce_s,
)

LINK = Interconnect("test", 1e9, 1e-6, "made up")


def test_ring_allreduce_formula_by_hand() -> None:
    # 2 ranks: each sends half of 1 MB twice (reduce-scatter + all-gather) = 1 MB at 1 GB/s, 2 latency steps
    assert ring_allreduce_s(1e6, 2, LINK) == pytest.approx(1e-3 + 2e-6)
    # 4 ranks: 2 x 3/4 x 1 MB = 1.5 MB, 6 steps
    assert ring_allreduce_s(1e6, 4, LINK) == pytest.approx(1.5e-3 + 6e-6)
    assert ring_allgather_s(1e6, 4, LINK) == pytest.approx(0.75e-3 + 3e-6)
    assert ring_allreduce_s(1e6, 1, None) == 0.0
    assert INTERCONNECTS["200gbe-roce"].bandwidth_bytes_s == 21e9  # nccl-tests busbw on two Sparks
    assert INTERCONNECTS["nvlink"].bandwidth_bytes_s > 10 * INTERCONNECTS["pcie"].bandwidth_bytes_s


def test_kv_share_splits_or_replicates_heads() -> None:
    f = load_model_facts("llama-3.3-70b")  # 8 KV heads
    assert f.num_kv_heads == 8
    assert kv_share(f, 1) == 1.0 and kv_share(f, 2) == 0.5 and kv_share(f, 4) == 0.25
    few = dataclasses.replace(f, num_kv_heads=2)
    assert kv_share(few, 4) == 0.5  # one head per rank: each of the 2 heads held by 2 ranks


def test_step_cost_per_rank_by_hand() -> None:
    s = resolve(PlanRequest("llama-3.1-8b", "dgx-spark", quant="bf16"))
    f, eng = s.facts, s.engine
    tp2 = dataclasses.replace(eng, tp=TensorParallel(2, LINK))
    batch = [(1, 1000), (1, 3000)]
    one = step_cost(f, s.scheme, s.hw, eng, batch, s.kv_bytes)
    two = step_cost(f, s.scheme, s.hw, tp2, batch, s.kv_bytes)
    # communication: 2 all-reduces per layer + the embedding's of 2 tokens x hidden bf16, logits gathered
    ar = ring_allreduce_s(2 * f.hidden_size * 2.0, 2, LINK)
    expect_comm = (2 * f.num_layers + 1) * ar + ring_allgather_s(2 * f.vocab_size * 4.0, 2, LINK)
    assert two.comm_s == pytest.approx(expect_comm)
    # weights: all but the norms halved; the KV read and written halved (8 KV heads split)
    norms = f.params["norms"] * 2.0
    assert two.bytes_moved == pytest.approx((one.bytes_moved - norms) / 2 + norms, rel=1e-9)
    assert two.flops == pytest.approx(one.flops / 2)
    assert two.seconds == pytest.approx(max(two.memory_s, two.compute_s) + two.overhead_s + two.comm_s)


def test_memory_per_rank() -> None:
    s = resolve(PlanRequest("llama-3.3-70b", "dgx-spark", quant="nvfp4"))
    tp4 = dataclasses.replace(s.engine, tp=TensorParallel(4, LINK))
    norms = s.facts.params["norms"] * s.scheme.format_for("norms").bytes_per_weight
    full = weight_bytes(s.facts, s.scheme)
    assert weight_bytes(s.facts, s.scheme, 4) == pytest.approx((full - norms) / 4 + norms)
    m1 = plan_memory(s.facts, s.scheme, s.hw, s.engine, 8192, 4, 1024, 0.9, s.kv_bytes)
    m4 = plan_memory(s.facts, s.scheme, s.hw, tp4, 8192, 4, 1024, 0.9, s.kv_bytes)
    assert m4.kv_bytes_per_token == pytest.approx(m1.kv_bytes_per_token / 4)
    assert m4.kv_cache == pytest.approx(m1.kv_cache / 4)
    assert m4.max_concurrency > 4 * m1.max_concurrency  # a quarter of the weights frees room for KV too


def _run_json(capsys: pytest.CaptureFixture[str], *argv: str) -> dict:
    parser = argparse.ArgumentParser(prog="glassbox")
    plan_cli.add_parser(parser.add_subparsers())
    args = parser.parse_args(list(argv))
    assert args.func(args) == 0
    return json.loads(capsys.readouterr().out)


def test_tp2_nearly_halves_memory_bound_decode_on_sparks(capsys: pytest.CaptureFixture[str]) -> None:
    """Published DGX Spark pairs (issue 20): TP2 over 200 GbE nearly halves TPOT for memory-bound decode."""
    out = _run_json(
        capsys,
        "plan",
        "llama-3.3-70b",
        "--hardware",
        "dgx-spark",
        "--quant",
        "nvfp4",
        "--interconnect",
        "200gbe-roce",
        "--tensor-parallel-size",
        "2",
        "--concurrency",
        "2",
        "--json",
    )
    rows = {r["tensor_parallel_size"]: r for r in out["tensor_parallel"]}
    assert sorted(rows) == [1, 2, 4]
    one, two, four = rows[1], rows[2], rows[4]
    assert out["decode"]["bound"] == "memory"
    assert 0.5 < two["tpot_ms"] / one["tpot_ms"] < 0.6
    assert two["tpot_ms"] < one["tpot_ms"] and four["tpot_ms"] < two["tpot_ms"]
    assert one["decode_comm_share"] == 0.0 < two["decode_comm_share"] < four["decode_comm_share"]
    assert two["weights_gib_per_rank"] == pytest.approx(one["weights_gib_per_rank"] / 2, rel=0.01)
    assert two["allreduce_us_per_layer_decode"] > 0
    assert two["allreduce_us_per_layer_prefill"] > 10 * two["allreduce_us_per_layer_decode"]
    # the requested TP is the plan's own: its decode and simulated concurrency rows are TP2's
    assert out["decode"]["tok_s"] == pytest.approx(two["decode_tok_s"], rel=1e-6)
    assert out["concurrency"][0]["aggregate_tok_s"] == two["aggregate_tok_s"]
    assert out["memory"]["weights_gib"] == two["weights_gib_per_rank"]


def test_simulator_uses_the_tp_cost() -> None:
    base = PlanRequest("llama-3.1-8b", "dgx-spark", quant="bf16", concurrency=(4,), output_tokens=32)
    one = plan(base)
    slow = plan(dataclasses.replace(base, tensor_parallel_size=2, interconnect="pcie"))
    fast = plan(dataclasses.replace(base, tensor_parallel_size=2, interconnect="nvlink"))
    agg = [p["concurrency"][0]["aggregate_tok_s"] for p in (one, slow, fast)]
    assert agg[0] < agg[1] < agg[2]  # split weights help; a faster link helps more


def test_tp_flags_are_checked(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(ValueError, match="--interconnect"):
        PlanRequest("llama-3.1-8b", "dgx-spark", tensor_parallel_size=2)
    with pytest.raises(ValueError, match="--interconnect must be one of"):
        PlanRequest("llama-3.1-8b", "dgx-spark", tensor_parallel_size=2, interconnect="carrier-pigeon")
    with pytest.raises(ValueError, match="attention heads"):
        plan(PlanRequest("llama-3.1-8b", "dgx-spark", tensor_parallel_size=3, interconnect="nvlink"))
    assert plan(PlanRequest("llama-3.1-8b", "dgx-spark"))["tensor_parallel"] == []


def test_collective_call_and_step_sync_by_hand() -> None:
    # call 10 us + 2 ring steps of 1 us + 1 MB at 1 GB/s (2 ranks); an all-gather: 1 step, half the bytes
    link = Interconnect("t", 1e9, 1e-6, "made up", call_s=10e-6, step_sync_s=1e-3)
    assert ring_allreduce_s(1e6, 2, link) == pytest.approx(10e-6 + 2e-6 + 1e-3)
    assert ring_allgather_s(1e6, 2, link) == pytest.approx(10e-6 + 1e-6 + 0.5e-3)
    # a step: layers x 2 all-reduces + the embedding's + the logits' all-gather + the sync, once
    from glassbox.perf.tensor_parallel import step_comm_s

    f = load_model_facts("llama-3.1-8b")
    tp = TensorParallel(2, link)
    act = f.hidden_size * 2.0
    want = (2 * f.num_layers + 1) * ring_allreduce_s(act, 2, link) + ring_allgather_s(
        f.vocab_size * 4.0, 2, link
    )
    assert step_comm_s(f, tp, 1, 1) == pytest.approx(want + 1e-3)


def test_spark_link_constants_follow_their_sources() -> None:
    # nccl-tests, 8 KB all-reduce on two GB10s: 27.8 us; a 48 KB all-reduce over four: 59 us (sources in
    # perf/tensor_parallel.py); the two fitted constants give both back within 1 us
    link = INTERCONNECTS["200gbe-roce"]
    assert ring_allreduce_s(8192, 2, link) == pytest.approx(27.8e-6, abs=1e-6)
    assert ring_allreduce_s(48 * 1024, 4, link) == pytest.approx(59e-6, abs=1e-6)
