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
from hybrid_models import HYBRID_ARCHS, build_hybrid_model, build_multimodal_qwen35, reference

from glassbox import SamplingParams
from glassbox.config import EngineConfig
from glassbox.engine.llm_engine import LLMEngine
from glassbox.kernels import native
from glassbox.layers.gated_deltanet import GatedDeltaNet
from glassbox.layers.mamba2 import Mamba2Mixer
from glassbox.outputs import RequestOutput
from glassbox.tokenizer.hf_tokenizer import Tokenizer

# "native" needs a C compiler; where there is none the mixers run on the PyTorch ops
CPU_KERNELS = ["native", "torch"] if native.compiler() else ["torch"]
MAX_NEW = 10
LP_TOL = 1e-4  # see the module docstring
Ref = tuple[Path, list[list[int]], list[tuple[list[int], list[float]]]]


def prompts_of(d: Path) -> list[list[int]]:
    text = "def fibonacci(n):\n    return n if n < 2 else fibonacci(n - 1) + fibonacci(n - 2)\n"
    ids = Tokenizer.from_dir(d).encode(text * 12)
    return [ids[:1], ids[:15], ids[:17], ids[:70], ids[:200]]


@pytest.fixture(scope="session")
def hybrid_refs(tmp_path_factory: pytest.TempPathFactory) -> Callable[[str], Ref]:
    """Per architecture, built on first use: the tiny model, its prompts (1 to ~200 tokens, crossing
    KV blocks and scan chunks) and transformers' greedy continuations."""
    root = tmp_path_factory.mktemp("hybrid")
    cache: dict[str, Ref] = {}

    def get(arch: str) -> Ref:
        if arch not in cache:
            d = build_hybrid_model(arch, root)
            prompts = prompts_of(d)
            cache[arch] = (d, prompts, reference(d, prompts, MAX_NEW))
        return cache[arch]

    return get


def engine_for(d: Path, **kw: object) -> LLMEngine:
    return LLMEngine(EngineConfig(model=str(d), dtype="float32", **kw))  # type: ignore[arg-type]


def run_checked(
    engine: LLMEngine | Path,
    prompts: list[list[int]],
    ref: list,
    lengths: list[int] | None = None,
    **kw: object,
) -> LLMEngine:
    """Run ``prompts`` to the end on ``engine`` (or one built with ``kw``), prompt i for ``lengths[i]``
    tokens (default MAX_NEW - i % 3: staggered ends, so later prompts join running decodes), checking its
    integrity after every step; assert each continuation equals transformers' (a prefix of ``ref[i]``)
    and its logprobs are within LP_TOL. The outputs are kept in ``engine.test_outputs``."""
    if isinstance(engine, Path):
        engine = engine_for(engine, **kw)
    lengths = lengths or [MAX_NEW - i % 3 for i in range(len(prompts))]
    for i, p in enumerate(prompts):
        params = SamplingParams(temperature=0, max_tokens=lengths[i], ignore_eos=True, logprobs=1)
        engine.add_request(f"r{i}", p, params)
    outs: dict[str, RequestOutput] = {}
    while engine.has_unfinished_requests():
        for out in engine.step():
            if out.finished:
                outs[out.request_id] = out
        engine.check_integrity()
    for i, (toks, lps) in enumerate(ref):
        got = outs[f"r{i}"].outputs[0]
        n = min(lengths[i], len(toks))
        assert got.token_ids[:n] == toks[:n], (
            f"prompt {i} ({len(prompts[i])} tokens): {got.token_ids} != {toks}"
        )
        assert got.logprobs is not None
        for j, t in enumerate(toks[:n]):
            assert abs(got.logprobs[j][t] - lps[j]) < LP_TOL, (i, j, got.logprobs[j][t], lps[j])
    bm = engine.block_manager
    assert bm.num_free_blocks == bm.num_blocks and bm.num_free_slots == bm.num_state_slots, "held when idle"
    engine.test_outputs = [outs[f"r{i}"] for i in range(len(prompts))]  # type: ignore[attr-defined]
    return engine


