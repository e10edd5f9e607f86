"""The sampler on its own: top-k/top-p without a full-vocabulary sort where no row needs one, one batched
uniform draw for the rows without a seed, seeded rows independent of their batch mates, draws that follow
the filtered distribution (chi-square against the probabilities)."""

from __future__ import annotations

from typing import Any

import pytest
import torch
from torch.utils._python_dispatch import TorchDispatchMode

from glassbox.engine.sampler import filter_probs as _filter
from glassbox.engine.sampler import sample_on_device
from glassbox.engine.sequence import Sequence
from glassbox.sampling_params import SamplingParams

VOCAB = 1000


class _Ops(TorchDispatchMode):
    """Records the aten ops run inside it."""

    def __init__(self) -> None:
        super().__init__()
        self.names: list[str] = []

    def __torch_dispatch__(self, func: Any, types: Any, args: Any = (), kwargs: Any = None) -> Any:
        self.names.append(func.__name__.split(".")[0].strip("_"))  # _softmax, uniform_ -> softmax, uniform
        return func(*args, **(kwargs or {}))


def _seqs(params: list[SamplingParams]) -> list[Sequence]:
    return [Sequence(i, f"r{i}", [1, 2, 3], sp) for i, sp in enumerate(params)]


def _reference_filter(logits: torch.Tensor, seqs: list[Sequence]) -> torch.Tensor:
    """The sampler's filter as it was: every row through one full-vocabulary sort."""
    sps = [s.sampling_params for s in seqs]
    logits = logits / torch.tensor([max(sp.temperature, 1e-5) for sp in sps])[:, None]
    vocab = logits.shape[1]
    sorted_logits, order = logits.sort(dim=-1, descending=True)
    ks = torch.tensor([sp.top_k if 0 < sp.top_k < vocab else vocab for sp in sps])
    drop = torch.arange(vocab)[None, :] >= ks[:, None]
    probs_sorted = sorted_logits.masked_fill(drop, float("-inf")).softmax(dim=-1)
    cum = probs_sorted.cumsum(dim=-1)
    drop |= (cum - probs_sorted) >= torch.tensor([sp.top_p for sp in sps])[:, None]
    drop[:, 0] = False
    logits = torch.empty_like(logits).scatter_(1, order, sorted_logits.masked_fill(drop, float("-inf")))
    probs = logits.softmax(dim=-1)
    mp = torch.tensor([sp.min_p for sp in sps])[:, None]
    probs = probs.masked_fill(probs < mp * probs.max(dim=-1, keepdim=True).values, 0.0)
    return probs / probs.sum(dim=-1, keepdim=True)


MIX = [
    SamplingParams(temperature=0.7, top_k=20),
    SamplingParams(temperature=1.3, top_k=5, top_p=0.8),
    SamplingParams(temperature=1.0),
    SamplingParams(temperature=0.9, top_p=0.5),
    SamplingParams(temperature=1.1, top_k=50, min_p=0.05),
]


def test_filter_matches_the_full_sort() -> None:
    gen = torch.Generator().manual_seed(0)
    logits = torch.randn(len(MIX), VOCAB, generator=gen) * 3
    for rows in ([0, 1, 2, 3, 4], [0, 1, 4], [2], [3, 2]):
        seqs = _seqs([MIX[i] for i in rows])
        got = _filter(logits[rows].clone(), seqs)
        torch.testing.assert_close(got, _reference_filter(logits[rows].clone(), seqs), rtol=1e-5, atol=1e-7)


def test_no_full_sort_unless_a_row_cuts_by_top_p_alone() -> None:
    logits = torch.randn(3, VOCAB)
    for params, sorts in (
        ([MIX[0], MIX[1], MIX[2]], False),  # top-k rows: their k best only (topk); row 2 cuts nothing
        ([MIX[2], MIX[2]], False),  # nothing to cut
        ([MIX[0], MIX[3]], True),  # top-p alone needs the whole order
    ):
        with _Ops() as ops:
            _filter(logits[: len(params)].clone(), _seqs(params))
        assert ("sort" in ops.names) == sorts, (params, ops.names)


def test_top_p_alone_ranks_candidates_first_on_the_cpu(monkeypatch: pytest.MonkeyPatch) -> None:
    """Top-p without top-k: the best TOP_P_CANDIDATES tokens (topk), the whole order only when some row's
    top_p mass is not among them; the same probabilities as the full sort either way, beside top-k rows."""
    from glassbox.engine import sampler

    monkeypatch.setattr(sampler, "TOP_P_CANDIDATES", 64)
    gen = torch.Generator().manual_seed(3)
    peaked = torch.randn(len(MIX), VOCAB, generator=gen) * 6  # top_p's mass within the best 64 tokens
    flat = torch.randn(len(MIX), VOCAB, generator=gen) * 0.5  # not: a full sort
    for logits, sorts in ((peaked, False), (flat, True)):
        for rows in ([3], [0, 3, 1], [2, 3, 4]):
            seqs = _seqs([MIX[i] for i in rows])
            with _Ops() as ops:
                got = _filter(logits[rows].clone(), seqs)
            assert ("sort" in ops.names) == sorts, (rows, ops.names)
            ref = _reference_filter(logits[rows].clone(), seqs)
            torch.testing.assert_close(got, ref, rtol=1e-5, atol=1e-7)


