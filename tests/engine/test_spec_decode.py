"""Speculative decoding with the n-gram proposer: greedy output token-identical to transformers' (and to the
engine without speculation, logprobs included) under batching, preemption, chunked prefill, prefix caching,
async output and stop strings, with the block manager checked after every step; sampled tokens that follow
the target distribution exactly (the rule against closed-form probabilities, the engine against
transformers' own); seeds reproducible; the acceptance counts in metrics, Prometheus and the trace; the
simulator's speculative steps against the closed form the planner uses."""

from __future__ import annotations

import itertools
import random
from typing import Any

import pytest
import torch
from tiny_models import build_tiny_model, hf_greedy

from glassbox import LLM, SamplingParams
from glassbox.engine.ngram import NgramProposer, find_ngram_drafts
from glassbox.engine.sequence import Sequence
from glassbox.engine.spec_decode import verify_on_device
from glassbox.outputs import RequestOutput
from glassbox.perf.simulator import SimSettings, simulate
from glassbox.perf.spec_plan import expected_tokens_per_step
from glassbox.spec_config import parse_speculative_config
from glassbox.structured_outputs import StructuredOutputs

MAX_NEW = 24
SPEC = {"method": "ngram", "num_speculative_tokens": 4, "prompt_lookup_min": 1, "prompt_lookup_max": 3}
_ids = itertools.count()


