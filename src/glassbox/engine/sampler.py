"""Sampler: penalties, temperature, top-k/top-p/min-p, per-request seeded draws, logprobs.

On CUDA nothing here waits for the device: host values travel through pinned non-blocking copies (a
plain ``torch.tensor(..., device="cuda")`` synchronizes the stream) until the caller reads the draws.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from glassbox.engine.sequence import Sequence
from glassbox.layers.host import to_device
from glassbox.outputs import SampleResult

__all__ = ["SampledBatch", "make_generator", "sample_on_device", "to_device"]


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


def _filter(logits: torch.Tensor, seqs: list[Sequence]) -> torch.Tensor:
    """Temperature, top-k, top-p and min-p over (S, V) float32 logits; returns probabilities."""
    dev = logits.device
    temps = to_device([max(s.sampling_params.temperature, 1e-5) for s in seqs], torch.float32, dev)
    logits = logits / temps[:, None]
    top_ks = [s.sampling_params.top_k for s in seqs]
    top_ps = [s.sampling_params.top_p for s in seqs]
    vocab = logits.shape[1]
    if any(0 < k < vocab for k in top_ks) or any(p < 1.0 for p in top_ps):
        sorted_logits, order = logits.sort(dim=-1, descending=True)
        ks = to_device([k if 0 < k < vocab else vocab for k in top_ks], torch.long, dev)
        ranks = torch.arange(vocab, device=dev)[None, :]
        drop = ranks >= ks[:, None]
        probs_sorted = sorted_logits.masked_fill(drop, float("-inf")).softmax(dim=-1)
        cum = probs_sorted.cumsum(dim=-1)
        ps = to_device(top_ps, torch.float32, dev)[:, None]
        drop |= (cum - probs_sorted) >= ps  # keep the smallest prefix whose mass reaches top_p
        drop[:, 0] = False
        sorted_logits = sorted_logits.masked_fill(drop, float("-inf"))
        logits = torch.empty_like(logits).scatter_(1, order, sorted_logits)
    probs = logits.softmax(dim=-1)
    min_ps = [s.sampling_params.min_p for s in seqs]
    if any(m > 0 for m in min_ps):
        mp = to_device(min_ps, torch.float32, dev)[:, None]
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
                if n > 0 and vals is not None and ids is not None:
                    lp = dict(zip(ids[j][:n], vals[j][:n], strict=True))
                lp[tokens[i]] = chosen[j]
                lps[i] = lp
        return [SampleResult(t, lp) for t, lp in zip(tokens, lps, strict=True)]


def sample_on_device(
    logits: torch.Tensor, seqs: list[Sequence], eos_ids: set[int], engine_seed: int
) -> SampledBatch:
    """Draw one token per row of ``logits`` (S, V) float32 without waiting for the device.

    ``logits`` is the caller's fresh tensor and is adjusted in place (penalties, min_tokens); logprobs are
    taken from it before any adjustment. Every row's draw uses its sequence's own generator, so a
    request's tokens do not depend on what else shares its batch."""
    dev = logits.device
    want_logprobs = [s.sampling_params.logprobs for s in seqs]
    lp_rows = [i for i, n in enumerate(want_logprobs) if n is not None]
    lp_idx = to_device(lp_rows, torch.long, dev) if 0 < len(lp_rows) < len(seqs) else None
    raw_logprobs = None
    if lp_rows:
        raw_logprobs = (logits if lp_idx is None else logits.index_select(0, lp_idx)).log_softmax(dim=-1)
    if any(
        s.sampling_params.repetition_penalty != 1.0
        or s.sampling_params.presence_penalty != 0.0
        or s.sampling_params.frequency_penalty != 0.0
        for s in seqs
    ):
        _apply_penalties(logits, seqs, logits.shape[1])
    if any(s.num_output_tokens < s.sampling_params.min_tokens for s in seqs):
        _suppress_stops(logits, seqs, eos_ids)
    random_rows = [i for i, s in enumerate(seqs) if not s.sampling_params.greedy]
    tokens = logits.argmax(dim=-1)  # the greedy rows' picks (the others are overwritten below)
    if random_rows:
        sub = [seqs[i] for i in random_rows]
        idx = to_device(random_rows, torch.long, dev) if len(random_rows) < len(seqs) else None
        probs = _filter(logits.index_select(0, idx) if idx is not None else logits, sub)
        noise = torch.empty_like(probs)
        for j, seq in enumerate(sub):
            if seq.generator is None:
                seq.generator = make_generator(seq, engine_seed, dev)
            noise[j].exponential_(generator=seq.generator)
        # Exponential race: argmax p / E with E ~ Exp(1) draws from p, one generator per sequence.
        drawn = (probs / noise).argmax(dim=-1)
        tokens = drawn if idx is None else tokens.index_copy(0, idx, drawn)
    out = SampledBatch(tokens, want_logprobs, lp_rows)
    if raw_logprobs is not None:
        k = max(want_logprobs[i] or 0 for i in lp_rows)
        chosen = tokens if lp_idx is None else tokens.index_select(0, lp_idx)
        out.chosen = raw_logprobs.gather(1, chosen[:, None])[:, 0]
        if k > 0:
            out.top_vals, out.top_ids = raw_logprobs.topk(k, dim=-1)
    return out
