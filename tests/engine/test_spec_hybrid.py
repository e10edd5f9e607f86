"""Speculative decoding of hybrid models (Qwen3-Next, Qwen3.5-MoE, Nemotron-H): a verify step's draft positions
step the recurrent layers one at a time into scratch rows, and the state after the last accepted draft is
committed to the sequence's slot (engine/spec_states.py). Greedy output with the n-gram proposer and with a
(non-hybrid) draft model token-identical to transformers', logprobs within 1e-4 (the reason is in
tests/models/test_hybrid_parity.py: the same float32 computation, sums in another order), drafts both
accepted and rejected, a batch mixing prompt chunks and verify rows, the block manager (slots, scratch
commits) checked after every step; an agent's next turn hitting the tail checkpoint a verify step saved
from a scratch row; sampled tokens that follow transformers' exact joint distribution; a
hybrid draft model refused.

Random tiny models rarely repeat themselves, so n-gram drafts would all be rejected: the Qwen models here
tie their LM head to an embedding scaled by 3, which makes them copy their input often, not always (drafts
accepted and rejected); Nemotron-H's repeats as built.
"""

from __future__ import annotations

import shutil
from pathlib import Path
from typing import Any

import pytest
import torch
from hybrid_models import build_hybrid_model, reference
from safetensors.torch import load_file, save_file
from test_spec_decode import _chi2_pvalue, _tv
from tiny_models import build_tiny_model

from glassbox import LLM, SamplingParams
from glassbox.engine.llm_engine import LLMEngine
from glassbox.engine.spec_states import ScratchRows
from glassbox.kernels import native
from glassbox.outputs import RequestOutput
from glassbox.tokenizer.hf_tokenizer import Tokenizer

MAX_NEW = 24
LP_TOL = 1e-4  # see the module docstring
NGRAM = {"method": "ngram", "num_speculative_tokens": 3, "prompt_lookup_min": 1, "prompt_lookup_max": 2}
CPU_KERNELS = ["native", "torch"] if native.compiler() else ["torch"]


def _copying(src: Path, dst: Path) -> Path:
    """``src`` (tied embeddings) with its embedding (and so its LM head) scaled by 3."""
    if not dst.exists():
        shutil.copytree(src, dst)
        w = load_file(src / "model.safetensors")
        w = {k: v * 3 if k == "model.embed_tokens.weight" else v for k, v in w.items()}
        save_file(w, dst / "model.safetensors", metadata={"format": "pt"})
    return dst


def _model(arch: str, root: Path) -> Path:
    if arch == "nemotron_h":
        return build_hybrid_model(arch, root)
    return _copying(build_hybrid_model(arch, root, tie_word_embeddings=True), root / f"{arch}-copying")