@pytest.fixture(scope="module")
def setup(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    d = build_tiny_model("llama", tmp_path_factory.mktemp("spec"))
    base = LLM(str(d), dtype="float32", max_num_seqs=3)
    tok = base.tokenizer
    code = "def add(a, b):\n    return a + b\n\n"
    prompts = [
        tok.encode(code * 5),  # repeats itself: drafts from the prompt
        tok.encode("abc abc abc abc abc abc abc abc"),
        [7, 8, 9, 10, 11, 12] * 6,
        tok.encode("The quick brown fox jumps over the lazy dog."),  # does not repeat
        tok.encode(code * 5),  # the same again: prefix cache hits
        tok.encode("x = [1, 2, 3]\ny = [1, 2, 3]\nz = [1, 2,"),
    ]
    params = SamplingParams(temperature=0, max_tokens=MAX_NEW, ignore_eos=True, logprobs=2)
    plain = _run(base, prompts, params)
    return {"dir": d, "prompts": prompts, "ref": hf_greedy(d, prompts, MAX_NEW), "plain": plain}


def _run(
    llm: LLM, prompts: list[list[int]], params: SamplingParams | list[SamplingParams]
) -> list[RequestOutput]:
    """Generate through engine.step(), checking the block manager after every step: the pool's invariants,
    ref counts equal to the block tables' uses, and no sequence holding blocks past its tokens (a rejected
    draft's slots given back)."""
    eng = llm.engine
    plist = params if isinstance(params, list) else [params] * len(prompts)
    rids = []
    for p, sp in zip(prompts, plist, strict=True):
        rids.append(f"t{next(_ids)}")
        eng.add_request(rids[-1], p, sp)
    done: dict[str, RequestOutput] = {}
    while eng.has_unfinished_requests():
        for out in eng.step():
            if out.finished:
                done[out.request_id] = out
        eng.check_integrity()
        bm = eng.block_manager
        for seq in eng.scheduler.running:
            assert len(seq.block_table) <= bm.blocks_needed(len(seq)), "blocks held past the sequence"
    bm = eng.block_manager
    assert bm.num_free_blocks == bm.num_blocks, "blocks still held when idle"
    return [done[r] for r in rids]


REGIMES: dict[str, dict[str, Any]] = {
    "batched": {"max_num_seqs": 3},
    # 12 blocks x 16 tokens: the longest request (about 100 tokens) fits alone, not beside others
    "preemption": {"max_num_seqs": 4, "num_kv_blocks": 12},
    "chunked": {"max_num_seqs": 6, "max_num_batched_tokens": 21},
    "async": {"max_num_seqs": 6, "async_output": True, "enable_prefix_caching": False},
    "torch-ops": {"max_num_seqs": 3},  # the PyTorch attention, not glassbox's C kernels
}


@pytest.mark.parametrize("regime", list(REGIMES))
def test_greedy_identical_with_speculation(
    setup: dict[str, Any], regime: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    if regime == "torch-ops":
        monkeypatch.setenv("GLASSBOX_CPU_KERNELS", "torch")
    llm = LLM(str(setup["dir"]), dtype="float32", speculative_config=SPEC, **REGIMES[regime])
    assert llm.engine.executor.attn_backend == ("torch" if regime == "torch-ops" else "native")
    params = SamplingParams(temperature=0, max_tokens=MAX_NEW, ignore_eos=True, logprobs=2)
    outs = _run(llm, setup["prompts"], params)
    for i, (out, plain, (toks, lps)) in enumerate(zip(outs, setup["plain"], setup["ref"], strict=True)):
        assert out.token_ids == toks, f"prompt {i}: {out.token_ids} != transformers' {toks}"
        assert out.outputs[0].logprobs is not None and plain.outputs[0].logprobs is not None
        for j, t in enumerate(toks):
            assert abs(out.outputs[0].logprobs[j][t] - lps[j]) < 1e-3
            mine, theirs = out.outputs[0].logprobs[j], plain.outputs[0].logprobs[j]
            assert mine.keys() == theirs.keys()
            assert max(abs(mine[k] - theirs[k]) for k in mine) < 1e-4
        assert out.finish_reason == "length"
        assert out.metrics is not None and out.metrics.output_tokens == MAX_NEW
    c = llm.engine.counters
    assert c.spec_accepted_tokens > 0 and c.spec_draft_tokens > c.spec_accepted_tokens
    assert c.generation_tokens == MAX_NEW * len(outs)
    if regime == "preemption":
        assert llm.engine.scheduler.num_preemptions > 0
    if regime == "chunked":
        assert any(r.phase == "mixed" for r in llm.engine.step_records)
    if regime == "batched":
        assert llm.engine.block_manager.stats.hits > 0


def test_stop_strings_and_n_cut_where_the_plain_engine_does(setup: dict[str, Any]) -> None:
    """A stop string inside a run of accepted drafts: the tokens after it are dropped; n > 1; with and
    without async output, the same outputs as the engine without speculation."""
    d, prompts = setup["dir"], setup["prompts"][:3]
    stops = [[setup["plain"][i].text[12:15]] for i in range(3)]
    params = [
        SamplingParams(temperature=0, max_tokens=MAX_NEW, stop=stops[i], n=2, logprobs=0) for i in range(3)
    ]
    plain = _run(LLM(str(d), dtype="float32"), prompts, params)
    for async_output in (False, True):
        llm = LLM(str(d), dtype="float32", speculative_config=SPEC, async_output=async_output)
        outs = _run(llm, prompts, params)
        for a, b in zip(outs, plain, strict=True):
            assert [(o.text, o.token_ids, o.finish_reason, o.stop_reason) for o in a.outputs] == [
                (o.text, o.token_ids, o.finish_reason, o.stop_reason) for o in b.outputs
            ]
            for o in a.outputs:
                assert o.logprobs is not None and len(o.logprobs) == len(o.token_ids)
            assert a.metrics is not None and a.metrics.output_tokens == sum(
                len(o.token_ids) for o in a.outputs
            )
        assert all(o.finish_reason == "stop" for r in outs for o in r.outputs)
        # tokens appended past a stop string were sampled (counted) and then dropped
        assert llm.engine.counters.generation_tokens > sum(len(o.token_ids) for r in outs for o in r.outputs)


def _tv(p: dict[Any, float], counts: dict[Any, int], n: int) -> float:
    return 0.5 * sum(abs(p.get(k, 0.0) - counts.get(k, 0) / n) for k in set(p) | set(counts))


def _chi2_pvalue(p: dict[Any, float], counts: dict[Any, int], n: int) -> float:
    """Pearson's chi-square test of counts against p; cells expected under 5 lumped into one."""
    big = [k for k in p if p[k] * n >= 5]
    cells = [(p[k] * n, counts.get(k, 0)) for k in big]
    rest_e = n - sum(e for e, _ in cells)
    rest_o = n - sum(o for _, o in cells)
    if rest_e > 1e-9:
        cells.append((rest_e, rest_o))
    elif rest_o:
        return 0.0
    stat = sum((o - e) ** 2 / e for e, o in cells)
    df = len(cells) - 1
    return float(
        torch.special.gammaincc(torch.tensor(df / 2.0, dtype=torch.float64), torch.tensor(stat / 2.0))
    )


def test_rejection_rule_keeps_the_target_distribution() -> None:
    """verify_on_device on fixed logits, 20 000 rows at once: the token at each position follows the
    target (temperature, top-k, a repetition penalty that sees the accepted drafts), by closed form."""
    vocab, n = 8, 10000
    gen = torch.Generator().manual_seed(0)
    logits0 = torch.randn(3, vocab, generator=gen) * 1.5
    logits0[1, 4] = logits0[1].max() + 0.5  # the first draft leads at the next row unless penalized as seen
    prompt, drafts = [1, 2, 3], [4, 5]
    sp = SamplingParams(temperature=0.8, top_k=6, repetition_penalty=1.7, max_tokens=10)

    def target(row: int, history: list[int]) -> torch.Tensor:
        x = logits0[row].clone()
        for t in set(history):
            x[t] = x[t] / 1.7 if x[t] > 0 else x[t] * 1.7
        x = x / 0.8
        kth = x.topk(6).values[-1]
        return x.masked_fill(x < kth, float("-inf")).softmax(-1)

    seqs = [Sequence(i, f"s{i}", prompt, sp) for i in range(n)]
    for s in seqs:
        s.append_token(0)  # one output token before the drafts
    logits = logits0.repeat(n, 1)
    draws = verify_on_device(logits, [(s, drafts) for s in seqs], set(), gen)
    res = draws.results()
    first: dict[int, int] = {}
    second: dict[int, int] = {}
    n_second = 0
    for r in res.values():
        toks = [a.token_id for a in r.accepted] + [r.token_id]
        first[toks[0]] = first.get(toks[0], 0) + 1
        if len(toks) > 1:  # the first draft was accepted: the next token follows p_1
            n_second += 1
            second[toks[1]] = second.get(toks[1], 0) + 1
    p0 = target(0, prompt + [0])
    p1 = target(1, prompt + [0, drafts[0]])
    assert 0.1 < p0[drafts[0]] < 0.9 and 0.1 < p1[drafts[1]] < 0.9  # both branches taken often
    for p, counts, total in ((p0, first, n), (p1, second, n_second)):
        pd = {i: float(v) for i, v in enumerate(p) if v > 0}
        assert _chi2_pvalue(pd, counts, total) > 1e-3, (pd, counts)
        assert _tv(pd, counts, total) < 0.02


def test_sampled_tokens_follow_the_model(setup: dict[str, Any]) -> None:
    """The engine with speculation, 1500 continuations (n = 1500) of a prompt whose tokens are the only
    ones top-k keeps, so that every step has drafts that are accepted about a third of the time: the joint
    distribution of the four tokens matches transformers' exact one (logit_bias, top-k, temperature)."""
    import transformers as tf

    a, b, c = 101, 202, 303
    prompt = [5, a, b, c, a, c, b, b, a, c, c, a, b, a, a, c, b, c]
    bias = {a: 8.0, b: 8.0, c: 8.0}
    n = 1500
    llm = LLM(str(setup["dir"]), dtype="float32", speculative_config=SPEC, max_num_seqs=256)
    sp = SamplingParams(
        n=n, temperature=0.9, top_k=3, logit_bias=bias, max_tokens=4, seed=11, ignore_eos=True
    )
    out = _run(llm, [prompt], sp)[0]
    counts: dict[tuple[int, ...], int] = {}
    for o in out.outputs:
        counts[tuple(o.token_ids)] = counts.get(tuple(o.token_ids), 0) + 1
    m = out.metrics
    assert m is not None and m.spec_draft_tokens > 1000 and 0.15 < m.spec_acceptance_rate < 0.6
    model = tf.AutoModelForCausalLM.from_pretrained(setup["dir"], dtype=torch.float32).eval()

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
    assert _tv(exact, counts, n) < 0.15


def test_seeds_reproducible_and_independent_of_batch_mates(setup: dict[str, Any]) -> None:
    d, prompts = setup["dir"], setup["prompts"]
    seeded = SamplingParams(temperature=1.0, top_p=0.9, max_tokens=16, seed=5, ignore_eos=True)
    other = SamplingParams(temperature=1.0, max_tokens=16, ignore_eos=True)
    llm = LLM(str(d), dtype="float32", speculative_config=SPEC, seed=1)
    alone = _run(llm, [prompts[1]], seeded)[0].token_ids
    together = _run(llm, [prompts[0], prompts[1], prompts[2]], [other, seeded, other])[1].token_ids
    again = _run(LLM(str(d), dtype="float32", speculative_config=SPEC, seed=2), [prompts[1]], seeded)
    assert alone == together == again[0].token_ids


def test_constrained_rows_take_no_drafts(setup: dict[str, Any]) -> None:
    """Structured outputs: a row under a grammar decodes without drafts beside rows that have them."""
    llm = LLM(str(setup["dir"]), dtype="float32", speculative_config=SPEC)
    choice = SamplingParams(
        temperature=0, max_tokens=8, structured_outputs=StructuredOutputs(choice=["yes", "no"])
    )
    free = SamplingParams(temperature=0, max_tokens=MAX_NEW, ignore_eos=True)
    outs = _run(llm, setup["prompts"][:2], [choice, free])
    assert outs[0].text in ("yes", "no")
    assert outs[0].metrics is not None and outs[0].metrics.spec_drafts == 0
    assert outs[1].token_ids == setup["ref"][1][0]


def test_acceptance_visible_in_metrics_prometheus_and_trace(setup: dict[str, Any]) -> None:
    from glassbox.server.metrics import ServerMetrics
    from glassbox.trace import run_trace

    llm = LLM(str(setup["dir"]), dtype="float32", speculative_config=SPEC)
    out = _run(llm, setup["prompts"][:1], SamplingParams(temperature=0, max_tokens=MAX_NEW, ignore_eos=True))[
        0
    ]
    m = out.metrics
    assert m is not None and m.spec_drafts > 0 and m.spec_accepted_tokens > 0
    assert m.spec_acceptance_rate == pytest.approx(m.spec_accepted_tokens / m.spec_draft_tokens)
    assert m.spec_mean_acceptance_length == pytest.approx(1 + m.spec_accepted_tokens / m.spec_drafts)
    assert m.as_dict()["spec_accepted_tokens"] == m.spec_accepted_tokens
    prom = ServerMetrics()
    prom.on_iteration(llm.engine, None)
    text = prom.render().decode()
    c = llm.engine.counters
    assert f"glassbox:spec_decode_num_drafts_total {float(c.spec_drafts)}" in text
    assert f"glassbox:spec_decode_num_draft_tokens_total {float(c.spec_draft_tokens)}" in text
    assert f"glassbox:spec_decode_num_accepted_tokens_total {float(c.spec_accepted_tokens)}" in text
    assert sum(c.spec_accepted_per_pos) == c.spec_accepted_tokens
    assert (
        f'spec_decode_num_accepted_tokens_per_pos_total{{position="0"}} {float(c.spec_accepted_per_pos[0])}'
        in text
    )
    trace = run_trace(llm.engine, "abc abc abc abc abc abc", 16, None)
    assert trace["speculative"]["num_speculative_tokens"] == 4
    assert trace["speculative"]["verify_steps"] > 0


def test_ngram_rule_and_config_errors() -> None:
    # the longest suffix of length 1..3 that occurred before, its earliest occurrence, up to k after it
    assert find_ngram_drafts([1, 2, 3, 4, 2, 3], 2, 3, 4) == [4, 2, 3]
    assert find_ngram_drafts([1, 2, 9, 1, 2, 7, 1, 2], 1, 3, 2) == [9, 1]
    assert find_ngram_drafts([5, 1, 2, 3, 6, 2, 3, 1, 2, 3], 1, 3, 2) == [6, 2]  # 3-gram beats 2-gram
    assert find_ngram_drafts([1, 2, 3, 4], 1, 3, 4) == []
    assert find_ngram_drafts([7, 7, 7], 1, 2, 3) == [7]  # only one token follows the earliest "7 7"
    # the proposer's incremental index answers as the rule on the list, token by token
    rng = random.Random(3)
    for _ in range(200):
        vocab, lo = rng.choice([2, 3, 5, 20]), rng.randrange(1, 4)
        hi, k = rng.randrange(lo, 6), rng.randrange(1, 5)
        proposer = NgramProposer(k, lo, hi, 10**6)
        seq = Sequence(0, "r", [rng.randrange(vocab) for _ in range(rng.randrange(1, 8))], SamplingParams())
        for _ in range(25):
            assert proposer.propose(seq, 9) == find_ngram_drafts(seq.token_ids, lo, hi, k), seq.token_ids
            seq.append_token(rng.randrange(vocab))
    spec = parse_speculative_config('{"method": "ngram", "num_speculative_tokens": 3}')
    assert spec is not None and (spec.prompt_lookup_min, spec.prompt_lookup_max) == (5, 5)
    assert parse_speculative_config({"model": "[ngram]", "num_speculative_tokens": 2, "prompt_lookup_max": 4})
    bad = [
        ({"method": "eagle", "num_speculative_tokens": 3}, "method 'eagle' is not supported yet"),
        ({"method": "ngram"}, "num_speculative_tokens is required"),
        ({"method": "ngram", "num_speculative_tokens": 0}, "num_speculative_tokens must be an integer"),
        (
            {"method": "ngram", "num_speculative_tokens": 2, "prompt_lookup_min": 4, "prompt_lookup_max": 2},
            "<=",
        ),
        ({"method": "ngram", "num_speculative_tokens": 2, "bogus": 1}, "unknown key"),
        ("{not json", "JSON"),
    ]
    for value, message in bad:
        with pytest.raises(ValueError, match=message):
            parse_speculative_config(value)  # type: ignore[arg-type]


@pytest.mark.parametrize("k,a", [(3, 0.6), (4, 0.0), (2, 1.0)])
def test_simulator_speculative_steps_match_the_closed_form(k: int, a: float) -> None:
    """One request alone: the simulator's decode steps yield (1 - a^(k+1)) / (1 - a) tokens on average."""
    out_tokens = 3000
    settings = SimSettings(num_kv_blocks=1024, spec_tokens=k, acceptance_rate=a)
    sim = simulate(lambda batch: 1.0, settings, 16, out_tokens, 1, concurrency=1, seed=1)
    decode_steps = sim.steps - 1  # the prefill step gives the first token
    per_step = (out_tokens - 1) / decode_steps
    assert per_step == pytest.approx(expected_tokens_per_step(k, a), rel=0.03)
    assert expected_tokens_per_step(k, a) == pytest.approx(sum(a**i for i in range(k + 1)))
    assert sim.requests[0].output_tokens == out_tokens


def test_drafts_never_take_a_block_a_later_sequence_needs() -> None:
    """Two decoding sequences, one free block: the first's four drafts would need it, the second's next
    token does: the first gets only the draft its own block holds, the second the block and three drafts
    in it, and nobody is preempted."""
    from glassbox.engine.block_manager import BlockManager
    from glassbox.engine.scheduler import Scheduler
    from glassbox.engine.sequence import SequenceStatus
    from glassbox.perf.simulator import DraftProposer

    bm = BlockManager(num_blocks=4, block_size=4, enable_prefix_caching=False)
    sched = Scheduler(bm, max_num_seqs=4, max_num_batched_tokens=64, proposer=DraftProposer(4, 1000))
    sp = SamplingParams(max_tokens=50)
    a = Sequence(0, "a", [1, 2], sp)  # + 1 output: its token at position 2, block 0 holds one draft more
    b = Sequence(1, "b", [1, 2, 3, 4, 5, 6, 7], sp)  # + 2 outputs: its token at position 8 needs a block
    for seq, out in ((a, [9]), (b, [9, 9])):
        seq.token_ids += out
        bm.allocate(seq)
        bm.grow(seq, len(seq) - 1)
        seq.num_computed_tokens = len(seq) - 1
        seq.status = SequenceStatus.RUNNING
        sched.running.append(seq)
    assert bm.num_free_blocks == 1 and len(a.block_table) == 1 and len(b.block_table) == 2
    batch = sched.schedule()
    assert not batch.preempted
    rows = {s.seq.seq_id: s for s in batch.scheduled}
    assert [len(rows[0].draft_tokens), len(rows[1].draft_tokens)] == [1, 3]
    assert len(a.block_table) == 1 and len(b.block_table) == 3 and bm.num_free_blocks == 0
    bm.check_integrity([a, b])


def test_plan_predicts_the_speedup() -> None:
    from glassbox.perf.plan_request import PlanRequest
    from glassbox.perf.planner import plan

    base = dict(model="llama-3.1-8b", hardware="dgx-spark", output_tokens=128, concurrency=(1,))
    plain = plan(PlanRequest(**base))  # type: ignore[arg-type]
    spec = plan(PlanRequest(**base, spec_tokens=4, acceptance_rate=0.7))  # type: ignore[arg-type]
    row = spec["speculative"]
    assert plain["speculative"] is None
    assert row["tokens_per_step"] == pytest.approx((1 - 0.7**5) / 0.3, abs=1e-3)
    # memory bound: a step of 5 rows costs about one of 1 row, so the rate follows the tokens per step
    assert (
        row["bound"] == "memory" and 0.8 * row["tokens_per_step"] < row["speedup"] <= row["tokens_per_step"]
    )
    ratio = spec["concurrency"][0]["per_request_tok_s"] / plain["concurrency"][0]["per_request_tok_s"]
    assert ratio == pytest.approx(row["speedup"], rel=0.15)  # the simulator's steps agree
    for kw, flag in (({"spec_tokens": 4}, "--acceptance-rate"), ({"acceptance_rate": 0.5}, "--spec-tokens")):
        with pytest.raises(ValueError, match=flag):
            PlanRequest(**base, **kw)  # type: ignore[arg-type]
