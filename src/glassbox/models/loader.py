"""Build a model of a family (a plain dict of classes) and load its weights by Hugging Face name."""

from __future__ import annotations

import json
import logging
from collections.abc import Callable, Iterable, Iterator
from collections.abc import Set as AbstractSet
from pathlib import Path

import torch
from safetensors import safe_open
from torch import nn

from glassbox.layers.attention import AttentionMetadata
from glassbox.layers.norm import GemmaRMSNorm
from glassbox.layers.rotary import RotaryEmbedding
from glassbox.models import hybrid_native, llama_native
from glassbox.models.causal_lm import CausalLM
from glassbox.models.gemma3 import Gemma3ForCausalLM
from glassbox.models.gpt_oss import GptOssForCausalLM
from glassbox.models.llama import LlamaForCausalLM
from glassbox.models.model_config import ModelConfig
from glassbox.models.moe import MoEExperts
from glassbox.models.nemotron_h import NemotronHForCausalLM
from glassbox.models.qwen3_next import Qwen3NextForCausalLM
from glassbox.quant.blocks.linear import BlockQuantEmbedding, BlockQuantLinear, PackedWeights
from glassbox.quant.fp4.linear import FP4Linear
from glassbox.quant.fp4.weights import FP4Weights
from glassbox.quant.fp8.linear import Fp8Linear
from glassbox.quant.fp8.weights import Fp8Weights
from glassbox.quant.held_experts import HeldExperts
from glassbox.quant.in_place import in_place_of

logger = logging.getLogger(__name__)

# Weights kept in a format of their own, by HF weight name (a MoE layer's experts: by module name)
Packed = PackedWeights | Fp8Weights | FP4Weights | HeldExperts
# (input ids (T,), positions (T,), KV caches, attention metadata) -> final hidden states (T, hidden)
Forward = Callable[[torch.Tensor, torch.Tensor, list[torch.Tensor], AttentionMetadata], torch.Tensor]

# The family file that runs each architecture; a plain dict, no registry.
MODEL_CLASSES: dict[str, type[CausalLM]] = {
    "LlamaForCausalLM": LlamaForCausalLM,
    "Qwen2ForCausalLM": LlamaForCausalLM,
    "Qwen3ForCausalLM": LlamaForCausalLM,
    "MistralForCausalLM": LlamaForCausalLM,
    "Gemma3ForCausalLM": Gemma3ForCausalLM,
    "MixtralForCausalLM": LlamaForCausalLM,  # Llama layers with routed experts (models/moe.py)
    "Qwen2MoeForCausalLM": LlamaForCausalLM,
    "Qwen3MoeForCausalLM": LlamaForCausalLM,
    "GptOssForCausalLM": GptOssForCausalLM,  # Llama layers with sinks and its own experts (models/gpt_oss.py)
    "Phi3ForCausalLM": LlamaForCausalLM,  # its fused qkv/gate_up tensors cut as read (models/fused_parts.py)
    # hybrid: Gated DeltaNet + gated attention (models/qwen3_next.py), a recurrent state beside the KV
    "Qwen3NextForCausalLM": Qwen3NextForCausalLM,
    "Qwen3_5ForCausalLM": Qwen3NextForCausalLM,
    "Qwen3_5MoeForCausalLM": Qwen3NextForCausalLM,
    "NemotronHForCausalLM": NemotronHForCausalLM,  # Mamba-2 + attention + MLP/MoE (models/nemotron_h.py)
}
# The families with a forward on glassbox's CPU kernels: (model, KV caches, dtype) -> that forward.
# A family absent here (Gemma 3) runs on the PyTorch ops on the CPU.
CPU_KERNEL_FORWARDS: dict[type[nn.Module], Callable[..., Forward]] = {
    LlamaForCausalLM: llama_native.bind,
    GptOssForCausalLM: llama_native.bind,
    Qwen3NextForCausalLM: hybrid_native.bind,  # the decode recurrences in C (models/hybrid_native.py)
    NemotronHForCausalLM: hybrid_native.bind,
}


def bind_cpu_kernels(model: nn.Module, kv_caches: list[torch.Tensor], dtype: torch.dtype) -> Forward:
    """The model's forward on the CPU kernels, bound to its weights and ``kv_caches``; ValueError when its
    family has none or a shape the kernels cannot take."""
    bind = CPU_KERNEL_FORWARDS.get(type(model))
    if bind is None:
        raise ValueError(f"no CPU-kernel forward for {type(model).__name__}")
    return bind(model, kv_caches, dtype)


