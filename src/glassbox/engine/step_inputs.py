"""A step's inputs on the device: the flat token ids, positions and cache slots of its rows, and the
attention metadata (decode rows' block tables and context lengths; prompt chunks' tables, or the Triton
kernels' paged-prefill plan). Built once per step by engine/torch_executor.py's ``launch``."""

from __future__ import annotations

from collections.abc import Callable

import torch

from glassbox.engine.sampler import to_device
from glassbox.engine.scheduler import ScheduledSeq
from glassbox.layers.attention import AttentionMetadata, PrefillSeq, build_paged_prefill
from glassbox.layers.host import parts_to_device


def decode_rows(s: ScheduledSeq) -> bool:
    """Whether a scheduled sequence runs as decode rows: one token on its cache, or a token and its drafts."""
    return bool(s.draft_tokens) or (s.num_new_tokens == 1 and s.start > 0)


def flatten(
    ordered: list[ScheduledSeq], bs: int, device: torch.device
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """The rows' token ids, positions and cache slots (``bs`` tokens a block), in one copy to the device."""
    ids: list[int] = []
    pos: list[int] = []
    slots: list[int] = []
    for s in ordered:
        end = s.start + s.num_new_tokens
        ids.extend(s.tokens())
        r = range(s.start, end)
        pos.extend(r)
        table = s.seq.block_table
        slots.extend(table[p // bs] * bs + p % bs for p in r)
    flat = to_device(ids + pos + slots, torch.long, device)  # one copy (pinned on CUDA), not three
    n = len(ids)
    return flat[:n], flat[n : 2 * n], flat[2 * n :]


def metadata(
    decodes: list[ScheduledSeq],
    prefills: list[ScheduledSeq],
    slots: torch.Tensor,
    bs: int,
    dev: torch.device,
    backend: str,
    block_m: Callable[[], int],  # the Triton prefill kernel's query tile (kernels/attention_tiles.py)
) -> AttentionMetadata:
    """The attention metadata of decode rows ``decodes`` then prompt chunks ``prefills``."""
    lens = [p + 1 for s in decodes for p in range(s.start, s.start + s.num_new_tokens)]
    meta = AttentionMetadata(slot_mapping=slots, num_decode=len(lens), backend=backend)
    if decodes:
        max_blocks = (max(lens) + bs - 1) // bs
        tables: list[int] = []
        for s in decodes:
            t = s.seq.block_table[:max_blocks]
            tables += (t + [0] * (max_blocks - len(t))) * s.num_new_tokens  # a row per token
        flat, ctx = parts_to_device([tables, lens], torch.long, dev)  # one copy, not two
        meta.decode_block_tables = flat.view(len(lens), max_blocks)
        meta.decode_context_lens = ctx
    if backend == "triton":
        if prefills:
            seqs = []
            for s in prefills:
                end = s.start + s.num_new_tokens
                seqs.append((s.start, s.num_new_tokens, s.seq.block_table[: (end + bs - 1) // bs]))
            meta.paged_prefill = build_paged_prefill(seqs, block_m(), dev)
        return meta
    row = len(lens)
    for s in prefills:
        end = s.start + s.num_new_tokens
        nblocks = (end + bs - 1) // bs
        table = to_device(s.seq.block_table[:nblocks], torch.long, dev)
        meta.prefills.append(PrefillSeq(row, s.num_new_tokens, s.start, table))
        row += s.num_new_tokens
    return meta