def test_greedy_rows_take_the_argmax_and_draw_nothing() -> None:
    logits = torch.randn(4, VOCAB)
    with _Ops() as ops:
        out = sample_on_device(
            logits.clone(), _seqs([SamplingParams(temperature=0)] * 4), set(), torch.Generator()
        )
    assert out.tokens.tolist() == logits.argmax(-1).tolist()
    assert not {"uniform", "cumsum", "sort", "topk", "softmax"} & set(ops.names), ops.names


def test_one_noise_draw_for_the_unseeded_rows() -> None:
    params = [SamplingParams(temperature=1.0)] * 6 + [SamplingParams(temperature=1.0, seed=3)]
    with _Ops() as ops:
        sample_on_device(torch.randn(7, VOCAB), _seqs(params), set(), torch.Generator().manual_seed(0))
    assert ops.names.count("uniform") == 2  # all rows at once, then the seeded row from its own
    assert "exponential" not in ops.names  # one uniform a row, not one exponential per token


def test_draws_follow_the_filtered_distribution() -> None:
    """20,000 rows of one distribution over 12 tokens (a zero, a near-zero, ties), under each filter: the
    drawn tokens' counts against filter_probs' probabilities (Pearson chi-square), and never a token the
    filter removed."""
    from test_spec_decode import _chi2_pvalue

    logits = torch.tensor([2.0, 1.5, 1.5, 1.0, 0.5, 0.0, -0.5, -1.0, -3.0, -30.0, float("-inf"), 0.25])
    n = 20_000
    for sp in (SamplingParams(temperature=1.0), SamplingParams(temperature=0.7, top_k=5),
               SamplingParams(temperature=1.2, top_p=0.8), SamplingParams(temperature=1.0, min_p=0.1)):  # fmt: skip
        seqs = _seqs([sp] * n)
        probs = _filter(logits[None].clone(), seqs[:1])[0].tolist()
        out = sample_on_device(logits.expand(n, -1).clone(), seqs, set(), torch.Generator().manual_seed(5))
        counts = torch.bincount(out.tokens, minlength=len(logits)).tolist()
        assert not any(c for c, p in zip(counts, probs, strict=True) if p == 0), (sp, counts)
        pvalue = _chi2_pvalue(dict(enumerate(probs)), dict(enumerate(counts)), n)
        assert pvalue > 1e-3, (sp, counts, pvalue)


def test_seeded_rows_do_not_depend_on_batch_mates() -> None:
    seeded = SamplingParams(temperature=1.0, top_k=100, seed=42)
    gen = torch.Generator().manual_seed(1)
    steps = [torch.randn(VOCAB, generator=gen) for _ in range(5)]
    alone_seq = _seqs([seeded])[0]
    alone = [
        sample_on_device(x[None].clone(), [alone_seq], set(), torch.Generator()).tokens.item() for x in steps
    ]
    mates = _seqs([SamplingParams(temperature=1.0), seeded, SamplingParams(temperature=0.5, top_p=0.9)])
    shared = torch.Generator().manual_seed(7)
    mixed = []
    for x in steps:
        batch = torch.stack([torch.randn(VOCAB), x, torch.randn(VOCAB)])
        mixed.append(sample_on_device(batch, mates, set(), shared).tokens[1].item())
    assert mixed == alone


def test_logit_bias_shifts_only_the_rows_that_ask_in_one_call() -> None:
    gen = torch.Generator().manual_seed(2)
    logits = torch.randn(4, VOCAB, generator=gen) * 3
    top = int(logits[2].argmax())
    params = [
        SamplingParams(temperature=0, logit_bias={7: 100.0}, logprobs=0),
        SamplingParams(temperature=0),
        SamplingParams(temperature=0, logit_bias={top: -100.0, 3: 2.5}),
        SamplingParams(temperature=0.8, top_k=3, logit_bias={11: 100.0}),  # before top-k: 11 makes the cut
    ]
    biased = logits.clone()
    biased[0, 7] += 100.0
    biased[2, top] -= 100.0
    biased[2, 3] += 2.5
    with _Ops() as ops:
        out = sample_on_device(logits.clone(), _seqs(params), set(), torch.Generator().manual_seed(0))
    results = out.results()
    assert [r.token_id for r in results[:3]] == biased[:3].argmax(-1).tolist()
    assert results[1].token_id == int(logits[1].argmax()) and results[3].token_id == 11
    raw = logits[0].log_softmax(-1)[7].item()  # logprobs: the model's own distribution, before the bias
    assert results[0].logprobs == {7: pytest.approx(raw, abs=1e-5)}
    assert ops.names.count("index_put") == 1
