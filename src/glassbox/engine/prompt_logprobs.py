"""Prompt logprobs (vLLM's ``SamplingParams.prompt_logprobs``; OpenAI's completions ``echo`` with ``logprobs``):
each prompt token's log-probability given the tokens before it, its rank, and the top N at its position.

Position p's logits predict token p + 1, so a prefill chunk over positions [start, start + n) yields the
entries of tokens start + 1 .. start + n, up to the last prompt token (the last position's logits sample the
first output token instead). Only the rows of sequences that still owe entries are taken
(``Sequence.needs_prompt_logprobs``), and of those only positions whose token has no entry yet (a
recomputation after a preemption repeats none); every other prompt row of the batch gets no logits. Such a
sequence takes no prefix-cache hit (engine/block_manager.py), so every position it needs is computed, in
whichever chunks chunked prefill makes.

The values are the model's own distribution (log_softmax of the raw logits, float32): no penalties,
logit_bias, temperature or grammar mask, as vLLM's prompt logprobs. The logits are formed SLICE rows at a
time, so that a long prompt chunk never holds a (chunk, vocab) tensor at once.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import torch

from glassbox.engine.scheduler import ScheduledSeq
from glassbox.engine.sequence import Sequence
from glassbox.layers.host import parts_to_device

SLICE = 256  # rows per logits tensor: 256 x 49152 float32 = 48 MiB for SmolLM2's vocabulary


@dataclass
class PromptRows:
    """The rows of a flat step batch whose prompt logprobs are owed, and what each run of them fills."""

    rows: torch.Tensor  # (R,) on the device: rows of the step's hidden states
    targets: torch.Tensor  # (R,) on the device: the prompt token each row's logits score
    parts: list[tuple[Sequence, int, int]]  # (sequence, its first token index filled, count), in row order

    @classmethod
    def build(cls, ordered: list[ScheduledSeq], device: torch.device) -> PromptRows | None:
        rows: list[int] = []
        targets: list[int] = []
        parts: list[tuple[Sequence, int, int]] = []
        row = 0
        for s in ordered:
            seq = s.seq
            if seq.needs_prompt_logprobs:
                assert seq.prompt_logprobs is not None
                lo = max(s.start, len(seq.prompt_logprobs) - 1)  # position p fills token p + 1's entry
                hi = min(s.start + s.num_new_tokens, len(seq.prompt_token_ids) - 1)
                if hi > lo:
                    rows.extend(range(row + lo - s.start, row + hi - s.start))
                    targets.extend(seq.prompt_token_ids[lo + 1 : hi + 1])
                    parts.append((seq, lo + 1, hi - lo))
            row += s.num_new_tokens
        if not rows:
            return None
        rows_t, targets_t = parts_to_device([rows, targets], torch.long, device)  # one copy
        return cls(rows_t, targets_t, parts)

    def compute(
        self, compute_logits: Callable[[torch.Tensor], torch.Tensor], hidden: torch.Tensor
    ) -> PromptLogprobs:
        """Queue the rows' logprobs on the device (nothing waits for it)."""
        k = max(s.sampling_params.prompt_logprobs or 0 for s, _, _ in self.parts)
        chosen, ranks, vals, ids = [], [], [], []
        for lo in range(0, self.rows.shape[0], SLICE):
            logprobs = compute_logits(hidden.index_select(0, self.rows[lo : lo + SLICE])).log_softmax(dim=-1)
            mine = logprobs.gather(1, self.targets[lo : lo + SLICE, None])
            chosen.append(mine[:, 0])
            ranks.append((logprobs >= mine).sum(dim=-1))  # vLLM's rank: 1 + the tokens more likely
            if k:
                v, i = logprobs.topk(k, dim=-1)
                vals.append(v)
                ids.append(i)
        return PromptLogprobs(
            self.parts,
            self.targets,
            torch.cat(chosen),
            torch.cat(ranks),
            torch.cat(vals) if k else None,
            torch.cat(ids) if k else None,
        )


@dataclass
class PromptLogprobs:
    """One step's prompt logprobs, still on the device until :meth:`write` reads them."""

    parts: list[tuple[Sequence, int, int]]
    targets: torch.Tensor
    chosen: torch.Tensor  # (R,) the prompt token's logprob
    ranks: torch.Tensor  # (R,)
    top_vals: torch.Tensor | None  # (R, k)
    top_ids: torch.Tensor | None

    def write(self) -> None:
        """Append each sequence's new entries (waits for the device)."""
        targets, chosen, ranks = self.targets.tolist(), self.chosen.tolist(), self.ranks.tolist()
        vals = self.top_vals.tolist() if self.top_vals is not None else None
        ids = self.top_ids.tolist() if self.top_ids is not None else None
        r = 0
        for seq, first, count in self.parts:
            entries, seq_ranks = seq.prompt_logprobs, seq.prompt_ranks
            assert entries is not None and seq_ranks is not None and len(entries) == first
            n = seq.sampling_params.prompt_logprobs or 0
            for j in range(r, r + count):
                entry = dict(zip(ids[j][:n], vals[j][:n], strict=True)) if n and ids and vals else {}
                entry[targets[j]] = chosen[j]
                entries.append(entry)
                seq_ranks.append(ranks[j])
            r += count
