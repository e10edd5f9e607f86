"""Which rows of a step's hidden states are sampled, and how: a plain row (its sequence's last) goes to the
sampler, a speculative sequence's 1 + k rows to verification (engine/spec_decode.py); the prompt rows of a
sequence that asked for prompt logprobs get theirs (engine/prompt_logprobs.py)."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import torch

from glassbox.engine.prompt_logprobs import PromptLogprobs, PromptRows
from glassbox.engine.sampler import SampledBatch, sample_on_device, to_device
from glassbox.engine.scheduler import ScheduledSeq
from glassbox.engine.spec_decode import SpecDraws, verify_on_device
from glassbox.outputs import SampleResult


@dataclass
class DevicePendingStep:
    """A launched step: its draws are still on the device until :meth:`result` reads them."""

    seq_ids: list[int]
    sampled: SampledBatch | None
    spec: SpecDraws | None = None
    prompt: PromptLogprobs | None = None

    def result(self) -> dict[int, SampleResult]:
        """{seq_id: SampleResult} of the rows that sample; waits for the device. Prompt logprobs are
        appended to their sequences here, before the step's tokens."""
        if self.prompt is not None:
            self.prompt.write()
        out = {} if self.sampled is None else dict(zip(self.seq_ids, self.sampled.results(), strict=True))
        if self.spec is not None:
            out.update(self.spec.results())
        return out


@dataclass
class SamplePlan:
    """The rows of a flat step batch (``ordered``) whose logits are needed: the plain rows, then every row
    of each speculative sequence."""

    rows: torch.Tensor | None  # on the device; None when nothing samples
    plain: list[ScheduledSeq]
    spec: list[ScheduledSeq]
    prompt: PromptRows | None = None  # prompt rows owing prompt logprobs

    @classmethod
    def build(cls, ordered: list[ScheduledSeq], device: torch.device) -> SamplePlan:
        plain_rows: list[int] = []
        spec_rows: list[int] = []
        plain: list[ScheduledSeq] = []
        spec: list[ScheduledSeq] = []
        row = 0
        for s in ordered:
            row += s.num_new_tokens
            if not s.samples:
                continue
            if s.draft_tokens:
                spec_rows.extend(range(row - s.num_new_tokens, row))
                spec.append(s)
            else:
                plain_rows.append(row - 1)
                plain.append(s)
        rows = plain_rows + spec_rows
        prompt = PromptRows.build(ordered, device)
        return cls(to_device(rows, torch.long, device) if rows else None, plain, spec, prompt)

    def sample(
        self,
        compute_logits: Callable[[torch.Tensor], torch.Tensor],
        hidden: torch.Tensor,
        eos_ids: set[int],
        generator: torch.Generator,
    ) -> DevicePendingStep:
        """Queue the logits and the draws (nothing waits for the device)."""
        prompt = None if self.prompt is None else self.prompt.compute(compute_logits, hidden)
        if self.rows is None:
            return DevicePendingStep([], None, None, prompt)
        every = not self.spec and len(self.plain) == hidden.shape[0]  # one row per sequence, all sampled
        logits = compute_logits(hidden if every else hidden.index_select(0, self.rows))
        n = len(self.plain)
        sampled = None
        if n:
            seqs = [s.seq for s in self.plain]
            sampled = sample_on_device(logits if not self.spec else logits[:n], seqs, eos_ids, generator)
        spec = None
        if self.spec:
            specs = [(s.seq, s.draft_tokens) for s in self.spec]
            spec = verify_on_device(logits[n:], specs, eos_ids, generator)
        return DevicePendingStep([s.seq.seq_id for s in self.plain], sampled, spec, prompt)
