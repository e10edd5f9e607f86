"""Sampler: penalties, logit_bias, temperature, top-k/top-p/min-p, one batched draw (per-request generators
for seeded requests), logprobs.

On CUDA nothing here waits for the device: host values travel through pinned non-blocking copies (a
plain ``torch.tensor(..., device="cuda")`` synchronizes the stream) until the caller reads the draws.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from glassbox.engine.sequence import Sequence
from glassbox.engine.structured import mask_logits
from glassbox.layers.host import to_device
from glassbox.outputs import SampleResult

__all__ = [
    "SampledBatch",
    "adjust_logits",
    "draw",
    "filter_probs",
    "make_generator",
    "sample_on_device",
    "to_device",
    "uniform_noise",
]

MIN_LOGPROB = -9999.0  # what a top logprob of -inf (a token the grammar forbids) is reported as


def _apply_penalties(logits: torch.Tensor, seqs: list[Sequence], vocab: int) -> None:
    """In place, row by row for the rows that ask for a penalty (OpenAI and HF semantics)."""
    for row, seq in enumerate(seqs):
        sp = seq.sampling_params
        if sp.repetition_penalty != 1.0:
            seen = to_device(sorted({t for t in seq.token_ids if t < vocab}), torch.long, logits.device)
            vals = logits[row, seen]
            logits[row, seen] = torch.where(
                vals > 0, vals / sp.repetition_penalty, vals * sp.repetition_penalty
            )
        if sp.presence_penalty != 0.0 or sp.frequency_penalty != 0.0:
            out = seq.output_token_ids
            if out:
                ids = to_device(out, torch.long, logits.device)
                counts = torch.zeros(vocab, dtype=logits.dtype, device=logits.device)
                counts.scatter_add_(0, ids, torch.ones_like(ids, dtype=logits.dtype))
                logits[row] -= sp.frequency_penalty * counts + sp.presence_penalty * (counts > 0).to(
                    logits.dtype
                )


def _suppress_stops(logits: torch.Tensor, seqs: list[Sequence], eos_ids: set[int]) -> None:
    """min_tokens: EOS and stop_token_ids cannot be drawn before the minimum length."""
    for row, seq in enumerate(seqs):
        sp = seq.sampling_params
        if seq.num_output_tokens < sp.min_tokens:
            banned = [
                t
                for t in (set(sp.stop_token_ids) | (set() if sp.ignore_eos else eos_ids))
                if t < logits.shape[1]
            ]
            if banned:
                logits[row, to_device(banned, torch.long, logits.device)] = float("-inf")


def _apply_logit_bias(logits: torch.Tensor, seqs: list[Sequence]) -> None:
    """In place: every (row, token, bias) of the rows that ask, added in one indexed call."""
    rows: list[int] = []
    cols: list[int] = []
    vals: list[float] = []
    for row, seq in enumerate(seqs):
        for token, bias in (seq.sampling_params.logit_bias or {}).items():
            if token < logits.shape[1]:  # the vocabulary is checked at the door (engine/request_check.py)
                rows.append(row)
                cols.append(token)
                vals.append(bias)
    if rows:
        dev = logits.device
        index = (to_device(rows, torch.long, dev), to_device(cols, torch.long, dev))
        logits.index_put_(index, to_device(vals, logits.dtype, dev), accumulate=True)


def filter_probs(logits: torch.Tensor, seqs: list[Sequence]) -> torch.Tensor:
    """Temperature, top-k, top-p and min-p over (S, V) float32 logits; returns probabilities.

    Only the rows that cut (top-k or top-p) are ranked, and when each of them has a top-k, only their k
    best tokens (``topk``), not the whole vocabulary; top-p alone needs the full order (a sort)."""
    dev = logits.device
    vocab = logits.shape[1]
    sps = [s.sampling_params for s in seqs]
    temps = to_device([max(sp.temperature, 1e-5) for sp in sps], torch.float32, dev)
    logits = logits / temps[:, None]
    ks = [sp.top_k if 0 < sp.top_k < vocab else vocab for sp in sps]
    cut = [i for i, sp in enumerate(sps) if ks[i] < vocab or sp.top_p < 1.0]
    if cut:
        whole = len(cut) == len(seqs)
        idx = None if whole else to_device(cut, torch.long, dev)
        sub = logits if idx is None else logits.index_select(0, idx)
        width = max(ks[i] for i in cut)  # == vocab when a row cuts by top-p alone
        ps = to_device([sps[i].top_p for i in cut], torch.float32, dev)[:, None]
        vals, order, lse = _candidates(sub, width, ks, cut, ps)
        ranks = torch.arange(vals.shape[1], device=dev)[None, :]
        drop = ranks >= to_device([ks[i] for i in cut], torch.long, dev)[:, None]
        masked = vals.masked_fill(drop, float("-inf"))
        # each row's probabilities in rank order: within its top k, or (top-p alone) of the whole row
        if lse is None:
            probs_sorted = masked.softmax(dim=-1)
        else:
            whole_row = to_device([ks[i] == vocab for i in cut], torch.bool, dev)[:, None]
            probs_sorted = (masked - torch.where(whole_row, lse, masked.logsumexp(-1, keepdim=True))).exp()
        cum = probs_sorted.cumsum(dim=-1)
        drop |= (cum - probs_sorted) >= ps  # keep the smallest prefix whose mass reaches top_p
        drop[:, 0] = False
        kept = torch.full_like(sub, float("-inf")).scatter_(1, order, vals.masked_fill(drop, float("-inf")))
        logits = kept if idx is None else logits.index_copy(0, idx, kept)
    probs = logits.softmax(dim=-1)
    min_ps = [sp.min_p for sp in sps]
    if any(m > 0 for m in min_ps):
        mp = to_device(min_ps, torch.float32, dev)[:, None]
        probs = probs.masked_fill(probs < mp * probs.max(dim=-1, keepdim=True).values, 0.0)
        probs = probs / probs.sum(dim=-1, keepdim=True)
    return probs


# top-p alone on the CPU: the best this many tokens first (topk: ~13x faster than sorting 151,936 here)
TOP_P_CANDIDATES = 1024


def _candidates(
    sub: torch.Tensor, width: int, ks: list[int], cut: list[int], ps: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor | None]:
    """The cutting rows' best ``width`` logits and their token ids, best first, and for rows that cut by
    top-p alone (``width`` the vocabulary) each row's log-sum-exp (else None: every row's top k is whole).
    A full sort only where needed: on the CPU, top-p alone first takes the best TOP_P_CANDIDATES (or the
    largest top-k) tokens and sorts the whole rows only if some row's top_p mass is not among them (on
    CUDA that check would wait for the device: the sort runs there)."""
    vocab = sub.shape[1]
    if width < vocab:
        vals, order = sub.topk(width, dim=-1)
        return vals, order, None
    lse = sub.logsumexp(dim=-1, keepdim=True)
    topk = [ks[i] for i in cut if ks[i] < vocab]
    cand = max([TOP_P_CANDIDATES, *topk])
    if sub.device.type == "cpu" and cand < vocab:
        vals, order = sub.topk(cand, dim=-1)
        has_k = torch.tensor([ks[i] < vocab for i in cut])[:, None]  # their top k is among the candidates
        if bool(((vals - lse).exp().sum(dim=-1, keepdim=True) >= ps).logical_or_(has_k).all()):
            return vals, order, lse
    vals, order = sub.sort(dim=-1, descending=True)
    return vals, order, lse


def adjust_logits(logits: torch.Tensor, seqs: list[Sequence], eos_ids: set[int]) -> None:
    """In place, the rows' history-dependent adjustments in order: penalties, logit_bias, min_tokens."""
    if any(
        s.sampling_params.repetition_penalty != 1.0
        or s.sampling_params.presence_penalty != 0.0
        or s.sampling_params.frequency_penalty != 0.0
        for s in seqs
    ):
        _apply_penalties(logits, seqs, logits.shape[1])
    if any(s.sampling_params.logit_bias for s in seqs):
        _apply_logit_bias(logits, seqs)
    if any(s.num_output_tokens < s.sampling_params.min_tokens for s in seqs):
        _suppress_stops(logits, seqs, eos_ids)


