"""Speculative decoding with a draft model: greedy output token-identical to transformers' whatever the draft
(the target's own checkpoint: every draft accepted; a perturbed copy: some, each proposal its greedy
continuation by transformers; another family: none), under batching past max_num_seqs with prefix hits,
forced preemption, chunked prefill with async output, the target's and the draft's block managers checked
after every step; the proposer alone through rejections and a step it missed; a draft pool too small for
everyone (drafts skipped, no preemption); sampled tokens that follow transformers' exact distribution;
vocabulary mismatches refused; the trace and the planner's draft cost."""

from __future__ import annotations

import json
import shutil
from pathlib import Path
from typing import Any

import pytest
import torch
from safetensors.torch import load_file, save_file
from test_spec_decode import _chi2_pvalue, _run, _tv
from tiny_models import build_tiny_model, greedy_continuation, hf_greedy

from glassbox import LLM, SamplingParams
from glassbox.engine.block_manager import BlockManager
from glassbox.engine.draft_model import DraftModelProposer
from glassbox.engine.sequence import Sequence
from glassbox.spec_config import parse_speculative_config
from glassbox.tokenizer.hf_tokenizer import Tokenizer

MAX_NEW = 24
K = 4


def _perturbed(src: Path, dst: Path, sigma: float) -> Path:
    """A copy of ``src`` with Gaussian noise of ``sigma`` on every weight but the norms (the tiny models'
    weights have sigma 0.08): a draft that agrees with the target on some tokens, not all."""
    shutil.copytree(src, dst)
    gen = torch.Generator().manual_seed(1)
    w = load_file(src / "model.safetensors")
    w = {k: v if "norm" in k else v + sigma * torch.randn(v.shape, generator=gen) for k, v in w.items()}
    save_file(w, dst / "model.safetensors", metadata={"format": "pt"})
    return dst


