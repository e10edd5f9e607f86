"""The simulator runs the engine's own scheduling policy: same batches as the real engine, step by step."""

from __future__ import annotations

import random
from pathlib import Path

import pytest
from tiny_models import build_tiny_model

from glassbox import LLM, SamplingParams
from glassbox.perf.simulator import SimSettings, percentile, simulate


@pytest.mark.parametrize(
    ("kwargs", "num_blocks", "preempts"),
    [
        ({"max_num_seqs": 4}, 200, False),
        ({"max_num_seqs": 6, "max_num_batched_tokens": 50}, 200, False),
        ({"max_num_seqs": 8}, 11, True),  # two running sequences grow to 6 blocks each: 12 > 11
    ],
)
def test_simulated_batches_match_the_real_engine(
    tmp_path: Path, kwargs: dict, num_blocks: int, preempts: bool
) -> None:
    d = build_tiny_model("llama", tmp_path)
    prompt_tokens, output_tokens, n = 40, 9, 12
    llm = LLM(str(d), dtype="float32", num_kv_blocks=num_blocks, block_size=8, **kwargs)
    rng = random.Random(0)
    prompts = [[rng.randrange(5, 500) for _ in range(prompt_tokens)] for _ in range(n)]
    llm.generate(prompts, SamplingParams(temperature=0, max_tokens=output_tokens, ignore_eos=True))
    real = [(r.num_prefill_tokens, r.num_decode_tokens) for r in llm.engine.step_records]

    settings = SimSettings(
        num_kv_blocks=num_blocks,
        block_size=8,
        max_num_seqs=kwargs["max_num_seqs"],
        max_num_batched_tokens=kwargs.get("max_num_batched_tokens", 2048),
    )
    sim = simulate(lambda batch: 1e-3, settings, prompt_tokens, output_tokens, n, concurrency=n)
    assert sim.trace == real
    assert sim.preemptions == llm.engine.scheduler.num_preemptions
    assert (sim.preemptions > 0) == preempts


def test_closed_loop_throughput_rises_with_concurrency_until_saturation() -> None:
    # weights dominate a step (10 ms) and each token adds 0.1 ms: batching amortizes the weight read
    def step(batch: list[tuple[int, int]] | tuple) -> float:
        return 0.010 + 1e-4 * sum(n for n, _ in batch)

    settings = SimSettings(num_kv_blocks=10_000)
    agg = [simulate(step, settings, 100, 50, 64, concurrency=c).aggregate_tok_s for c in (1, 4, 16)]
    assert agg[0] < agg[1] < agg[2]
    # batch 1: one token per 10.1 ms step once decoding, prefill aside
    assert 80 < agg[0] < 100


def test_poisson_overload_queues_into_the_tail() -> None:
    def step(batch: list[tuple[int, int]] | tuple) -> float:
        return 0.010 + 1e-3 * sum(n for n, _ in batch)

    settings = SimSettings(num_kv_blocks=10_000, max_num_seqs=2)
    light = simulate(step, settings, 200, 20, 40, rate=0.5)
    heavy = simulate(step, settings, 200, 20, 40, rate=50.0)
    assert all(r.finished is not None for r in heavy.requests)  # overload queues, nothing lost
    assert percentile(heavy.ttfts(), 0.99) > 5 * percentile(light.ttfts(), 0.99)


def test_request_that_cannot_fit_is_refused() -> None:
    with pytest.raises(ValueError, match="does not fit"):
        simulate(lambda b: 1e-3, SimSettings(num_kv_blocks=4, block_size=16), 100, 10, 1, concurrency=1)