def make_generator(seq: Sequence, device: torch.device) -> torch.Generator:
    """The generator of a sequence whose request gave a seed (from the seed and its index among n)."""
    sp = seq.sampling_params
    assert sp.seed is not None
    gen = torch.Generator(device=device)
    gen.manual_seed((sp.seed * 7919 + seq.index) & 0x7FFF_FFFF_FFFF_FFFF)
    return gen


def uniform_noise(
    seqs: list[Sequence], cols: int, generator: torch.Generator, device: torch.device
) -> torch.Tensor:
    """(len(seqs), cols) draws from U[0, 1): one draw from the engine's ``generator`` for every row, then the
    rows of seeded requests again from their own generators, so that those do not depend on batch mates."""
    u = torch.empty(len(seqs), cols, device=device).uniform_(generator=generator)
    for j, seq in enumerate(seqs):
        if seq.sampling_params.seed is not None:
            if seq.generator is None:
                seq.generator = make_generator(seq, device)
            u[j].uniform_(generator=seq.generator)
    return u


def draw(probs: torch.Tensor, u: torch.Tensor) -> torch.Tensor:
    """One token per row of ``probs`` (S, V), non-negative weights, not necessarily normalized, by inverse
    transform: the first token whose cumulative weight (float64) exceeds ``u`` (S,) times the row's total.
    A token of weight 0 is never drawn. One uniform per row instead of an exponential race's V of them
    (argmax p / E, E ~ Exp(1): ~27 ns a value here): ``sample_on_device`` at temperature 0.8 on two Xeon
    cores, 151,936 tokens, 0.77 / 18 / 438 ms at batch 1 / 16 / 256 instead of 5.4 / 98 / 1,478
    (benchmarks/sampler_draw.py)."""
    cum = probs.cumsum(dim=-1, dtype=torch.float64)
    target = u.double()[:, None] * cum[:, -1:]
    return torch.searchsorted(cum, target, right=True)[:, 0].clamp_(max=probs.shape[1] - 1)


