"""What the TorchExecutor does differently on a tensor-parallel rank (glassbox/py's group):
what it refuses, the shard it loads, its KV heads, the block count all ranks agree on, and a worker's
step from rank 0's broadcast of the step's inputs."""

from __future__ import annotations

import dataclasses
import os
from collections.abc import Callable
from functools import partial
from typing import Any, Protocol

import torch

from glassbox.config import EngineConfig
from glassbox.distributed import TPState, broadcast_object, compute_backend, cpu_lists, gather_ints, load_max
from glassbox.engine.checkpoint import Checkpoint, Tensors
from glassbox.engine.kv_plan import KVCachePlan
from glassbox.layers.attention import AttentionMetadata
from glassbox.models.causal_lm import CausalLM
from glassbox.models.families import engine_family
from glassbox.models.gguf_shards import check_gguf_tp, sharded_gguf
from glassbox.models.loader import Forward
from glassbox.models.model_config import ModelConfig
from glassbox.models.multimodal import text_tensors, tower_names
from glassbox.models.tensor_parallel import apply_tp, check_tp, kv_heads_of, sharded_safetensors
from glassbox.quant.blocks.ct_int_config import ct_int_spec
from glassbox.quant.blocks.linear import block_kernel_rows
from glassbox.quant.config import group_quant, quant_method
from glassbox.quant.fp4.checkpoint import is_fp4
from glassbox.quant.fp4.shards import sharded_fp4
from glassbox.quant.fp8.config import fp8_spec
from glassbox.quant.kept import Kept
from glassbox.quant.shards import sharded_quantized


class StepRunner(Protocol):
    """What a worker's step needs of its TorchExecutor."""

    forward: Forward
    kv_caches: list[torch.Tensor]
    model: CausalLM


# (input ids, positions, attention metadata, the rows whose logits are computed, (block-kernel choice,
# whether the step has prompt rows): layers/block_linear.block_kernel_rows)
StepInputs = tuple[torch.Tensor, torch.Tensor, AttentionMetadata, torch.Tensor | None, tuple[bool, bool]]