def weight_files(model_dir: Path) -> list[Path]:
    """The safetensors files of a checkpoint: the index's shards, or the single model.safetensors."""
    index = model_dir / "model.safetensors.index.json"
    if index.is_file():
        shards = sorted(set(json.loads(index.read_text())["weight_map"].values()))
        files = [model_dir / s for s in shards]
        missing = [f.name for f in files if not f.is_file()]
        if missing:
            raise FileNotFoundError(f"weight shards missing in {model_dir}: {', '.join(missing)}")
        return files
    single = model_dir / "model.safetensors"
    if single.is_file():
        return [single]
    found = sorted(model_dir.glob("*.safetensors"))
    if found:
        return found
    raise FileNotFoundError(f"no *.safetensors weights found in model directory {model_dir}")


def safetensors_tensors(
    model_dir: Path, skip: AbstractSet[str] = frozenset()
) -> Iterator[tuple[str, torch.Tensor]]:
    """(name, tensor) of every tensor in a directory's safetensors files but those in ``skip`` (the ones
    a quantized checkpoint's reader took), one at a time."""
    for path in weight_files(model_dir):
        with safe_open(str(path), framework="pt") as f:
            for name in f.keys():  # noqa: SIM118 (safe_open is not a dict)
                if name not in skip:
                    yield name, f.get_tensor(name)


def build_model(
    cfg: ModelConfig,
    weights: Iterable[tuple[str, torch.Tensor]] | None,
    dtype: torch.dtype,
    device: torch.device,
    seed: int = 0,
    where: str = "the checkpoint",
    packed: dict[str, Packed] | None = None,
    shard: Callable[[CausalLM], None] | None = None,
) -> CausalLM:
    """The model on ``device`` in ``dtype`` with ``weights`` (HF names) loaded, or random ones when None,
    and the ``packed`` weights (HF name -> blocks) kept in their blocks; then fused, in eval mode, and with
    no parameter requiring grad (an inference engine never trains: a forward run outside
    ``torch.inference_mode`` on inference tensors, such as a CUDA graph's outputs, would otherwise fail to
    save them for a backward that never comes). ``shard`` rewrites the model on the meta device before any
    weight exists (tensor parallelism: models/tensor_parallel.apply_tp), and ``weights`` are then shards."""
    with torch.device("meta"):
        model = MODEL_CLASSES[cfg.architecture](cfg)
        if shard is not None:
            shard(model)
    model.to(dtype)  # still on meta: free
    model.to_empty(device=device)
    # Buffers (every rotary table) were created on meta: rebuild them for real, in float32.
    for module in model.modules():
        if isinstance(module, RotaryEmbedding):
            module.materialize(device)
    if packed:
        _swap_in_blocks(model, packed, dtype)
    embed = model.get_submodule("model.embed_tokens")
    embed = getattr(embed, "inner", embed)  # a vocab-parallel shard's packed table
    if cfg.tie_word_embeddings and isinstance(embed, BlockQuantEmbedding):
        model.lm_head = in_place_of(model.lm_head, BlockQuantLinear(embed.w))  # type: ignore[assignment]
    elif cfg.tie_word_embeddings:
        model.tie_weights()
    if weights is None:
        _fill_random(model, seed)
    else:
        load_weights(model, weights, where)
    model.fuse()
    model.eval()
    model.requires_grad_(False)  # after fuse(): the fused linears are new parameters
    return model


