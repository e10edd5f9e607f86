"""Sampler: penalties, temperature, top-k/top-p/min-p, per-request seeded draws, logprobs."""

from __future__ import annotations

import torch

from glassbox.engine.sequence import Sequence
from glassbox.outputs import SampleResult


def _apply_penalties(logits: torch.Tensor, seqs: list[Sequence], vocab: int) -> None:
    """In place, row by row for the rows that ask for a penalty (OpenAI and HF semantics)."""
    for row, seq in enumerate(seqs):
        sp = seq.sampling_params
        if sp.repetition_penalty != 1.0:
            seen = torch.tensor(
                sorted({t for t in seq.token_ids if t < vocab}), dtype=torch.long, device=logits.device
            )
            vals = logits[row, seen]
            logits[row, seen] = torch.where(
                vals > 0, vals / sp.repetition_penalty, vals * sp.repetition_penalty
            )
        if sp.presence_penalty != 0.0 or sp.frequency_penalty != 0.0:
            out = seq.output_token_ids
            if out:
                ids = torch.tensor(out, dtype=torch.long, device=logits.device)
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
                logits[row, banned] = float("-inf")


def _filter(logits: torch.Tensor, seqs: list[Sequence]) -> torch.Tensor:
    """Temperature, top-k, top-p and min-p over (S, V) float32 logits; returns probabilities."""
    dev = logits.device
    temps = torch.tensor([max(s.sampling_params.temperature, 1e-5) for s in seqs], device=dev)
    logits = logits / temps[:, None]
    top_ks = [s.sampling_params.top_k for s in seqs]
    top_ps = [s.sampling_params.top_p for s in seqs]
    vocab = logits.shape[1]
    if any(0 < k < vocab for k in top_ks) or any(p < 1.0 for p in top_ps):
        sorted_logits, order = logits.sort(dim=-1, descending=True)
        ks = torch.tensor([k if 0 < k < vocab else vocab for k in top_ks], device=dev)
        ranks = torch.arange(vocab, device=dev)[None, :]
        drop = ranks >= ks[:, None]
        probs_sorted = sorted_logits.masked_fill(drop, float("-inf")).softmax(dim=-1)
        cum = probs_sorted.cumsum(dim=-1)
        ps = torch.tensor(top_ps, device=dev)[:, None]
        drop |= (cum - probs_sorted) >= ps  # keep the smallest prefix whose mass reaches top_p
        drop[:, 0] = False
        sorted_logits = sorted_logits.masked_fill(drop, float("-inf"))
        logits = torch.empty_like(logits).scatter_(1, order, sorted_logits)
    probs = logits.softmax(dim=-1)
    min_ps = [s.sampling_params.min_p for s in seqs]
    if any(m > 0 for m in min_ps):
        mp = torch.tensor(min_ps, device=dev)[:, None]
        probs = probs.masked_fill(probs < mp * probs.max(dim=-1, keepdim=True).values, 0.0)
        probs = probs / probs.sum(dim=-1, keepdim=True)
    return probs


def make_generator(seq: Sequence, engine_seed: int, device: torch.device) -> torch.Generator:
    """The generator of one sequence: from its request's seed (and index among n), else the engine's."""
    sp = seq.sampling_params
    base = sp.seed if sp.seed is not None else engine_seed * 1_000_003 + seq.seq_id
    gen = torch.Generator(device=device)
    gen.manual_seed((base * 7919 + seq.index) & 0x7FFF_FFFF_FFFF_FFFF)
    return gen


def sample(
    logits: torch.Tensor, seqs: list[Sequence], eos_ids: set[int], engine_seed: int
) -> list[SampleResult]:
    """Pick one token per row of ``logits`` (S, V) float32 for the sequences ``seqs`` (same order).

    ``logits`` is the caller's fresh tensor and is adjusted in place (penalties, min_tokens); logprobs are
    taken from it before any adjustment."""
    want_logprobs = [s.sampling_params.logprobs for s in seqs]
    raw_logprobs = logits.log_softmax(dim=-1) if any(n is not None for n in want_logprobs) else None
    if any(
        s.sampling_params.repetition_penalty != 1.0
        or s.sampling_params.presence_penalty != 0.0
        or s.sampling_params.frequency_penalty != 0.0
        for s in seqs
    ):
        _apply_penalties(logits, seqs, logits.shape[1])
    if any(s.num_output_tokens < s.sampling_params.min_tokens for s in seqs):
        _suppress_stops(logits, seqs, eos_ids)
    greedy_rows = [i for i, s in enumerate(seqs) if s.sampling_params.greedy]
    random_rows = [i for i, s in enumerate(seqs) if not s.sampling_params.greedy]
    tokens = [0] * len(seqs)
    if greedy_rows:
        picked = logits[greedy_rows].argmax(dim=-1).tolist()
        for i, t in zip(greedy_rows, picked, strict=True):
            tokens[i] = t
    if random_rows:
        sub = [seqs[i] for i in random_rows]
        probs = _filter(logits[random_rows], sub)
        for j, (i, seq) in enumerate(zip(random_rows, sub, strict=True)):
            if seq.generator is None:
                seq.generator = make_generator(seq, engine_seed, probs.device)
            # Exponential race: argmax p / E with E ~ Exp(1) draws from p, one generator per sequence.
            noise = torch.empty_like(probs[j]).exponential_(generator=seq.generator)
            tokens[i] = int((probs[j] / noise).argmax())
    results: list[SampleResult] = []
    for i, n in enumerate(want_logprobs):
        lp: dict[int, float] | None = None
        if n is not None and raw_logprobs is not None:
            row = raw_logprobs[i]
            lp = {}
            if n > 0:
                vals, idx = row.topk(n)
                lp = dict(zip(idx.tolist(), vals.tolist(), strict=True))
            lp[tokens[i]] = float(row[tokens[i]])
        results.append(SampleResult(tokens[i], lp))
    return results
