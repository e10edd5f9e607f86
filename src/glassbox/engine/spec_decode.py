"""Speculative decoding's verification: which drafts the target model accepts, and the token after them.

A sequence with k drafts d_1..d_k runs k + 1 rows in one forward (its last token, then the drafts, each a
decode row over the cache up to its own position), so row i holds the target model's distribution p_i for
the position after d_1..d_i. Each row is processed as the sampler processes a plain row of the sequence as it would
be after those i drafts (``DraftRow``: penalties see the drafts in the history, min_tokens counts them),
then, from row 0 on, until a draft is rejected:

- greedy rows: d_{i+1} is accepted iff it is the argmax of p_i; else the argmax is the token;
- sampled rows: d_{i+1} is accepted with probability p_i(d_{i+1}); else the token is drawn from p_i
  with d_{i+1} removed and renormalized. This is the general rule (accept x ~ q with probability
  min(1, p(x) / q(x)), else draw from max(0, p - q) renormalized) for the n-gram proposer's
  deterministic proposal, q = one-hot(x): min(1, p(x)) = p(x), and max(0, p - one-hot(x)) is p with x's
  mass removed. The token at this position is x with probability p(x), and y != x with probability
  (1 - p(x)) p(y) / (1 - p(x)) = p(y): exactly p;
- after k accepted drafts, row k draws one more token from p_k (the bonus token).

Each sampled row takes two uniforms, the acceptance test's u (accept iff u < p_i(d_{i+1})) and the draw's
(by inverse transform, as the sampler draws: sampler.draw), from the engine's generator, or for a request
with a seed from its own, in row order, so that its tokens do not depend on its batch mates (given the same
drafts). Nothing here waits for the device until ``results``.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, cast

import torch

from glassbox.engine.sampler import (
    SampledBatch,
    adjust_logits,
    draw,
    filter_probs,
    to_device,
    uniform_noise,
)
from glassbox.outputs import SampleResult

if TYPE_CHECKING:
    from glassbox.engine.sequence import Sequence
    from glassbox.sampling_params import SamplingParams


class DraftRow:
    """A sequence as it would be after its first drafts: what the sampler reads of a row (its params,
    history, output count, generator). Its generator is the sequence's own."""

    grammar = None  # sequences under a grammar get no drafts (engine/scheduler.py)

    def __init__(self, seq: Sequence, extra: list[int]) -> None:
        self.seq = seq
        self.extra = extra
        self.sampling_params: SamplingParams = seq.sampling_params
        self.index = seq.index

    @property
    def token_ids(self) -> list[int]:
        return self.seq.token_ids + self.extra if self.extra else self.seq.token_ids

    @property
    def output_token_ids(self) -> list[int]:
        return self.token_ids[len(self.seq.prompt_token_ids) :]

    @property
    def num_output_tokens(self) -> int:
        return self.seq.num_output_tokens + len(self.extra)

    @property
    def generator(self) -> torch.Generator | None:
        return self.seq.generator

    @generator.setter
    def generator(self, value: torch.Generator | None) -> None:
        self.seq.generator = value


@dataclass
class SpecDraws:
    """One step's verification, still on the device: per row its token (the draft where accepted) and
    whether its draft was accepted; per sequence its number of rows."""

    seq_ids: list[int]
    num_rows: list[int]  # 1 + drafts, per sequence
    rows: SampledBatch  # per row: the token at its position (and logprobs)
    accepted: torch.Tensor  # (R,) bool: the row's draft was accepted (False on each sequence's last row)

    def results(self) -> dict[int, SampleResult]:
        """{seq_id: the token after the accepted drafts, with those drafts in ``accepted``}; waits."""
        per_row = self.rows.results()
        acc = self.accepted.tolist()
        out: dict[int, SampleResult] = {}
        row = 0
        for seq_id, n in zip(self.seq_ids, self.num_rows, strict=True):
            j = 0
            while j < n - 1 and acc[row + j]:
                j += 1
            last = per_row[row + j]
            out[seq_id] = SampleResult(last.token_id, last.logprobs, per_row[row : row + j])
            row += n
        return out


def verify_on_device(
    logits: torch.Tensor,  # (R, V) float32: for each sequence, 1 + len(drafts) rows in order
    specs: list[tuple[Sequence, list[int]]],  # (sequence, its drafts)
    eos_ids: set[int],
    generator: torch.Generator,
) -> SpecDraws:
    """Accept or reject each sequence's drafts against ``logits`` (adjusted in place) and draw the token
    after the accepted ones; see the module's docstring for the rule."""
    dev = logits.device
    rows = [DraftRow(seq, drafts[:i]) for seq, drafts in specs for i in range(len(drafts) + 1)]
    views = cast("list[Sequence]", rows)  # the sampler reads only what DraftRow has
    nxt = [d[i] if i < len(d) else -1 for _, d in specs for i in range(len(d) + 1)]
    want = [r.sampling_params.logprobs for r in rows]
    lp_rows = [i for i, n in enumerate(want) if n is not None]
    raw_logprobs = None
    if lp_rows:  # raw logprobs, before the penalties, as the sampler's
        idx = to_device(lp_rows, torch.long, dev) if len(lp_rows) < len(rows) else None
        raw_logprobs = (logits if idx is None else logits.index_select(0, idx)).log_softmax(dim=-1)
    adjust_logits(logits, views, eos_ids)
    draft = to_device(nxt, torch.long, dev)
    has_draft = draft >= 0
    draft = draft.clamp(min=0)
    picked = logits.argmax(dim=-1)  # greedy rows' token; the others' are drawn below
    accepted = (picked == draft) & has_draft
    random_rows = [i for i, r in enumerate(rows) if not r.sampling_params.greedy]
    if random_rows:
        sub_rows = [views[i] for i in random_rows]
        ridx = to_device(random_rows, torch.long, dev) if len(random_rows) < len(rows) else None
        probs = filter_probs(logits if ridx is None else logits.index_select(0, ridx), sub_rows)
        u = uniform_noise(sub_rows, 2, generator, dev)  # the acceptance test's, then the draw's
        d = draft if ridx is None else draft.index_select(0, ridx)
        has = has_draft if ridx is None else has_draft.index_select(0, ridx)
        p_draft = probs.gather(1, d[:, None])[:, 0]
        acc = (u[:, 0] < p_draft) & has
        residual = torch.where(has[:, None], probs.scatter(1, d[:, None], 0.0), probs)
        drawn = draw(residual, u[:, 1])
        if ridx is None:
            picked, accepted = drawn, acc
        else:
            picked = picked.index_copy(0, ridx, drawn)
            accepted = accepted.index_copy(0, ridx, acc)
    tokens = torch.where(accepted, draft, picked)
    sampled = SampledBatch(tokens, want, lp_rows)
    if raw_logprobs is not None:
        k = max(want[i] or 0 for i in lp_rows)
        chosen = (
            tokens
            if len(lp_rows) == len(rows)
            else tokens.index_select(0, to_device(lp_rows, torch.long, dev))
        )
        sampled.chosen = raw_logprobs.gather(1, chosen[:, None])[:, 0]
        if k > 0:
            sampled.top_vals, sampled.top_ids = raw_logprobs.topk(k, dim=-1)
    return SpecDraws([s.seq_id for s, _ in specs], [len(d) + 1 for _, d in specs], sampled, accepted)
