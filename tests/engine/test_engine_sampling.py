"""Sampling, stopping and request validation through the real engine on a tiny model."""

from __future__ import annotations

from pathlib import Path

import pytest
from tiny_models import build_tiny_model

from glassbox import LLM, SamplingParams


@pytest.fixture(scope="module", params=[False, True], ids=["sync-output", "async-output"])
def llm(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> LLM:
    """The engine with outputs post-processed in its step, and during the next step (as on CUDA)."""
    d = build_tiny_model("llama", tmp_path_factory.mktemp("sampling"))
    return LLM(str(d), dtype="float32", max_num_seqs=8, max_model_len=512, async_output=request.param)


PROMPT = "def fibonacci(n):\n    "


def test_seeded_sampling_is_reproducible_regardless_of_batch_mates(llm: LLM) -> None:
    sp = SamplingParams(temperature=1.0, seed=1234, max_tokens=16, ignore_eos=True)
    alone = llm.generate([PROMPT], sp)[0].token_ids
    others = SamplingParams(temperature=0.8, max_tokens=20, ignore_eos=True)
    mixed = llm.generate(["x = 1", PROMPT, "class A:"], [others, sp, others])[1].token_ids
    assert alone == mixed
    different = llm.generate(
        [PROMPT], SamplingParams(temperature=1.0, seed=99, max_tokens=16, ignore_eos=True)
    )
    assert different[0].token_ids != alone
    llm.engine.check_integrity()


def test_top_k_1_equals_greedy(llm: LLM) -> None:
    greedy = llm.generate([PROMPT], SamplingParams(temperature=0, max_tokens=16, ignore_eos=True))[0]
    top1 = llm.generate(
        [PROMPT], SamplingParams(temperature=1.5, top_k=1, seed=5, max_tokens=16, ignore_eos=True)
    )[0]
    assert top1.token_ids == greedy.token_ids


def test_unseeded_sampling_follows_the_distribution(llm: LLM) -> None:
    # Repeated draws with a tiny top_p collapse to the argmax; with full mass they spread out.
    narrow = llm.generate(
        [PROMPT] * 6, SamplingParams(temperature=1.0, top_p=1e-6, max_tokens=4, ignore_eos=True)
    )
    assert len({tuple(o.token_ids) for o in narrow}) == 1
    wide = llm.generate([PROMPT] * 6, SamplingParams(temperature=2.0, max_tokens=8, ignore_eos=True))
    assert len({tuple(o.token_ids) for o in wide}) > 1


def test_stop_string_spanning_tokens_is_cut_exactly(llm: LLM) -> None:
    free = llm.generate([PROMPT], SamplingParams(temperature=0, max_tokens=40, ignore_eos=True))[0]
    text = free.text
    # choose a stop string that starts in one token and ends in a later one
    tok = llm.tokenizer
    pieces = [tok.decode([t]) for t in free.token_ids]
    start = len(pieces[0]) + len(pieces[1]) - 1 if len(pieces[1]) > 0 else len(pieces[0])
    stop = text[start : start + 3]
    assert len(stop) == 3
    first = text.find(stop)
    out = llm.generate([PROMPT], SamplingParams(temperature=0, max_tokens=40, ignore_eos=True, stop=[stop]))[
        0
    ]
    assert out.text == text[:first]
    assert out.finish_reason == "stop" and out.outputs[0].stop_reason == stop
    inc = llm.generate(
        [PROMPT],
        SamplingParams(
            temperature=0, max_tokens=40, ignore_eos=True, stop=[stop], include_stop_str_in_output=True
        ),
    )[0]
    assert inc.text == text[: first + len(stop)]


def test_stop_token_ids_and_min_tokens(llm: LLM) -> None:
    free = llm.generate([PROMPT], SamplingParams(temperature=0, max_tokens=20, ignore_eos=True))[0]
    target = free.token_ids[5]
    first = free.token_ids.index(target)
    out = llm.generate(
        [PROMPT], SamplingParams(temperature=0, max_tokens=20, ignore_eos=True, stop_token_ids=[target])
    )[0]
    assert out.token_ids == free.token_ids[: first + 1]
    assert out.finish_reason == "stop" and out.outputs[0].stop_reason == target
    # min_tokens bans the stop token until the minimum is reached
    late = llm.generate(
        [PROMPT],
        SamplingParams(
            temperature=0, max_tokens=20, ignore_eos=True, stop_token_ids=[target], min_tokens=first + 2
        ),
    )[0]
    assert target not in late.token_ids[: first + 2]


def test_n_3_gives_three_continuations(llm: LLM) -> None:
    out = llm.generate(
        [PROMPT], SamplingParams(n=3, temperature=1.0, seed=7, max_tokens=10, ignore_eos=True)
    )[0]
    assert [o.index for o in out.outputs] == [0, 1, 2]
    assert all(len(o.token_ids) == 10 for o in out.outputs)
    assert len({tuple(o.token_ids) for o in out.outputs}) > 1
    again = llm.generate(
        [PROMPT], SamplingParams(n=3, temperature=1.0, seed=7, max_tokens=10, ignore_eos=True)
    )[0]
    assert [o.token_ids for o in again.outputs] == [o.token_ids for o in out.outputs]
    llm.engine.check_integrity()


def test_penalties_change_the_output(llm: LLM) -> None:
    base = llm.generate([PROMPT], SamplingParams(temperature=0, max_tokens=30, ignore_eos=True))[0].token_ids
    pen = llm.generate(
        [PROMPT], SamplingParams(temperature=0, max_tokens=30, ignore_eos=True, repetition_penalty=5.0)
    )[0].token_ids
    freq = llm.generate(
        [PROMPT], SamplingParams(temperature=0, max_tokens=30, ignore_eos=True, frequency_penalty=2.0)
    )[0].token_ids
    assert pen != base and freq != base
    # a strong repetition penalty leaves fewer repeated tokens
    assert len(set(pen)) >= len(set(base))


def test_eos_stops_unless_ignored(llm: LLM) -> None:
    free = llm.generate([PROMPT], SamplingParams(temperature=0, max_tokens=20, ignore_eos=True))[0]
    target = free.token_ids[4]
    first = free.token_ids.index(target)
    eos = llm.tokenizer.eos_token_ids  # the engine's own set: make `target` the end-of-sequence token
    saved = set(eos)
    eos.clear()
    eos.add(target)
    try:
        out = llm.generate([PROMPT], SamplingParams(temperature=0, max_tokens=20))[0]
        ignored = llm.generate([PROMPT], SamplingParams(temperature=0, max_tokens=20, ignore_eos=True))[0]
    finally:
        eos.clear()
        eos.update(saved)
    assert out.token_ids == free.token_ids[: first + 1]
    assert out.finish_reason == "stop" and out.outputs[0].stop_reason is None
    assert ignored.token_ids == free.token_ids and ignored.finish_reason == "length"


@pytest.mark.parametrize(
    ("prompt", "params", "message"),
    [
        ("hi", SamplingParams(max_tokens=600), "maximum model length of 512"),
        ([], SamplingParams(), "empty"),
        ([1, 2, 10**6], SamplingParams(), "outside the vocabulary"),
        ([-1], SamplingParams(), "outside the vocabulary"),
        ("hi", SamplingParams(stop_token_ids=[10**6]), "stop_token_ids holds token ids outside"),
        ("hi", SamplingParams(logit_bias={10**6: 1.0}), "logit_bias holds token ids outside"),
    ],
)
def test_infeasible_requests_fail_fast(
    llm: LLM, prompt: str | list[int], params: SamplingParams, message: str
) -> None:
    with pytest.raises(ValueError, match=message):
        llm.generate([prompt] if isinstance(prompt, str) else [prompt], params)
    assert not llm.engine.has_unfinished_requests()


def test_request_bigger_than_the_cache_is_refused(tmp_path: Path) -> None:
    d = build_tiny_model("llama", tmp_path)
    small = LLM(str(d), dtype="float32", num_kv_blocks=4, block_size=16)
    with pytest.raises(ValueError, match="exceeds the KV cache's"):
        small.generate(["x"], SamplingParams(max_tokens=100))


@pytest.mark.parametrize(
    ("kwargs", "name"),
    [
        ({"temperature": -1}, "temperature"),
        ({"top_p": 0}, "top_p"),
        ({"n": 0}, "n"),
        ({"max_tokens": 0}, "max_tokens"),
        ({"logprobs": 50}, "logprobs"),
        ({"top_k": -5}, "top_k"),
        ({"min_p": 2}, "min_p"),
        ({"min_tokens": 5, "max_tokens": 2}, "min_tokens"),
        ({"repetition_penalty": 0}, "repetition_penalty"),
        ({"seed": 2**63}, "seed"),
        ({"logit_bias": {5: 100.5}}, "logit_bias"),
        ({"logit_bias": {-1: 1.0}}, "logit_bias"),
    ],
)
def test_invalid_sampling_params_name_the_parameter(kwargs: dict, name: str) -> None:
    with pytest.raises(ValueError, match=name):
        SamplingParams(**kwargs)
