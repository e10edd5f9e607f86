"""The real engine and the simulator run one step loop (engine/core.py): for the same requests and the same
sampled tokens they take identical batches, step by step, and end every request at the same token for the
same reason (stop token, EOS, length), through chunked prefill and preemption."""

from __future__ import annotations

from pathlib import Path

import pytest
from tiny_models import build_tiny_model

from glassbox import LLM, SamplingParams
from glassbox.perf.simulator import SimRequestSpec, SimSettings, run_requests

NUM_REQUESTS = 12


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return build_tiny_model("llama", tmp_path_factory.mktemp("core"))


def _prompts() -> list[list[int]]:
    return [[(37 * i + 11 * j) % 480 + 5 for j in range(8 + 7 * i)] for i in range(NUM_REQUESTS)]


def _workload(model_dir: Path) -> tuple[list[list[int]], list[SamplingParams], int]:
    """Prompts and params whose ends are known from a free greedy run: an EOS token, per-request stop
    tokens (one guarded by min_tokens), and plain length ends."""
    prompts = _prompts()
    free = LLM(str(model_dir), dtype="float32").generate(
        prompts, SamplingParams(temperature=0, max_tokens=14, ignore_eos=True)
    )
    eos = free[0].token_ids[4]  # request 0 (and any other that emits it) ends at EOS
    params = []
    for i, out in enumerate(free):
        if i % 4 == 0:
            params.append(SamplingParams(temperature=0, max_tokens=14))  # EOS or length
        elif i % 4 == 1:
            stop = out.token_ids[6]
            params.append(
                SamplingParams(temperature=0, max_tokens=14, stop_token_ids=[stop], ignore_eos=True)
            )
        elif i % 4 == 2:
            stop = out.token_ids[1]  # a stop token inside min_tokens does not end the sequence
            params.append(
                SamplingParams(
                    temperature=0, max_tokens=14, stop_token_ids=[stop], min_tokens=5, ignore_eos=True
                )
            )
        else:
            params.append(SamplingParams(temperature=0, max_tokens=3 + i, ignore_eos=True))
    return prompts, params, eos


@pytest.mark.parametrize("async_output", [False, True], ids=["sync", "async-output"])
def test_engine_and_simulator_take_the_same_steps_and_end_at_the_same_tokens(
    model_dir: Path, async_output: bool
) -> None:
    prompts, params, eos = _workload(model_dir)
    kw = dict(num_kv_blocks=22, block_size=8, max_num_seqs=6, max_num_batched_tokens=40)
    llm = LLM(str(model_dir), dtype="float32", async_output=async_output, **kw)  # type: ignore[arg-type]
    engine = llm.engine
    engine.tokenizer.eos_token_ids.clear()
    engine.tokenizer.eos_token_ids.add(eos)  # the set the core and the sampler read
    engine.core.trace = []
    outs = llm.generate(prompts, params)
    real = engine.core.trace

    # the workload exercises what it claims to
    assert engine.scheduler.num_preemptions > 0
    assert any(r.phase == "mixed" for r in engine.step_records), "no chunk shared a step with decodes"
    assert any(len(p) > kw["max_num_batched_tokens"] for p in prompts), "no prompt was chunked"
    reasons = {(o.finish_reason, o.outputs[0].stop_reason is None) for o in outs}
    assert ("stop", True) in reasons, "no request ended at EOS"
    assert ("stop", False) in reasons, "no request ended at a stop token"
    assert ("length", True) in reasons, "no request ended at its length"

    specs = [
        SimRequestSpec(p, sp, script=o.token_ids, request_id=o.request_id)
        for p, sp, o in zip(prompts, params, outs, strict=True)
    ]
    settings = SimSettings(
        num_kv_blocks=engine.executor.kv_plan.num_blocks,
        block_size=kw["block_size"],
        max_num_seqs=kw["max_num_seqs"],
        max_num_batched_tokens=kw["max_num_batched_tokens"],
        max_model_len=engine.max_model_len,
    )
    sim = run_requests(specs, lambda batch: 1e-3, settings, eos_token_ids=frozenset({eos}), record=True)

    assert len(sim.step_traces) == len(real)
    for i, (s, r) in enumerate(zip(sim.step_traces, real, strict=True)):
        assert s.batch == r.batch, f"step {i}: the simulator scheduled another batch"
        assert s.ended == r.ended, f"step {i}: the simulator ended other sequences"
    assert sim.preemptions == engine.scheduler.num_preemptions
    assert [r.finish_reason for r in sim.requests] == [o.finish_reason for o in outs]
    assert [r.output_tokens for r in sim.requests] == [len(o.token_ids) for o in outs]
