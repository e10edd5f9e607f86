"""A GGUF checkpoint read as one tensor-parallel rank's shards (models/tensor_parallel.py's split): each
tensor's rows, or whole blocks of its columns, sliced from the memory-mapped file before anything is
dequantized or repacked, so that a rank reads and holds 1/N of every split tensor.

- rows (q/k/v by head, gate/up, the embedding and LM head by vocabulary, the last shard zero-padded: zero
  bytes are a zero block in every GGML type): the file's rows. llama.cpp stores llama/mistral's Q and K
  with each head's rotary rows permuted (models/gguf_reader.py); a shard holds whole heads, so it is
  un-permuted on its own, as the whole tensor is.
- columns (o and down, along K): bytes [a / B * S, b / B * S) of each row, for a type of B values in S bytes;
  ``check_gguf_tp`` refuses a split that would cut a block (32 values: Q4_0, Q4_1, Q8_0, Q5_0, ...; 256: the
  K-quants' super-blocks), so that a shard's blocks are the file's own.
The packed types (Q4_0, Q4_1, Q8_0; the K-quants Q4_K, Q5_K, Q6_K) stay in their blocks
(quant/blocks/weights.py, quant/blocks/kquant.py) unless ``keep_blocks`` is off; the rest (F32, F16, BF16, other
quants) are dequantized to float32, shard by shard. A MoE layer's stacked experts (E, rows, K) are cut per
expert the same way (gate/up by rows, down by whole blocks of columns) and held per expert in the kept
types, as without TP on the CPU (quant/blocks/gguf_experts.py).
"""

from __future__ import annotations

from collections.abc import Iterator

import numpy as np
import torch
from gguf import GGML_QUANT_SIZES, ReaderTensor
from gguf.quants import dequantize

from glassbox.models.fused_parts import fused_rows
from glassbox.models.gguf_reader import GGUFCheckpoint, hf_shape, unpermute_rotary_rows
from glassbox.models.model_config import ModelConfig
from glassbox.models.tensor_parallel import shard_plan
from glassbox.quant.blocks.gguf_experts import gguf_matrix, held_gguf_experts
from glassbox.quant.formats import kept_ggml_types
from glassbox.quant.held_experts import ExpertMatrix
from glassbox.quant.kept import Kept

Tensors = Iterator[tuple[str, torch.Tensor]]  # (HF name, tensor), one at a time


def check_gguf_tp(gguf: GGUFCheckpoint, cfg: ModelConfig, world: int) -> None:
    """ValueError naming what a GGUF file's split over ``world`` ranks cannot run: a column-split tensor
    (o_proj, down_proj, the experts' down_proj) whose shard would cut its type's blocks; stacked experts
    with no split (Gemma 4's fused gate/up)."""
    for name, t in gguf.entries():
        shape = hf_shape(t)
        how, a, b, _ = shard_plan(name, list(shape), cfg, 0, world)
        if len(shape) == 3 and how == "whole":  # stacked experts every rank would hold whole: not split
            raise ValueError(
                f"--tensor-parallel-size {world}: {name} (stacked experts of this layout) is not split yet"
            )
        values = GGML_QUANT_SIZES[t.tensor_type][0]
        if how in ("cols", "cols3") and (b - a) % values:
            kind = "super-blocks" if t.tensor_type.name.endswith("_K") else "blocks"
            raise ValueError(
                f"--tensor-parallel-size {world}: {name} ({t.tensor_type.name}) would give each rank {b - a} "
                f"of its {shape[-1]} input columns, not whole {values}-value {kind}"
            )


def _row_bytes(t: ReaderTensor) -> np.ndarray:
    """A tensor's bytes as (rows, row bytes), rows in the file's order (1-D: one value a row)."""
    data = np.asarray(t.data)
    return data.reshape(int(hf_shape(t)[0]), -1).view(np.uint8)


