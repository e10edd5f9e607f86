"""A 4-bit float checkpoint (quant/fp4/checkpoint.py) read as one tensor-parallel rank's shards
(models/tensor_parallel.py's split), each part sliced from the file with safetensors' ``get_slice``, so a
rank reads only its bytes.

- ModelOpt NVFP4 linears: ``weight`` (N, K/2) and ``weight_scale`` (N, K/16) cut by output rows (q/k/v by
  head, gate/up) or by input columns (o, down: bytes [a/2, b/2), scales [a/16, b/16): the cut must leave
  whole 16-value blocks); ``weight_scale_2`` (the per-tensor scale) whole, so every rank's values are the
  file's.
- gpt-oss's MXFP4 experts: gate_up ``*_blocks`` (E, 2I, H/32, 16) by rows, 2I/N of them a rank (gate and
  up are interleaved: one run of rows holds this rank's I/N pairs, as ``shard_plan`` cuts the float
  layout); down (E, H, I/32, 16) by whole 32-value blocks of I; their biases and every float tensor come
  from ``sharded_safetensors``.
A cut that breaks a block stops the load naming the layer.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import ExitStack
from pathlib import Path
from typing import Any

import torch

from glassbox.models.model_config import ModelConfig
from glassbox.models.safetensors_files import weight_files
from glassbox.models.tensor_parallel import shard_plan, sharded_safetensors
from glassbox.quant.expert_parts import is_expert
from glassbox.quant.fp4.checkpoint import (
    EXPERT_PARTS,
    PARTS,
    NVFP4Spec,
    SafetensorsFiles,
    layer_weights,
    nvfp4_spec,
)
from glassbox.quant.fp4.weights import mxfp4_experts
from glassbox.quant.held_experts import HeldExperts
from glassbox.quant.kept import Kept

Tensors = Iterator[tuple[str, torch.Tensor]]


def _whole_blocks(a: int, b: int, block: int, what: str) -> None:
    if a % block or (b - a) % block:
        raise ValueError(f"its {what} {a}..{b} cut its {block}-value blocks")


def _nvfp4_layer(
    f: SafetensorsFiles, spec: NVFP4Spec, prefix: str, cfg: ModelConfig, rank: int, world: int
) -> Kept:
    weight, scale, scale_2 = f.need(prefix, PARTS[:3], "an NVFP4 layer")
    w, s = f.slice(weight), f.slice(scale)
    n, half = w.get_shape()
    how, a, b, rows = shard_plan(weight, [n, 2 * half], cfg, rank, world)
    if how == "rows" and rows == b - a:
        parts = {"weight": w[a:b], "weight_scale": s[a:b]}
    elif how == "cols":
        _whole_blocks(a, b, 16, "input columns")
        parts = {"weight": w[:, a // 2 : b // 2], "weight_scale": s[:, a // 16 : b // 16]}
    elif how == "whole":
        parts = {"weight": w[:], "weight_scale": s[:]}
    else:
        raise ValueError(f"a {how} split of an NVFP4 layer is not built")
    return layer_weights(spec, parts | {"weight_scale_2": f.tensor(scale_2)}, prefix)


def _mxfp4_experts(f: SafetensorsFiles, prefix: str, rank: int, world: int) -> HeldExperts:
    gb, gs, db, ds = (f.slice(n) for n in f.need(prefix, EXPERT_PARTS, "MXFP4 experts"))
    per = gb.get_shape()[1] // world  # 2I / N rows: I / N (gate, up) pairs
    a = rank * per
    gate_up = mxfp4_experts(gb[:, a : a + per], gs[:, a : a + per])
    width = ds.get_shape()[2] * 32  # I
    c0, c1 = rank * width // world, (rank + 1) * width // world
    _whole_blocks(c0, c1, 32, "down_proj input columns")
    down = mxfp4_experts(db[:, :, c0 // 32 : c1 // 32], ds[:, :, c0 // 32 : c1 // 32])
    return HeldExperts([(w,) for w in gate_up], down)


def sharded_fp4(
    model_dir: Path, qc: dict[str, Any], cfg: ModelConfig, rank: int, world: int
) -> tuple[Tensors, dict[str, Kept]]:
    """(this rank's float shards, one at a time; its NVFP4 linears by HF weight name or MXFP4 experts by
    MoE module name); ValueError naming the layer where a cut breaks a block."""
    nvfp4 = nvfp4_spec(qc)
    kept: dict[str, Kept] = {}
    taken: set[str] = set()
    ends, parts = (".weight_scale", PARTS) if nvfp4 is not None else (".down_proj_blocks", EXPERT_PARTS)
    with ExitStack() as stack:
        f = SafetensorsFiles(stack, weight_files(model_dir))
        for prefix in sorted(k.removesuffix(ends) for k in f.where if k.endswith(ends)):
            try:
                if nvfp4 is not None and is_expert(prefix):
                    raise ValueError("NVFP4 routed experts are not read under tensor parallelism yet")
                if nvfp4 is not None:
                    kept[f"{prefix}.weight"] = _nvfp4_layer(f, nvfp4, prefix, cfg, rank, world)
                else:
                    kept[prefix] = _mxfp4_experts(f, prefix, rank, world)
            except ValueError as e:
                raise ValueError(f"--tensor-parallel-size {world}: {prefix}: {e}") from None
            taken.update(n for n in (f"{prefix}.{part}" for part in parts) if n in f.where)
    return sharded_safetensors(model_dir, cfg, rank, world, skip=taken), kept
