"""Greedy decode bursts: several decode steps of a batch in one native call (kernels/cpu_step.c
``gb_decode_burst``), each the one-call decode step (models/llama_step.py), the LM head and an argmax.

A decode step of a thin model is short (the bundled demo model: ~0.5 ms on one core) beside the engine's own
host work around it (scheduling, inputs, sampling, appending, text: ~0.3 ms of Python per step). When every
row of a decode-only batch picks its tokens greedily with nothing that depends on the token just drawn
(no logprobs, penalties, logit_bias, grammar or pending min_tokens), the engine may ask for k more tokens
in the same step (``ScheduledSeq.lookahead``): the burst runs the same kernels in the same order as k + 1
steps would, so it picks the same tokens, and the host work is paid once.
"""

from __future__ import annotations

import ctypes

import torch

from glassbox.kernels import cpu_ops
from glassbox.models.llama import LlamaForCausalLM
from glassbox.models.llama_step import DecodeStep, StepLinear, block_linear, step_linear
from glassbox.quant.blocks.linear import BlockQuantEmbedding, BlockQuantLinear
from glassbox.quant.blocks.weights import BlockWeights
from glassbox.quant.dense.bf16_tiles import TiledBf16Linear


class _Embed(ctypes.Structure):
    _fields_ = [("table", ctypes.c_void_p), ("blocks", StepLinear)]


class DecodeBurst:
    """A bound model's greedy bursts: its decode step, LM head and embedding table, and the bounds its
    index checks need (the rotary table's positions, the cache's blocks)."""

    def __init__(
        self,
        step: DecodeStep,
        head: StepLinear,
        embed: _Embed,
        attn: cpu_ops.PagedAttention,
        keep: list[object],
    ) -> None:
        self.step, self.head, self.embed, self._keep = step, head, embed, keep
        self.max_positions, self.num_blocks = attn.max_positions, attn.num_blocks
        self.fn = cpu_ops.lib().gb_decode_burst

    def __call__(
        self, tokens: list[int], positions: list[int], block_tables: list[list[int]], steps: int
    ) -> list[list[int]]:
        """For each row (a sequence whose last token ``tokens[i]`` sits at ``positions[i]``, its K/V not yet
        computed, and whose ``block_tables[i]`` holds every position up to ``positions[i] + steps - 1``):
        its next ``steps`` greedy tokens."""
        t, m = len(tokens), self.step.model
        width = max(len(b) for b in block_tables)
        ids = torch.empty(steps + 1, t, dtype=torch.long)
        ids[0] = torch.tensor(tokens, dtype=torch.long)
        pos = torch.tensor(positions, dtype=torch.long)
        lens = pos + 1
        tables = torch.tensor([b + [0] * (width - len(b)) for b in block_tables], dtype=torch.long)
        last, last_lens = pos + (steps - 1), lens + (steps - 1)
        if any((p + steps - 1) // m.bs >= len(b) for p, b in zip(positions, block_tables, strict=True)):
            raise ValueError(f"a burst of {steps} steps reaches past a row's block table")
        # the step's index checks, on the burst's last positions (the slots are computed from the tables)
        cpu_ops.check_step(
            last, torch.zeros_like(last), self.max_positions, 1, tables, last_lens, self.num_blocks, m.bs
        )
        dt = self.step.dtype
        x = torch.empty(t, m.hidden, dtype=dt)
        h = torch.empty_like(x)
        logits = torch.empty(t, self.head.n, dtype=dt)
        scratch = torch.empty(t * self.step.scratch_row, dtype=dt)
        slots = torch.empty(t, dtype=torch.long)
        self.fn(
            ctypes.byref(m), self.step.layers, ctypes.byref(self.head), ctypes.byref(self.embed), ids.data_ptr(),
            t, steps, pos.data_ptr(), slots.data_ptr(), tables.data_ptr(), width, lens.data_ptr(), x.data_ptr(),
            h.data_ptr(), logits.data_ptr(), scratch.data_ptr(), torch.get_num_threads(),
        )  # fmt: skip
        return ids[1:].t().tolist()


def bind_burst(
    lm: LlamaForCausalLM, step: DecodeStep | None, attn: cpu_ops.PagedAttention
) -> DecodeBurst | None:
    """The model's greedy bursts over its bound decode step, or None where the LM head or the embedding
    table is of a kind the burst cannot run: it needs a bf16-tiles or block-weight head (what the step's
    linears are) and a table of plain rows in the model's dtype or of block weights, unscaled."""
    if step is None:
        return None
    hidden = step.model.hidden
    head = (
        step_linear(lm.lm_head, hidden)
        if isinstance(lm.lm_head, TiledBf16Linear | BlockQuantLinear)
        else None
    )
    emb = lm.model.embed_tokens
    if head is None:
        return None
    if isinstance(emb, torch.nn.Embedding) and emb.weight.dtype == step.dtype and emb.weight.is_contiguous():
        return DecodeBurst(
            step, head, _Embed(emb.weight.data_ptr(), StepLinear()), attn, [emb.weight, lm.lm_head]
        )
    if isinstance(emb, BlockQuantEmbedding) and emb.scale is None and isinstance(emb.w, BlockWeights):
        if emb.w.perm is None:
            return DecodeBurst(step, head, _Embed(None, block_linear(emb.w)), attn, [emb.w, lm.lm_head])
    return None
