"""Async output (the CUDA default): a step's text work runs during the next step. Checked on the CPU
against the same engine post-processing in its own step: every output identical, logprobs within 1e-5 (a row
may share a step with other batch mates: see test_async_output_matches_sync)."""

from __future__ import annotations

import random
from pathlib import Path

import pytest
from tiny_models import build_tiny_model

from glassbox import LLM, SamplingParams
from glassbox.outputs import RequestOutput


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return build_tiny_model("qwen3", tmp_path_factory.mktemp("async-output"))


def _engine(model_dir: Path, async_output: bool, **kw: object) -> LLM:
    llm = LLM(str(model_dir), dtype="float32", max_model_len=160, async_output=async_output, **kw)
    assert llm.engine.async_output is async_output
    return llm


def _workload(llm: LLM, seed: int) -> tuple[list[list[int]], list[SamplingParams]]:
    """Requests that end every way: stop strings, stop tokens, EOS, length, the model length; n > 1,
    logprobs, penalties, seeded sampling (every random request has a seed)."""
    rng = random.Random(seed)
    free = llm.generate(["def f(x):"], SamplingParams(temperature=0, max_tokens=24, ignore_eos=True))[0]
    stop_text = free.text[5:8]
    eos = min(llm.engine.tokenizer.eos_token_ids)
    prompts, params = [], []
    for i in range(24):
        prompts.append([rng.randrange(3, 400) for _ in range(rng.randrange(1, 60))])
        kind = i % 8
        kw: dict = {"max_tokens": rng.randrange(1, 40), "temperature": rng.choice([0.0, 0.9])}
        if kind == 0:
            kw.update(stop=[stop_text], temperature=0.0)
        elif kind == 1:
            kw.update(stop_token_ids=[free.token_ids[3]], min_tokens=2)
        elif kind == 2:
            kw.update(n=3, seed=i)
        elif kind == 3:
            kw.update(logprobs=2, stop=["e", "a"])
        elif kind == 4:
            kw.update(repetition_penalty=1.3, frequency_penalty=0.5, seed=i)
        elif kind == 5:
            kw.update(max_tokens=160 - len(prompts[-1]), ignore_eos=True)  # to the model's length
        elif kind == 6:
            kw.update(stop_token_ids=[eos], include_stop_str_in_output=True, stop=["\n"])
        # a request without a seed draws from the engine's shared generator, so its tokens depend on its
        # batch mates, and an async step holds a stop-string-ended row one step longer: seed them all
        kw.setdefault("seed", 1000 + i)
        params.append(SamplingParams(**kw))
    prompts[0] = list(free.prompt_token_ids)  # the stop string surely occurs in this one
    return prompts, params


def _summary(outs: list[RequestOutput]) -> list[tuple]:
    return [
        (c.text, c.token_ids, c.logprobs, c.finish_reason, c.stop_reason) for o in outs for c in o.outputs
    ]


@pytest.mark.parametrize("num_kv_blocks", [None, 24], ids=["roomy", "preempting"])
def test_async_output_matches_sync(model_dir: Path, num_kv_blocks: int | None) -> None:
    results = []
    for async_output in (False, True):
        llm = _engine(model_dir, async_output, max_num_seqs=16, num_kv_blocks=num_kv_blocks, block_size=8)
        prompts, params = _workload(llm, seed=3)
        counters = llm.engine.counters
        results.append(
            (_summary(llm.generate(prompts, params)), counters.generation_tokens, counters.finished)
        )
        llm.engine.check_integrity()
        assert llm.engine.block_manager.num_free_blocks == llm.engine.block_manager.num_blocks
        if num_kv_blocks is not None:
            assert llm.engine.scheduler.num_preemptions > 0
    sync, overlapped = results
    assert [r[3] for r in sync[0]].count("stop") >= 3  # the workload really ends on stops
    # an async step holds a stop-ended row's blocks (and its row in the batch) one step longer, so rows share
    # steps with other batch mates: a float32 GEMM's sums over a row may run in another order for another
    # batch height (oneDNN/MKL pick their blocking by M; without AMX they do on this model), and with
    # preemption a recomputed row's logits come from the prefill path: ~1e-6 apart. Everything else must
    # be identical.
    assert [r[:2] + r[3:] for r in overlapped[0]] == [r[:2] + r[3:] for r in sync[0]]
    for a, b in zip(overlapped[0], sync[0], strict=True):
        for x, y in zip(a[2] or [], b[2] or [], strict=True):
            assert x.keys() == y.keys() and all(abs(x[t] - y[t]) < 1e-5 for t in x)
    # a sequence ended by a stop string was already in the next step: that token is dropped, not counted
    assert overlapped[1:] == sync[1:]


def test_outputs_arrive_one_step_later(model_dir: Path) -> None:
    sp = SamplingParams(temperature=0, max_tokens=3, ignore_eos=True)
    seen = {}
    for async_output in (False, True):
        engine = _engine(model_dir, async_output).engine
        engine.add_request("r", [5, 6, 7], sp)
        per_step = []
        while engine.has_unfinished_requests():
            per_step.append([len(o.outputs[0].token_ids) for o in engine.step()])
        seen[async_output] = per_step
    assert seen[False] == [[1], [2], [3]]
    assert seen[True] == [[], [1], [2], [3]]  # the last one comes from a step with nothing to schedule


def test_abort_with_text_work_pending(model_dir: Path) -> None:
    engine = _engine(model_dir, True).engine
    engine.add_request("ends", [5, 6, 7], SamplingParams(temperature=0, max_tokens=2, ignore_eos=True))
    engine.add_request("runs", [8, 9], SamplingParams(temperature=0, max_tokens=50, ignore_eos=True))
    engine.step()
    engine.step()  # "ends" sampled its last token: off the scheduler, its text still to do
    assert engine.get_sequences("ends")[0].is_finished
    out = engine.abort_request("ends")
    assert out is not None and out.finished and out.finish_reason == "length"
    assert len(out.outputs[0].token_ids) == 2 and out.outputs[0].text
    out = engine.abort_request("runs")
    assert out is not None and out.finish_reason == "abort"
    assert engine.step() == [] and not engine.has_work and not engine.has_unfinished_requests()
    engine.check_integrity()
    assert engine.block_manager.num_free_blocks == engine.block_manager.num_blocks


def test_serving_leaves_a_core_to_the_frontend_on_light_steps(
    model_dir: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """reserve_frontend_core (what AsyncEngine does on CPU): small steps run on one thread fewer, heavy
    ones (here a 40-token prefill, with the threshold scaled to the tiny model) on all of them."""
    import torch

    from glassbox.engine import torch_executor

    original = torch.get_num_threads()
    if original < 2:
        pytest.skip("needs at least two threads")
    try:
        engine = _engine(model_dir, False).engine
        ex = engine.executor
        monkeypatch.setattr(torch_executor, "LIGHT_STEP_FLOPS", 20 * ex.flops_per_token)
        engine.add_request("before", [5, 6, 7], SamplingParams(temperature=0, max_tokens=1))
        engine.step()
        assert torch.get_num_threads() == original  # not serving: every step on all threads
        ex.reserve_frontend_core()
        assert ex.light_threads == original - 1
        engine.add_request("light", [5, 6, 7], SamplingParams(temperature=0, max_tokens=2))
        engine.step()
        assert torch.get_num_threads() == original - 1
        engine.add_request("heavy", [5 + i % 50 for i in range(40)], SamplingParams(max_tokens=1))
        engine.step()
        assert torch.get_num_threads() == original
    finally:
        torch.set_num_threads(original)
