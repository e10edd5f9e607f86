"""Hybrid models (Qwen3-Next, Qwen3.5, Qwen3.5-MoE, Nemotron-H) greedy token-exact against transformers
(float32, its PyTorch paths: the chunked scans for prompts, the one-step recurrences for decode), under
every scheduling regime the engine has, with the block manager's and the state slots' integrity checked
after every step.

Logprobs within 1e-4: both sides compute in float32 from the same weights; they differ only in the
order of sums (a prompt scanned in engine chunks rather than whole, attention over paged blocks, grouped
experts), a few float32 ulps (~1e-7 relative) per operation over ~40 chained operations on logits of
magnitude < 10: well under 1e-5 in practice (observed <= 1.3e-5), 1e-4 leaves margin on any x86 CPU.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from pathlib import Path

import pytest
from hybrid_models import HYBRID_ARCHS, build_hybrid_model, reference

from glassbox import SamplingParams
from glassbox.config import EngineConfig
from glassbox.engine.llm_engine import LLMEngine
from glassbox.outputs import RequestOutput
from glassbox.tokenizer.hf_tokenizer import Tokenizer

MAX_NEW = 10
LP_TOL = 1e-4  # see the module docstring
Ref = tuple[Path, list[list[int]], list[tuple[list[int], list[float]]]]


@pytest.fixture(scope="session")
def hybrid_refs(tmp_path_factory: pytest.TempPathFactory) -> Callable[[str], Ref]:
    """Per architecture, built on first use: the tiny model, its prompts (1 to ~200 tokens, crossing
    KV blocks and scan chunks) and transformers' greedy continuations."""
    root = tmp_path_factory.mktemp("hybrid")
    cache: dict[str, Ref] = {}

    def get(arch: str) -> Ref:
        if arch not in cache:
            d = build_hybrid_model(arch, root)
            text = "def fibonacci(n):\n    return n if n < 2 else fibonacci(n - 1) + fibonacci(n - 2)\n"
            ids = Tokenizer.from_dir(d).encode(text * 12)
            prompts = [ids[:1], ids[:15], ids[:17], ids[:70], ids[:200]]
            cache[arch] = (d, prompts, reference(d, prompts, MAX_NEW))
        return cache[arch]

    return get


def run_checked(d: Path, prompts: list[list[int]], ref: list, **kw: object) -> LLMEngine:
    """Run ``prompts`` to the end on an engine built with ``kw`` (prompt i for MAX_NEW - i % 3 tokens),
    checking its integrity after every step; assert each continuation equals transformers' and its
    logprobs are within LP_TOL."""
    engine = LLMEngine(EngineConfig(model=str(d), dtype="float32", **kw))  # type: ignore[arg-type]
    lengths = [MAX_NEW - i % 3 for i in range(len(prompts))]  # staggered ends: later prompts join decodes
    for i, p in enumerate(prompts):
        engine.add_request(
            str(i), p, SamplingParams(temperature=0, max_tokens=lengths[i], ignore_eos=True, logprobs=1)
        )
    outs: dict[str, RequestOutput] = {}
    while engine.has_unfinished_requests():
        for out in engine.step():
            if out.finished:
                outs[out.request_id] = out
        engine.check_integrity()
    for i, (toks, lps) in enumerate(ref):
        got, toks = outs[str(i)].outputs[0], toks[: lengths[i]]
        assert got.token_ids == toks, f"prompt {i} ({len(prompts[i])} tokens): {got.token_ids} != {toks}"
        assert got.logprobs is not None
        for j, t in enumerate(toks):
            assert abs(got.logprobs[j][t] - lps[j]) < LP_TOL, (i, j, got.logprobs[j][t], lps[j])
    bm = engine.block_manager
    assert bm.num_free_blocks == bm.num_blocks and bm.num_free_slots == bm.num_state_slots, "held when idle"
    return engine


@pytest.mark.parametrize("arch", HYBRID_ARCHS)
def test_mixed_lengths_batched(hybrid_refs: Callable[[str], Ref], arch: str) -> None:
    """Prompts of 1 to 200 tokens prefilled together, then decoded together (decode rows beside prompt
    rows while the longer prompts still run)."""
    d, prompts, ref = hybrid_refs(arch)
    engine = run_checked(d, prompts, ref, max_num_seqs=4)
    assert engine.block_manager.num_state_slots == 4  # a slot per sequence the scheduler may run
    assert any(r.phase == "mixed" for r in engine.step_records), "no step mixed prompt and decode rows"


@pytest.mark.parametrize("arch", ["qwen3_next", "nemotron_h"])
def test_chunked_prefill_carries_the_state(hybrid_refs: Callable[[str], Ref], arch: str) -> None:
    """A 37-token budget: the 70- and 200-token prompts run in chunks, each starting from the state the
    one before left in the sequence's slot."""
    d, prompts, ref = hybrid_refs(arch)
    engine = run_checked(d, prompts, ref, max_num_seqs=5, max_num_batched_tokens=37)
    prefill_steps = sum(r.num_prefill_tokens > 0 for r in engine.step_records)
    assert prefill_steps >= max(len(p) for p in prompts) // 37 > 1


@pytest.mark.parametrize("arch", ["qwen3_5_moe", "nemotron_h"])
def test_preemption_recomputes(hybrid_refs: Callable[[str], Ref], arch: str) -> None:
    """14 blocks of 16 tokens, 40-token chunks: the 210-token request fits alone, not beside the others (admitted
    a chunk at a time, it grows into them); preempted
    sequences give their slot back and recompute from zeros when readmitted."""
    d, prompts, ref = hybrid_refs(arch)
    engine = run_checked(d, prompts, ref, max_num_seqs=4, num_kv_blocks=14, max_num_batched_tokens=40)
    assert engine.scheduler.num_preemptions > 0


def test_prefix_caching_is_off_and_said(
    hybrid_refs: Callable[[str], Ref], caplog: pytest.LogCaptureFixture
) -> None:
    """Until state checkpoints exist, a hybrid model computes every prompt: a shared prefix gets no hit,
    and the log says why."""
    d, prompts, ref = hybrid_refs("qwen3_next")
    with caplog.at_level(logging.WARNING, logger="glassbox.engine.state_inputs"):
        engine = run_checked(d, prompts, ref, max_num_seqs=4, enable_prefix_caching=True)
    assert any("prefix caching is off for this hybrid model" in r.getMessage() for r in caplog.records)
    assert engine.block_manager.stats.hits == 0 and not engine.block_manager.enable_prefix_caching