@pytest.fixture(scope="module")
def setup(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    root = tmp_path_factory.mktemp("draft")
    target = build_tiny_model("llama", root)
    drafts = {
        "self": target,
        "perturbed": _perturbed(target, root / "perturbed", 0.01),
        "qwen3": build_tiny_model("qwen3", root, seed=1),  # another family and shape, the same tokenizer
    }
    tok = Tokenizer.from_dir(target)
    code = "def add(a, b):\n    return a + b\n\n"
    prompts = [
        tok.encode(code * 5),
        tok.encode("abc abc abc abc abc abc abc abc"),
        [7, 8, 9, 10, 11, 12] * 6,
        tok.encode("The quick brown fox jumps over the lazy dog."),
        tok.encode(code * 5),  # the same again: prefix cache hits (the target's)
        tok.encode("x = [1, 2, 3]\ny = [1, 2, 3]\nz = [1, 2,"),
    ]
    import transformers as tf

    return {
        "target": target,
        "drafts": drafts,
        "prompts": prompts,
        "ref": hf_greedy(target, prompts, MAX_NEW),
        "draft_hf": tf.AutoModelForCausalLM.from_pretrained(drafts["perturbed"], dtype=torch.float32).eval(),
        "draft_memo": {},  # context -> the perturbed draft's greedy continuation of K tokens
    }


def _spec(draft: Path) -> dict[str, Any]:
    return {"model": str(draft), "num_speculative_tokens": K}


REGIMES: dict[str, dict[str, Any]] = {
    "batched": {"max_num_seqs": 3},
    "preemption": {
        "max_num_seqs": 4,
        "num_kv_blocks": 12,
    },  # the longest request fits alone, not beside others
    # the draft's prompt catch-up chunked too; async output (the text work overlaps the next step)
    "chunked": {"max_num_seqs": 6, "max_num_batched_tokens": 21, "async_output": True},
}


@pytest.mark.parametrize("draft", ["self", "perturbed", "qwen3"])
@pytest.mark.parametrize("regime", list(REGIMES))
def test_greedy_identical_with_a_draft_model(setup: dict[str, Any], regime: str, draft: str) -> None:
    llm = LLM(
        str(setup["target"]),
        dtype="float32",
        speculative_config=_spec(setup["drafts"][draft]),
        **REGIMES[regime],
    )
    proposer = llm.engine.scheduler.proposer
    assert isinstance(proposer, DraftModelProposer)
    asked: list[tuple[list[int], list[int]]] = []  # (the sequence's tokens, the drafts proposed)
    propose = proposer.propose_batch

    def recording(asks: list[tuple[Any, int]]) -> list[list[int]]:
        drafts = propose(asks)
        asked.extend((list(seq.token_ids), d) for (seq, _), d in zip(asks, drafts, strict=True))
        return drafts

    proposer.propose_batch = recording  # type: ignore[method-assign]
    params = SamplingParams(temperature=0, max_tokens=MAX_NEW, ignore_eos=True)
    outs = _run(llm, setup["prompts"], params)  # both pools checked after every step
    if draft == "perturbed":  # each proposal is the draft model's own greedy continuation (transformers')
        hf, memo = setup["draft_hf"], setup["draft_memo"]
        for ctx, drafts in asked:
            if tuple(ctx) not in memo:
                memo[tuple(ctx)] = greedy_continuation(hf, ctx, K)[0]
            assert drafts == memo[tuple(ctx)][: len(drafts)], (ctx, drafts)
        assert sum(len(d) for _, d in asked) > 100
    for i, (out, (toks, _)) in enumerate(zip(outs, setup["ref"], strict=True)):
        assert out.token_ids == toks, f"prompt {i}: {out.token_ids} != transformers' {toks}"
    assert not proposer.states and proposer.block_manager.num_free_blocks == proposer.block_manager.num_blocks
    c = llm.engine.counters
    assert c.generation_tokens == MAX_NEW * len(outs) and c.spec_draft_tokens > 0
    rate = c.spec_accepted_tokens / c.spec_draft_tokens
    if draft == "self":  # the target's own greedy tokens: all accepted, K + 1 tokens per verifying step
        assert c.spec_accepted_tokens == c.spec_draft_tokens
        assert all(o.metrics is not None and o.metrics.spec_acceptance_rate == 1.0 for o in outs)
    elif draft == "perturbed":
        assert 0.1 < rate < 0.6, rate
    else:
        assert rate < 0.1, rate
    if regime == "preemption":
        assert llm.engine.scheduler.num_preemptions > 0
    if regime == "chunked":
        assert any(r.phase == "mixed" for r in llm.engine.step_records)
    if regime == "batched":
        assert llm.engine.block_manager.stats.hits > 0
    if regime == "batched" and draft == "self":  # glassbox trace shows what the draft did
        from glassbox.trace import run_trace

        sd = run_trace(llm.engine, "abc abc abc abc", 9, None)["speculative"]
        assert sd["method"] == "draft_model" and sd["model"] == str(setup["target"])
        assert sd["accepted_tokens"] == sd["draft_tokens"] > 0
        assert sd["verify_steps"] <= sd["draft_passes"] <= K * sd["verify_steps"] and sd["draft_ms"] > 0


def test_a_full_draft_pool_skips_drafts_and_preempts_nobody(setup: dict[str, Any]) -> None:
    """A draft pool of 5 blocks (80 tokens) for six sequences of 40-100 tokens: a sequence gets drafts only
    while the draft's cache can hold it; the target (a large pool) is never preempted; output unchanged."""
    llm = LLM(
        str(setup["target"]), dtype="float32", speculative_config=_spec(setup["target"]), max_num_seqs=6
    )
    proposer = llm.engine.scheduler.proposer
    assert isinstance(proposer, DraftModelProposer)
    proposer.block_manager = BlockManager(5, proposer.block_manager.block_size, enable_prefix_caching=False)
    params = SamplingParams(temperature=0, max_tokens=MAX_NEW, ignore_eos=True)
    outs = _run(llm, setup["prompts"], params)
    assert [o.token_ids for o in outs] == [r[0] for r in setup["ref"]]
    assert llm.engine.scheduler.num_preemptions == 0
    drafted = [o.metrics.spec_drafts for o in outs if o.metrics is not None]
    assert 0 in drafted and max(drafted) > 0, drafted  # the longest prompt never fits; others do
    assert proposer.block_manager.num_free_blocks == 5


def test_draft_cache_follows_the_sequence(setup: dict[str, Any]) -> None:
    """The proposer alone (block size 2, so that a block more or less shows): its proposals equal the draft
    model's greedy continuation (transformers') after a rejection of the first draft (its cache trimmed),
    after a rejection in the middle followed by a token it was not asked about (its cache kept up to the
    last token they share), and its blocks are freed on release."""
    llm = LLM(
        str(setup["target"]),
        dtype="float32",
        speculative_config=_spec(setup["drafts"]["perturbed"]),
        block_size=2,
    )
    proposer = llm.engine.scheduler.proposer
    assert isinstance(proposer, DraftModelProposer)
    hf = setup["draft_hf"]
    seq = Sequence(0, "r", setup["prompts"][5], SamplingParams())

    def ask(n: int) -> list[int]:
        drafts = proposer.propose_batch([(seq, n)])[0]
        assert drafts == greedy_continuation(hf, seq.token_ids, n)[0]
        proposer.check_integrity([seq])
        return drafts

    first = ask(K)
    seq.append_token((first[0] + 1) % 512)  # the first draft rejected
    ask(1)
    second = ask(K)
    for t in (second[0], (second[1] + 1) % 512, 7):  # one accepted, one rejected, one more token
        seq.append_token(t)
    ask(2)
    proposer.release(seq)
    assert not proposer.states and proposer.block_manager.num_free_blocks == proposer.block_manager.num_blocks


def test_sampled_tokens_follow_the_model_with_a_draft(setup: dict[str, Any]) -> None:
    """1500 continuations (n = 1500) of 4 tokens at temperature 0.9, top-k 3, with the perturbed draft
    proposing: the joint distribution of the four tokens matches transformers' exact one (chi-square and
    total variation), with drafts accepted often and rejected often."""
    import transformers as tf

    prompt = setup["prompts"][3]
    n, top_k, temp = 1500, 3, 0.9
    llm = LLM(
        str(setup["target"]),
        dtype="float32",
        speculative_config=_spec(setup["drafts"]["perturbed"]),
        max_num_seqs=256,
    )
    sp = SamplingParams(n=n, temperature=temp, top_k=top_k, max_tokens=4, seed=3, ignore_eos=True)
    out = _run(llm, [prompt], sp)[0]
    counts: dict[tuple[int, ...], int] = {}
    for o in out.outputs:
        counts[tuple(o.token_ids)] = counts.get(tuple(o.token_ids), 0) + 1
    m = out.metrics
    assert m is not None and m.spec_draft_tokens > 1000 and 0.2 < m.spec_acceptance_rate < 0.8, m
    model = tf.AutoModelForCausalLM.from_pretrained(setup["target"], dtype=torch.float32).eval()
    exact: dict[tuple[int, ...], float] = {(): 1.0}
    for _ in range(4):
        ctxs = list(exact)
        with torch.no_grad():
            x = model(input_ids=torch.tensor([prompt + list(t) for t in ctxs])).logits[:, -1].float() / temp
        top = x.topk(top_k, dim=-1)
        probs = top.values.softmax(-1)
        exact = {
            ctx + (int(t),): pc * float(p)
            for ctx, pc, ts, ps in zip(ctxs, exact.values(), top.indices, probs, strict=True)
            for t, p in zip(ts, ps, strict=True)
        }
    assert _chi2_pvalue(exact, counts, n) > 1e-3
    assert _tv(exact, counts, n) < 0.15


def test_vocabulary_mismatch_and_config_errors(setup: dict[str, Any], tmp_path: Path) -> None:
    target = setup["target"]
    bigger = shutil.copytree(target, tmp_path / "bigger")  # another vocab_size
    cfg = json.loads((bigger / "config.json").read_text())
    (bigger / "config.json").write_text(json.dumps({**cfg, "vocab_size": cfg["vocab_size"] + 64}))
    swapped = shutil.copytree(target, tmp_path / "swapped")  # the same size, two ids swapped
    tj = json.loads((swapped / "tokenizer.json").read_text())
    vocab = tj["model"]["vocab"]
    a, b = (t for t, i in vocab.items() if i in (300, 301))
    vocab[a], vocab[b] = vocab[b], vocab[a]
    (swapped / "tokenizer.json").write_text(json.dumps(tj))
    for d, message in ((bigger, "vocab_size"), (swapped, "token id")):
        with pytest.raises(ValueError, match=f"does not share the target's vocabulary: {message}"):
            LLM(str(target), dtype="float32", speculative_config=_spec(d))
    spec = parse_speculative_config({"model": str(target), "num_speculative_tokens": 3})
    assert spec is not None and spec.method == "draft_model" and spec.model == str(target)
    assert parse_speculative_config({"method": "draft_model", "model": "d", "num_speculative_tokens": 2})
    bad = [
        ({"method": "draft_model", "num_speculative_tokens": 3}, "needs a model"),
        ({"model": "d", "num_speculative_tokens": 3, "prompt_lookup_max": 3}, "belong to the ngram method"),
        ({"method": "ngram", "model": "d", "num_speculative_tokens": 3}, "takes no model"),
        ({"method": "eagle", "model": "d", "num_speculative_tokens": 3}, "not supported yet"),
    ]
    for value, message in bad:
        with pytest.raises(ValueError, match=message):
            parse_speculative_config(value)
    with pytest.raises(FileNotFoundError):
        LLM(str(target), dtype="float32", speculative_config=_spec(tmp_path / "missing"))


def test_plan_with_a_draft_model() -> None:
    """The planner's --draft-model: each speculative step also pays k one-row passes of the draft (about k
    of the draft's own plain decode steps), so the speed-up is below n-gram's at the same acceptance; the
    simulator's steps (concurrency row) agree with the closed form."""
    from glassbox.perf.plan_request import PlanRequest
    from glassbox.perf.planner import plan

    base: dict[str, Any] = dict(
        model="llama-3.1-8b", hardware="dgx-spark", output_tokens=128, concurrency=(1,)
    )
    spec: dict[str, Any] = dict(spec_tokens=K, acceptance_rate=0.7)
    plain = plan(PlanRequest(**base))
    ngram = plan(PlanRequest(**base, **spec))["speculative"]
    drafted = plan(PlanRequest(**base, **spec, draft_model="qwen3-0.6b"))
    draft_alone = plan(PlanRequest(**{**base, "model": "qwen3-0.6b"}))
    row = drafted["speculative"]
    assert ngram["draft_s"] == 0.0
    assert row["draft_s"] == pytest.approx(K * draft_alone["decode"]["step_s"], rel=0.05)
    assert row["step_s"] == pytest.approx(ngram["step_s"] + row["draft_s"], rel=1e-3)
    assert 1.0 < row["speedup"] < ngram["speedup"]
    ratio = drafted["concurrency"][0]["per_request_tok_s"] / plain["concurrency"][0]["per_request_tok_s"]
    assert ratio == pytest.approx(row["speedup"], rel=0.15)
    with pytest.raises(ValueError, match="--draft-model needs --spec-tokens"):
        PlanRequest(**base, draft_model="qwen3-0.6b")