def _swap_in_blocks(model: nn.Module, packed: dict[str, Packed], dtype: torch.dtype) -> None:
    """Replace each module whose weight is in ``packed`` by its block-quantized (FP8, FP4) form (a bias
    stays a parameter, loaded from the checkpoint by name); MoE experts (by module name) hold theirs."""
    for name, blocks in packed.items():
        if isinstance(blocks, HeldExperts):
            experts = model.get_submodule(name)
            if not isinstance(experts, MoEExperts):
                raise ValueError(f"{name}: held experts for a {type(experts).__name__}")
            try:
                experts.hold(blocks)
            except ValueError as e:
                raise ValueError(f"{name}: {e}") from None
            continue
        parent_name, _, child = name.removesuffix(".weight").rpartition(".")
        parent = model.get_submodule(parent_name)
        old = getattr(parent, child)
        new: nn.Module
        bias = None if not isinstance(old, nn.Linear) or old.bias is None else torch.zeros(old.out_features)
        if hasattr(
            old, "around"
        ):  # a tensor-parallel layer keeps its bias (a row-parallel one: after the sum)
            bias = None
        if isinstance(blocks, Fp8Weights):
            if not isinstance(old, nn.Linear):
                raise ValueError(f"{name}: FP8 weights for a {type(old).__name__}, not a linear layer")
            new = Fp8Linear(blocks, bias).to(old.weight.device)
        elif isinstance(blocks, FP4Weights) and isinstance(old, nn.Linear):
            new = FP4Linear(blocks, bias)
        elif isinstance(old, nn.Embedding) and isinstance(blocks, PackedWeights):
            # Gemma 3's table scales its rows: the blocks must too
            new = BlockQuantEmbedding(blocks, dtype, getattr(old, "scale", None))  # also its TP shard's
        elif isinstance(old, nn.Linear) and isinstance(blocks, PackedWeights):
            new = BlockQuantLinear(blocks, bias)
        else:
            raise ValueError(f"{name}: packed weights for a {type(old).__name__}, not a linear or embedding")
        if (new.num_embeddings if isinstance(new, BlockQuantEmbedding) else new.out_features) != (
            blocks.out_features
        ) or (isinstance(old, nn.Linear) and old.in_features != blocks.in_features):
            raise ValueError(f"{name}: packed shape does not match the model")
        setattr(parent, child, in_place_of(old, new))


def _fill_random(model: nn.Module, seed: int) -> None:
    gen = torch.Generator(device="cpu").manual_seed(seed)
    dev_gen: torch.Generator | None = None
    # each norm at its identity scale: weight 1, or 0 where the norm scales by (1 + weight)
    identity = {f"{n}.weight": 0.0 for n, m in model.named_modules() if isinstance(m, GemmaRMSNorm)}
    with torch.no_grad():
        for name, p in model.named_parameters():
            if name.endswith("norm.weight"):
                p.fill_(identity.get(name, 1.0))
            elif name.endswith(".bias"):
                p.zero_()
            elif p.device.type == "cuda":  # drawn on the GPU: an 8B model in seconds, not minutes
                if dev_gen is None:
                    dev_gen = torch.Generator(device=p.device).manual_seed(seed)
                p.normal_(0.0, 0.02, generator=dev_gen)
            else:
                # filled in float32 on the CPU in slices to keep host memory bounded, then copied
                flat = p.view(-1)
                step = 1 << 24
                for i in range(0, flat.numel(), step):
                    n = min(step, flat.numel() - i)
                    flat[i : i + n].copy_(torch.randn(n, generator=gen) * 0.02)


def load_weights(model: nn.Module, weights: Iterable[tuple[str, torch.Tensor]], where: str) -> None:
    """Copy each (HF name, tensor) into the parameter of that name (or the part of one the family maps
    it to: ``CausalLM.checkpoint_view``); ValueError on a shape mismatch or a parameter the checkpoint
    does not fill (``where`` names the checkpoint)."""
    params = dict(model.named_parameters(remove_duplicate=False))
    filled: dict[str, int] = {}  # parameter -> elements copied into it
    with torch.no_grad():
        for name, tensor in weights:
            if isinstance(model, CausalLM):
                view = model.checkpoint_view(name, params)
            else:
                view = (name, params[name]) if name in params else None
            if view is None:
                logger.debug("ignoring checkpoint tensor %s", name)
                continue
            target_name, target = view
            if tuple(tensor.shape) != tuple(target.shape):
                raise ValueError(
                    f"{name}: checkpoint shape {tuple(tensor.shape)} != model {tuple(target.shape)}"
                )
            target.copy_(tensor.to(target.dtype))
            filled[target_name] = filled.get(target_name, 0) + target.numel()
    config = getattr(model, "config", None)
    if (
        isinstance(config, ModelConfig)
        and config.tie_word_embeddings
        and "model.embed_tokens.weight" in filled
    ):
        filled["lm_head.weight"] = params["lm_head.weight"].numel()
    missing = sorted(n for n, p in params.items() if filled.get(n, 0) < p.numel())
    if missing:
        raise ValueError(f"weights missing from {where}: {', '.join(missing[:8])}")