@pytest.fixture(scope="module")
def refs(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    root = tmp_path_factory.mktemp("spec_hybrid")
    cache: dict[str, Any] = {"root": root}

    def get(arch: str) -> tuple[Path, list[list[int]], list[tuple[list[int], list[float]]]]:
        if arch not in cache:
            d = _model(arch, root)
            text = "def fibonacci(n):\n    return n if n < 2 else fibonacci(n - 1) + fibonacci(n - 2)\n"
            ids = Tokenizer.from_dir(d).encode(text * 4)
            prompts = [ids[:40], [5, 6] * 10, [30, 31, 32] * 8, [100] * 5, [200, 201] * 4]
            cache[arch] = (d, prompts, reference(d, prompts, MAX_NEW))
        return cache[arch]

    cache["get"] = get
    return cache


def run_checked(
    engine: LLMEngine, prompts: list[list[int]], ref: list, lengths: list[int] | None = None
) -> list[RequestOutput]:
    """Greedy continuations of ``prompts`` (prompt i: ``lengths[i]`` tokens, by default MAX_NEW - i % 3, so
    that later prompts join running verify steps), the engine checked after every step; each equal to
    transformers' ``ref``, logprobs within LP_TOL; nothing held when idle."""
    lengths = lengths or [MAX_NEW - i % 3 for i in range(len(prompts))]
    for i, p in enumerate(prompts):
        sp = SamplingParams(temperature=0, max_tokens=lengths[i], ignore_eos=True, logprobs=1)
        engine.add_request(f"r{i}", p, sp)
    outs: dict[str, RequestOutput] = {}
    while engine.has_unfinished_requests():
        for out in engine.step():
            if out.finished:
                outs[out.request_id] = out
        engine.check_integrity()
    for i, (toks, lps) in enumerate(ref):
        got = outs[f"r{i}"].outputs[0]
        assert got.token_ids == toks[: lengths[i]], (i, got.token_ids, toks)
        assert got.logprobs is not None
        for j, t in enumerate(got.token_ids):
            assert abs(got.logprobs[j][t] - lps[j]) < LP_TOL, (i, j, got.logprobs[j][t], lps[j])
    bm = engine.block_manager
    assert bm.num_free_blocks == bm.num_blocks and bm.num_free_slots == bm.num_state_slots, "held when idle"
    return [outs[f"r{i}"] for i in range(len(prompts))]


def _engine(d: Path, spec: dict[str, Any], **kw: Any) -> LLMEngine:
    return LLM(str(d), dtype="float32", speculative_config=spec, **kw).engine


@pytest.mark.parametrize(
    ("arch", "kernels"),
    [("qwen3_next", k) for k in CPU_KERNELS] + [("qwen3_5_moe", "torch"), ("nemotron_h", CPU_KERNELS[0])],
)
def test_greedy_identical_with_ngram_drafts(
    refs: dict[str, Any], arch: str, kernels: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Three sequences at a time (the later prompts prefilled beside verify rows), on the C decode
    recurrences and on the PyTorch ops; drafts accepted and rejected, at several positions."""
    monkeypatch.setenv("GLASSBOX_CPU_KERNELS", kernels)
    d, prompts, ref = refs["get"](arch)
    engine = _engine(d, NGRAM, max_num_seqs=3)
    bm = engine.block_manager
    assert bm.scratch == ScratchRows(bm.num_state_slots * 3, 3)  # + 2 checkpoints per slot: rows 3x..
    run_checked(engine, prompts, ref)
    c = engine.counters
    assert 0 < c.spec_accepted_tokens < c.spec_draft_tokens, (c.spec_accepted_tokens, c.spec_draft_tokens)
    assert any(r.phase == "mixed" for r in engine.step_records), "no step mixed prompt and verify rows"


def test_greedy_identical_with_a_draft_model_and_preemption(refs: dict[str, Any]) -> None:
    """A non-hybrid draft (a tiny Llama with the same tokenizer, made to copy as the target) for Qwen3-Next,
    few KV blocks so that sequences are preempted and recomputed, prefix caching on (its checkpoint saves
    run after the commits); its drafts accepted and rejected."""
    d, prompts, ref = refs["get"]("qwen3_next")
    llama = build_tiny_model("llama", refs["root"], tie_word_embeddings=True)
    draft = _copying(llama, refs["root"] / "llama-copying")
    spec = {"model": str(draft), "num_speculative_tokens": 2}
    engine = _engine(d, spec, max_num_seqs=5, num_kv_blocks=8, max_num_batched_tokens=32)
    run_checked(engine, prompts, ref)
    c = engine.counters
    assert engine.scheduler.num_preemptions > 0 and 0 < c.spec_accepted_tokens < c.spec_draft_tokens


def test_next_turn_hits_a_boundary_a_verify_step_passed(refs: dict[str, Any]) -> None:
    """A conversation's second turn (turn 1's prompt, answer and a new message) reaches the last block
    boundary turn 1 computed, 24, whose tail checkpoint the verify step from 23 to 26 saved from the
    scratch row of its first position (it passed the boundary without ending on it), and continues as
    transformers does. Blocks of 4 tokens; turn 1: the 20-token prompt, 7 tokens (computed: 26)."""
    d, prompts, ref = refs["get"]("qwen3_5_moe")
    engine = _engine(d, NGRAM, max_num_seqs=2, block_size=4)
    first = run_checked(engine, prompts[1:2], ref[1:2], lengths=[7])[0]
    computed = len(prompts[1]) + 7 - 1  # turn 1's last token was sampled, never computed
    assert first.metrics is not None and first.metrics.spec_accepted_tokens > 0
    turn2 = prompts[1] + first.outputs[0].token_ids + [9, 10, 11]
    second = run_checked(engine, [turn2], reference(d, [turn2], 4), lengths=[4])[0]
    assert second.metrics is not None and second.metrics.cached_prompt_tokens == computed // 4 * 4 == 24


def test_sampled_tokens_follow_the_model(refs: dict[str, Any]) -> None:
    """The statistical test of tests/engine/test_spec_decode.py on Qwen3.5-MoE: 800 continuations of four
    tokens of a prompt whose tokens are the only ones top-k keeps (n-gram drafts from it, accepted about one
    in seven times), against transformers' exact joint distribution: Pearson's chi-square p > 1e-3, and a
    total variation under 0.2 (81 cells: its expected value at n = 800 is below 0.5 * sqrt(2 / pi) *
    sum(sqrt(p)) / sqrt(n) <= 0.13, the bound at a uniform p)."""
    import transformers as tf

    d = build_hybrid_model("qwen3_5_moe", refs["root"])  # as built: it does not favour copying
    a, b, c = 101, 202, 303
    prompt = [5, a, b, c, a, c, b, b, a, c, c, a, b, a, a, c, b, c]
    bias = {a: 8.0, b: 8.0, c: 8.0}
    n = 800
    engine = _engine(d, NGRAM, max_num_seqs=256)
    sp = SamplingParams(
        n=n, temperature=0.9, top_k=3, logit_bias=bias, max_tokens=4, seed=11, ignore_eos=True
    )
    engine.add_request("s", prompt, sp)
    out = None
    while engine.has_unfinished_requests():
        for o in engine.step():
            out = o if o.finished else out
        engine.check_integrity()
    assert out is not None and out.metrics is not None
    counts: dict[tuple[int, ...], int] = {}
    for o in out.outputs:
        counts[tuple(o.token_ids)] = counts.get(tuple(o.token_ids), 0) + 1
    assert out.metrics.spec_draft_tokens > 1000 and 0.05 < out.metrics.spec_acceptance_rate < 0.6
    model = tf.AutoModelForCausalLM.from_pretrained(d, dtype=torch.float32).eval()

    def next_probs(ctxs: list[tuple[int, ...]]) -> torch.Tensor:
        with torch.no_grad():
            x = model(input_ids=torch.tensor([prompt + list(t) for t in ctxs])).logits[:, -1].float()
        for t, v in bias.items():
            x[:, t] += v
        x = x / 0.9
        kth = x.topk(3, dim=-1).values[:, -1:]
        return x.masked_fill(x < kth, float("-inf")).softmax(-1)

    exact: dict[tuple[int, ...], float] = {(): 1.0}
    for _ in range(4):
        ctxs = list(exact)
        probs = next_probs(ctxs)
        exact = {
            ctx + (t,): pc * float(probs[i, t])
            for i, (ctx, pc) in enumerate(zip(ctxs, exact.values(), strict=True))
            for t in (a, b, c)
        }
    assert sum(exact.values()) == pytest.approx(1.0, abs=1e-5)  # the support is {a, b, c}
    assert _chi2_pvalue(exact, counts, n) > 1e-3
    assert _tv(exact, counts, n) < 0.2


def test_a_hybrid_draft_model_is_refused(refs: dict[str, Any]) -> None:
    d = _model("qwen3_next", refs["root"])
    with pytest.raises(ValueError, match="--speculative-config: the draft model .* is a hybrid model"):
        _engine(d, {"model": str(d), "num_speculative_tokens": 2})