def check_run(
    n: int,
    device: torch.device,
    config: EngineConfig,
    checkpoint: Checkpoint | None,
    cfg: ModelConfig,
) -> None:
    """ValueError naming what a tensor-parallel run over ``n`` ranks needs that is not built or not here."""
    local = int(os.environ.get("LOCAL_WORLD_SIZE", n // config.nnodes))  # this host's ranks (torchrun's)
    bind = os.environ.get("GLASSBOX_TP_CPU_BIND")
    lists = len(cpu_lists(bind)) if bind else local
    if lists != local:
        raise ValueError(f"GLASSBOX_TP_CPU_BIND={bind!r} has {lists} CPU lists for this host's {local} ranks")
    if device.type == "cuda" and compute_backend(True) == "nccl":
        gpus = torch.cuda.device_count()
        if gpus < local:
            raise ValueError(
                f"--tensor-parallel-size {n} on CUDA runs a rank a GPU (NCCL): this host has {gpus} GPU(s) for "
                f"its {local} ranks"
            )
    elif device.type not in ("cpu", "cuda"):
        raise ValueError(f"--tensor-parallel-size {n} runs on the CPU and on CUDA, not on {device.type}")
    qc = checkpoint.facts.quantization_config if checkpoint is not None else {}
    if config.quantization not in (None, "none", "fp8"):  # fp8: a scale per row, none along K
        check_k_blocks(n, str(config.quantization), cfg)
    if qc and not (group_quant(qc) or ct_int_spec(qc) or fp8_spec(qc) or is_fp4(qc)):
        raise ValueError(
            f"--tensor-parallel-size {n} splits 16/32-bit, GPTQ/AWQ, compressed-tensors integer, FP8, NVFP4 "
            f"and MXFP4 safetensors checkpoints and GGUF files (not {quant_method(qc)!r} ones)"
        )
    if checkpoint is not None and checkpoint.gguf is not None:
        check_gguf_tp(checkpoint.gguf, cfg, n)
    check_tp(cfg, n)


def check_k_blocks(n: int, quantization: str, cfg: ModelConfig) -> None:
    """ValueError where a row-parallel layer's K shard (o_proj, down_proj: split along their input columns)
    would not be whole 32-value blocks: each rank quantizes its own shard, which is then the whole model's
    blocks (``--quantization`` blocks run along K within a row)."""
    widths = {"o_proj": cfg.num_heads * cfg.head_dim, "down_proj": cfg.intermediate_size}
    if any(cfg.layer_moe):
        widths["the shared expert's down_proj"] = cfg.shared_expert_intermediate_size
        widths["the experts' down_proj"] = cfg.moe_intermediate_size  # quantized too (on the CPU)
    for what, k in widths.items():
        if k and (k // n) % QUANT_BLOCK:
            raise ValueError(
                f"--tensor-parallel-size {n} with --quantization {quantization}: {what}'s {k} input columns "
                f"split into {k // n} a rank, not whole {QUANT_BLOCK}-value blocks (pick a size that does)"
            )


# the values of a block along K: int8, int4, int4-asym (quant/blocks/weights.py), mxfp4 (nvfp4: 16)
QUANT_BLOCK = 32


def weights(
    tp: TPState, checkpoint: Checkpoint, cfg: ModelConfig, keep_blocks: bool
) -> tuple[Tensors, dict[str, Kept]]:
    """This rank's shards: (float tensors, packed ones by HF name), read slice by slice from the
    safetensors files, from a GGUF file's blocks (kept packed with ``keep_blocks``: models/gguf_shards.py),
    or from a quantized checkpoint's layers (kept packed: quant/shards.py); a multimodal checkpoint's text
    model's (models/multimodal.py)."""
    if checkpoint.gguf is not None:
        return sharded_gguf(checkpoint.gguf, cfg, tp.rank, tp.world, keep_blocks)
    qc, path = checkpoint.facts.quantization_config, checkpoint.source.path
    if qc and checkpoint.multimodal:
        raise ValueError(
            f"--tensor-parallel-size {tp.world}: a quantized multimodal checkpoint is not split yet"
        )
    if qc and is_fp4(qc):
        return sharded_fp4(path, qc, cfg, tp.rank, tp.world)
    if qc:
        return sharded_quantized(path, qc, cfg, tp.rank, tp.world)
    if checkpoint.multimodal:  # the text model's tensors (models/multimodal.py), the towers' never sliced
        return text_tensors(
            sharded_safetensors(path, cfg, tp.rank, tp.world, tower_names(path)), str(path)
        ), {}
    return sharded_safetensors(path, cfg, tp.rank, tp.world), {}


def max_across(tp: TPState | None) -> Callable[[torch.Tensor], torch.Tensor] | None:
    """The elementwise largest value over the ranks (load-time scales of whole rows or tensors), or None."""
    return None if tp is None else load_max


def shard_fn(tp: TPState | None, cfg: ModelConfig) -> Callable[[CausalLM], None] | None:
    """The function splitting the built model for this rank: its family's own, or apply_tp."""
    split = engine_family(cfg.architecture).split_for_tp() or apply_tp
    return None if tp is None else partial(split, rank=tp.rank, world=tp.world)


def kv_heads(tp: TPState | None, cfg: ModelConfig, layer: int = 0) -> int:
    """KV heads in this rank's cache of ``layer``."""
    return cfg.kv_shape(layer)[0] if tp is None else len(kv_heads_of(cfg, tp.rank, tp.world, layer))


def agree(tp: TPState | None, plan: KVCachePlan, weight_bytes: int) -> tuple[KVCachePlan, list[int]]:
    """The fewest KV blocks any rank can hold (rank 0's scheduler hands out block ids every rank uses), and
    every rank's weight bytes (rank order)."""
    if tp is None:
        return plan, [weight_bytes]
    blocks = min(gather_ints(plan.num_blocks))
    return KVCachePlan(blocks, plan.block_size, plan.bytes_per_block), gather_ints(weight_bytes)


def send_step(inputs: StepInputs) -> None:
    """Rank 0: the step's inputs to every worker (before its own forward), their tensors as CPU copies
    (pickled CUDA tensors would name rank 0's GPU)."""
    broadcast_object(moved(inputs, torch.device("cpu")))


def moved(obj: Any, device: torch.device) -> Any:
    """``obj`` with every tensor in it (tuples, lists, dataclasses such as AttentionMetadata, nested) on
    ``device`` (dataclasses copied)."""
    if isinstance(obj, torch.Tensor):
        return obj.to(device)
    if isinstance(obj, tuple | list):
        return type(obj)(moved(o, device) for o in obj)
    if dataclasses.is_dataclass(obj) and not isinstance(obj, type):
        changes = {f.name: moved(getattr(obj, f.name), device) for f in dataclasses.fields(obj) if f.init}
        return dataclasses.replace(obj, **changes)
    return obj


def run_step(ex: StepRunner, inputs: StepInputs) -> None:
    """A worker: the same forward as rank 0 (its collectives pair with rank 0's), and the LM head on the
    sampled rows (their logits are all-gathered); rank 0 alone samples."""
    ids, pos, meta, rows, (kernel, prompt) = moved(inputs, ex.kv_caches[0].device)
    with torch.inference_mode(), block_kernel_rows(kernel, prompt):
        hidden = ex.forward(ids, pos, ex.kv_caches, meta)
        if rows is not None:
            ex.model.compute_logits(hidden.index_select(0, rows))