@pytest.mark.parametrize("kernels", CPU_KERNELS)
@pytest.mark.parametrize("arch", HYBRID_ARCHS)
def test_mixed_lengths_batched(
    hybrid_refs: Callable[[str], Ref], arch: str, kernels: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Prompts of 1 to 200 tokens prefilled together, then decoded together (decode rows beside prompt
    rows while the longer prompts still run), on both CPU paths: the decode recurrences in C
    (models/hybrid_native.py) and on the PyTorch ops."""
    monkeypatch.setenv("GLASSBOX_CPU_KERNELS", kernels)
    d, prompts, ref = hybrid_refs(arch)
    engine = run_checked(d, prompts, ref, max_num_seqs=4)
    mixers = [m for m in engine.executor.model.modules() if isinstance(m, (GatedDeltaNet, Mamba2Mixer))]
    assert mixers and all(m.native == (kernels == "native") for m in mixers)
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


@pytest.mark.parametrize(("arch", "caching"), [("qwen3_5_moe", False), ("nemotron_h", True)])
def test_preemption_recomputes(hybrid_refs: Callable[[str], Ref], arch: str, caching: bool) -> None:
    """14 blocks of 16 tokens, 40-token chunks, all five admitted: the 210-token request fits alone, not
    beside the others, and grows into them; a preempted sequence gives its slot back and is recomputed
    from zeros, or with prefix caching from its own latest state checkpoint."""
    d, prompts, ref = hybrid_refs(arch)
    kw = dict(max_num_seqs=5, num_kv_blocks=14, max_num_batched_tokens=40, enable_prefix_caching=caching)
    engine = run_checked(d, prompts, ref, **kw)
    assert engine.scheduler.num_preemptions > 0
    assert (engine.block_manager.stats.hits > 0) == caching


@pytest.mark.parametrize("arch", ["qwen3_next", "nemotron_h"])
def test_prefix_cache_hits_restore_the_state(hybrid_refs: Callable[[str], Ref], arch: str) -> None:
    """The same prompts twice: the second time each reaches its prompt checkpoint (the last block
    boundary before its last token), restored into the sequence's slot, and computes only the rest."""
    d, prompts, ref = hybrid_refs(arch)
    engine = run_checked(d, prompts, ref, max_num_seqs=4)  # the 200-token one hits the 70-token one's
    checkpoints = engine.block_manager.checkpoints
    assert checkpoints is not None
    before = checkpoints.hits
    run_checked(engine, prompts, ref)
    cached = [o.metrics.cached_prompt_tokens for o in engine.test_outputs]  # type: ignore[attr-defined]
    assert cached == [(len(p) - 1) // 16 * 16 for p in prompts] and max(cached) > 0
    assert checkpoints.hits - before == sum(c > 0 for c in cached)  # each restored from a checkpoint


def test_agent_conversation_hits_the_end_of_the_last_turn(hybrid_refs: Callable[[str], Ref]) -> None:
    """Turn 2 is turn 1's prompt, its answer and a new message: it reaches the tail checkpoint at the last
    block boundary turn 1 computed (past its prompt's), so only the new part and a partial block run."""
    d, prompts, ref = hybrid_refs("qwen3_5")
    # 27 tokens: turn 1's last step computes up to 70 + 27 - 1 = 96, a block boundary, so its tail checkpoint
    # is saved by the same step that restores it for turn 2 (the save must run first)
    engine = run_checked(d, prompts[3:4], ref[3:4], lengths=[27], max_num_seqs=2)
    first = engine.test_outputs[0]  # type: ignore[attr-defined]
    turn2 = prompts[3] + first.outputs[0].token_ids + prompts[4][100:115]
    run_checked(engine, [turn2], reference(d, [turn2], 4), lengths=[4])
    computed = len(prompts[3]) + 27 - 1  # turn 1's last token was sampled, never computed
    assert engine.test_outputs[0].metrics.cached_prompt_tokens == computed // 16 * 16 > len(prompts[3])  # type: ignore[attr-defined]


def test_prefix_caching_off_computes_everything(hybrid_refs: Callable[[str], Ref]) -> None:
    d, prompts, ref = hybrid_refs("nemotron_h")
    engine = run_checked(d, prompts, ref, max_num_seqs=4, enable_prefix_caching=False)
    run_checked(engine, prompts, ref)
    assert engine.block_manager.stats.hits == 0 and engine.block_manager.checkpoints is None


def test_multimodal_qwen35_runs_its_text_model(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    """An image-text Qwen3.5-MoE checkpoint (``model.language_model.*``, ``model.visual.*``): its text
    model runs token-exact with transformers' Qwen3_5MoeForConditionalGeneration on text, and the log
    says once that the vision tower is ignored."""
    d = build_multimodal_qwen35(tmp_path)
    prompts = prompts_of(d)[1:4]
    with caplog.at_level(logging.INFO, logger="glassbox.models.qwen3_next"):
        engine = run_checked(d, prompts, reference(d, prompts, MAX_NEW), max_num_seqs=3)
    said = [r for r in caplog.records if "vision tower ignored" in r.getMessage()]
    assert len(said) == 1 and engine.facts.architecture == "Qwen3_5MoeForCausalLM"