@dataclass
class SampledBatch:
    """One step's draws, still on the device: reading them (:meth:`results`) waits for the device.

    Until then the host is free to do other work while the device computes (the engine post-processes
    the previous step's outputs there).
    """

    tokens: torch.Tensor  # (S,) int64
    want_logprobs: list[int | None]
    lp_rows: list[int]  # rows that asked for logprobs, in order
    top_vals: torch.Tensor | None = None  # (len(lp_rows), k) of the raw log-probabilities
    top_ids: torch.Tensor | None = None
    chosen: torch.Tensor | None = None  # (len(lp_rows),) the drawn token's raw log-probability

    def results(self) -> list[SampleResult]:
        tokens = self.tokens.tolist()
        lps: list[dict[int, float] | None] = [None] * len(tokens)
        if self.chosen is not None:
            chosen = self.chosen.tolist()
            vals = self.top_vals.tolist() if self.top_vals is not None else None
            ids = self.top_ids.tolist() if self.top_ids is not None else None
            for j, i in enumerate(self.lp_rows):
                n = self.want_logprobs[i] or 0
                lp: dict[int, float] = {}
                if n > 0 and vals is not None and ids is not None:  # -inf (a masked token): vLLM's floor
                    lp = {t: max(v, MIN_LOGPROB) for t, v in zip(ids[j][:n], vals[j][:n], strict=True)}
                lp[tokens[i]] = chosen[j]
                lps[i] = lp
        return [SampleResult(t, lp) for t, lp in zip(tokens, lps, strict=True)]


def sample_on_device(
    logits: torch.Tensor, seqs: list[Sequence], eos_ids: set[int], generator: torch.Generator
) -> SampledBatch:
    """Draw one token per row of ``logits`` (S, V) float32 without waiting for the device.

    ``logits`` is the caller's fresh tensor and is adjusted in place (grammar masks, penalties, logit_bias,
    min_tokens); logprobs are taken from it after the grammar masks (as vLLM's default raw logprobs, which it
    takes after its bitmask) and before any other adjustment. Greedy rows take the argmax; the others draw by
    inverse transform (``draw``), one uniform each, drawn for all of them at once from the engine's
    ``generator``, except that a request with a seed draws its rows from its own generator: its tokens do
    not depend on what else shares its batch."""
    dev = logits.device
    grammar_rows = [i for i, s in enumerate(seqs) if s.grammar is not None]
    if grammar_rows:  # structured outputs: first, so that logprobs and every filter see the mask
        states = [s.grammar for s in seqs if s.grammar is not None]
        mask_logits(logits, grammar_rows, states, [seqs[i].token_ids for i in grammar_rows])
    want_logprobs = [s.sampling_params.logprobs for s in seqs]
    lp_rows = [i for i, n in enumerate(want_logprobs) if n is not None]
    lp_idx = to_device(lp_rows, torch.long, dev) if 0 < len(lp_rows) < len(seqs) else None
    raw_logprobs = None
    if lp_rows:
        raw_logprobs = (logits if lp_idx is None else logits.index_select(0, lp_idx)).log_softmax(dim=-1)
    adjust_logits(logits, seqs, eos_ids)
    random_rows = [i for i, s in enumerate(seqs) if not s.sampling_params.greedy]
    if len(random_rows) < len(seqs):
        tokens = logits.argmax(dim=-1)  # the greedy rows' picks (the others are overwritten below)
    if random_rows:
        sub = [seqs[i] for i in random_rows]
        idx = to_device(random_rows, torch.long, dev) if len(random_rows) < len(seqs) else None
        probs = filter_probs(logits.index_select(0, idx) if idx is not None else logits, sub)
        drawn = draw(probs, uniform_noise(sub, 1, generator, dev)[:, 0])
        tokens = drawn if idx is None else tokens.index_copy(0, idx, drawn)
    out = SampledBatch(tokens, want_logprobs, lp_rows)
    if raw_logprobs is not None:
        k = max(want_logprobs[i] or 0 for i in lp_rows)
        chosen = tokens if lp_idx is None else tokens.index_select(0, lp_idx)
        out.chosen = raw_logprobs.gather(1, chosen[:, None])[:, 0]
        if k > 0:
            out.top_vals, out.top_ids = raw_logprobs.topk(k, dim=-1)
    return out