def read_shard(
    gguf: GGUFCheckpoint,
    name: str,
    t: ReaderTensor,
    cfg: ModelConfig,
    rank: int,
    world: int,
    window: tuple[int, int] | None = None,
) -> tuple[np.ndarray, tuple[int, ...]]:
    """Rank ``rank``'s bytes of tensor ``t`` (HF name ``name``) as (rows, row bytes), rows in the Hugging
    Face order, and the shard's HF shape; ``window``: of the rows [start, end) of a fused tensor that
    hold the parameter ``name`` (models/fused_parts.py)."""
    shape = hf_shape(t)
    if window is not None:
        raw = _row_bytes(t)[window[0] : window[1]]
        a, b, _ = shard_plan(name, [window[1] - window[0], *shape[1:]], cfg, rank, world)[1:]
        return np.ascontiguousarray(raw[a:b]), (b - a, *shape[1:])
    how, a, b, rows = shard_plan(name, list(shape), cfg, rank, world)
    if how in ("rows3", "cols3"):  # a layer's stacked experts (E, rows, row bytes): each expert's cut
        experts = np.asarray(t.data).view(np.uint8).reshape(shape[0], shape[1], -1)
        if how == "rows3":
            return np.ascontiguousarray(experts[:, a:b]), (shape[0], b - a, shape[2])
        values, size = GGML_QUANT_SIZES[t.tensor_type]
        return np.ascontiguousarray(experts[:, :, a // values * size : b // values * size]), (
            *shape[:2],
            b - a,
        )
    raw, heads = _row_bytes(t), gguf.permuted_heads(t.name)
    if how == "cols":
        values, size = GGML_QUANT_SIZES[t.tensor_type]
        return np.ascontiguousarray(raw[:, a // values * size : b // values * size]), (shape[0], b - a)
    if how == "zeros":  # gpt-oss's experts' down bias off rank 0
        return np.zeros_like(raw), shape
    if how == "whole":
        part = raw if heads is None else unpermute_rotary_rows(raw, heads)
        return np.ascontiguousarray(part), shape
    assert how == "rows", f"{name}: a {how} split of a GGUF tensor"
    part = raw[a:b]
    if heads is not None:  # whole heads of the file's (permuted) rows
        part = unpermute_rotary_rows(part, (b - a) * heads // shape[0])
    if part.shape[0] < rows:  # the last vocabulary shard: zero rows up to P
        part = np.concatenate([part, np.zeros((rows - part.shape[0], part.shape[1]), np.uint8)])
    return np.ascontiguousarray(part), (rows, *shape[1:])


def _parts(gguf: GGUFCheckpoint) -> Iterator[tuple[str, ReaderTensor, tuple[int, int] | None]]:
    """``gguf.entries()`` with each fused tensor as its parameters: (name, tensor, its rows or None)."""
    for name, t in gguf.entries():
        parts = fused_rows(name, gguf.config)
        if parts is None:
            yield name, t, None
        for part, start, end in parts or []:
            yield part, t, (start, end)


def sharded_gguf(
    gguf: GGUFCheckpoint, cfg: ModelConfig, rank: int, world: int, keep_blocks: bool
) -> tuple[Tensors, dict[str, Kept]]:
    """(this rank's float shards, one at a time; its packed 2-D shards by HF name), as
    engine/checkpoint.py's ``Checkpoint.weights`` gives a whole file's."""
    kept: dict[str, Kept] = {}
    taken: set[str] = set()
    if keep_blocks:
        stacked: dict[str, dict[str, list[ExpertMatrix]]] = {}  # MoE module -> projection -> experts
        for name, t, window in _parts(gguf):
            kind = t.tensor_type.name
            # the types every device's kernels run (a rank does not know its device here)
            if kind in kept_ggml_types("blocks", triton=True) and len(t.shape) == 2:
                raw, shape = read_shard(gguf, name, t, cfg, rank, world, window)
                kept[name] = gguf_matrix(kind, raw, shape)
                taken.add(name)
            elif kind in kept_ggml_types(triton=True) and len(t.shape) == 3:
                raw, shape = read_shard(gguf, name, t, cfg, rank, world)
                module, _, proj = name.removesuffix(".weight").rpartition(".")
                stacked.setdefault(module, {})[proj] = [
                    gguf_matrix(kind, raw[e], shape[1:]) for e in range(shape[0])
                ]
        held, names = held_gguf_experts(stacked)
        kept.update(held)
        taken |= names

    def floats() -> Tensors:
        for name, t, window in _parts(gguf):
            if name not in taken:
                raw, shape = read_shard(gguf, name, t, cfg, rank, world, window)
                values = np.array(dequantize(raw, t.tensor_type), dtype=np.float32)  # a copy
                yield name, torch.from_numpy(gguf.as_hf(name, values.reshape(shape)))

    return floats(), kept
