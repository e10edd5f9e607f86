"""A quantized safetensors checkpoint (GPTQ/AWQ, compressed-tensors integer, FP8) read as one tensor-parallel
rank's shards (models/tensor_parallel.py's split): each quantized layer read alone, decoded to its codes
(gptq_awq.GroupCodes) or FP8 weights, cut by ``shard_plan`` (output rows: q/k/v by head, gate/up; input
columns: o and down) and repacked, so that a rank holds one whole layer at a time and keeps 1/N of each.
A cut along the input columns must leave whole 32-value blocks within one group (integer formats; an
act-order layer's groups are scattered over its columns, so its cut rarely does) or whole scale blocks
(FP8 block layouts): ValueError naming the layer otherwise. A MoE's routed experts, a layer per expert
projection, are cut the same way and held per MoE module (quant/expert_parts.py). The other tensors come
from ``sharded_safetensors``.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from contextlib import ExitStack
from dataclasses import replace
from pathlib import Path
from typing import Any

import torch
from safetensors import safe_open

from glassbox.models.model_config import ModelConfig
from glassbox.models.safetensors_files import weight_files
from glassbox.models.tensor_parallel import shard_plan, sharded_safetensors
from glassbox.quant.blocks import ct_int, gptq_awq
from glassbox.quant.blocks.ct_int_config import ct_int_spec
from glassbox.quant.blocks.weights import BlockWeights
from glassbox.quant.config import group_quant, quant_method
from glassbox.quant.expert_parts import sort_experts
from glassbox.quant.fp8 import checkpoint as fp8_checkpoint
from glassbox.quant.fp8.config import ACTIVATION_PARTS, fp8_spec
from glassbox.quant.fp8.weights import Fp8Weights
from glassbox.quant.kept import Kept

Tensors = Iterator[tuple[str, torch.Tensor]]
Parts = dict[str, torch.Tensor]
Take = Callable[[str, str], str | None]  # (part name, safetensors dtype) -> the part's role, or None


def _layers(model_dir: Path, take: Take) -> tuple[Iterator[tuple[str, Parts]], set[str]]:
    """(each quantized layer's parts by role, read layer by layer; every tensor name taken, with the
    activation scales dropped)."""
    where: dict[str, dict[str, tuple[Path, str]]] = {}
    taken: set[str] = set()
    for path in weight_files(model_dir):
        with safe_open(str(path), framework="pt") as f:
            for key in f.keys():  # noqa: SIM118 (safe_open is not a dict)
                prefix, _, part = key.rpartition(".")
                role = take(part, f.get_slice(key).get_dtype())
                if role is not None:
                    where.setdefault(prefix, {})[role] = (path, key)
                    taken.add(key)
                elif part in ACTIVATION_PARTS or part in ct_int.ACTIVATION_PARTS:
                    taken.add(key)

    def layers() -> Iterator[tuple[str, Parts]]:
        with ExitStack() as stack:
            files: dict[Path, Any] = {}
            for prefix, roles in where.items():
                parts: Parts = {}
                for role, (path, key) in roles.items():
                    if path not in files:
                        files[path] = stack.enter_context(safe_open(str(path), framework="pt"))
                    parts[role] = files[path].get_tensor(key)
                yield prefix, parts

    return layers(), taken


def _cut(n: int, block: int, a: int, b: int, what: str) -> tuple[int, int, int]:
    """(first block, end block, the shard's block size) of a cut a..b of ``n`` values in ``block``s; one
    block over all of them becomes one over the shard."""
    if block >= n:
        return 0, 1, b - a
    if a % block or ((b - a) % block and b != n):
        raise ValueError(f"its {what} {a}..{b} cut its {block}-value scale blocks")
    return a // block, -(-b // block), block


def fp8_shard(w: Fp8Weights, how: str, a: int, b: int) -> Fp8Weights:
    """Rows a..b (``how`` "rows") or input columns a..b ("cols") of FP8 weights, with their scales."""
    n, k = w.codes.shape
    if how == "rows":
        r0, r1, rows = _cut(n, w.block_rows, a, b, "rows")
        return replace(
            w, codes=w.codes[a:b].contiguous(), scales=w.scales[r0:r1].contiguous(), block_rows=rows
        )
    c0, c1, cols = _cut(k, w.block_cols, a, b, "columns")
    return replace(
        w, codes=w.codes[:, a:b].contiguous(), scales=w.scales[:, c0:c1].contiguous(), block_cols=cols
    )


def sharded_quantized(
    model_dir: Path, qc: dict[str, Any], cfg: ModelConfig, rank: int, world: int
) -> tuple[Tensors, dict[str, Kept]]:
    """(this rank's float shards, one at a time; its quantized layers' shards by HF weight name) of a
    GPTQ/AWQ, compressed-tensors integer or FP8 checkpoint; ValueError for other formats and for a cut a
    layer's blocks cannot take (the layer and the flag named)."""
    gq, ct, f8 = group_quant(qc), ct_int_spec(qc), fp8_spec(qc)
    take: Take
    decode: Callable[[Parts, str], gptq_awq.GroupCodes | Fp8Weights]
    if gq is not None:
        spec_g = gq
        take = lambda part, dtype: part if part in gptq_awq.PARTS else None  # noqa: E731
        decode = lambda parts, name: gptq_awq.layer_codes(spec_g, parts, name)  # noqa: E731
    elif ct is not None:
        spec_c = ct
        take = lambda part, dtype: (  # noqa: E731
            part if part in ct_int.PARTS or (part == "weight" and dtype == "I8") else None
        )
        decode = lambda parts, name: ct_int.layer_codes(spec_c, parts, name)  # noqa: E731
    elif f8 is not None:
        spec_f = f8

        def take(part: str, dtype: str) -> str | None:
            if part == "weight" and dtype == fp8_checkpoint.E4M3:
                return "weight"
            return "scale" if part == spec_f.scale_part else None

        def decode(parts: Parts, name: str) -> Fp8Weights:
            if set(parts) != {"weight", "scale"}:
                raise ValueError(f"{name}: an FP8 layer needs its weight and {spec_f.scale_part}")
            return fp8_checkpoint.layer_weights(parts["weight"], parts["scale"], spec_f, name)
    else:
        raise ValueError(f"--tensor-parallel-size {world}: quantization_config {quant_method(qc)!r} "
                         "checkpoints are not split across ranks (GPTQ/AWQ, compressed-tensors integer and "
                         "FP8 are)")  # fmt: skip
    layers, taken = _layers(model_dir, take)
    shards: dict[str, BlockWeights | Fp8Weights] = {}  # by module name
    for prefix, parts in layers:
        name = f"{prefix}.weight"
        w = decode(parts, prefix)
        n, k = (w.q.shape[1], w.q.shape[0]) if isinstance(w, gptq_awq.GroupCodes) else w.codes.shape
        how, a, b, rows = shard_plan(name, [int(n), int(k)], cfg, rank, world)
        try:
            if how == "rows" and rows != b - a or how not in ("rows", "cols", "whole"):
                raise ValueError(f"a {how} split of a quantized layer is not built")
            if isinstance(w, gptq_awq.GroupCodes):
                c = w if how == "whole" else w.rows(a, b) if how == "rows" else w.cols(a, b)
                shards[prefix] = gptq_awq.to_blocks(c.q, c.z, c.scales, c.groups, c.bits, c.label)
            else:
                shards[prefix] = w if how == "whole" else fp8_shard(w, how, a, b)
        except ValueError as e:
            raise ValueError(f"--tensor-parallel-size {world}: {prefix}: {e}") from None
    # routed experts (each expert's projections cut as a dense MLP's: gate/up rows, down columns) held per
    # MoE module, as without TP on the CPU
    dense, held, _ = sort_experts(shards, True, "quantized")
    return sharded_safetensors(model_dir, cfg, rank, world, skip=taken), {**dense, **held}
