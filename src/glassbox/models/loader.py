"""Build a model of a family (models/families.py names its class) and load its weights by Hugging Face name."""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterable

import torch
from torch import nn

from glassbox.layers.attention import AttentionMetadata
from glassbox.layers.norm import GemmaRMSNorm
from glassbox.layers.rotary import RotaryEmbedding
from glassbox.models.causal_lm import CausalLM
from glassbox.models.families import engine_family
from glassbox.models.model_config import ModelConfig
from glassbox.quant.blocks.linear import BlockQuantEmbedding, BlockQuantLinear
from glassbox.quant.kept import Kept, swap_in_kept
from glassbox.quant.walk import in_place_of

logger = logging.getLogger(__name__)

# (input ids (T,), positions (T,), KV caches, attention metadata) -> final hidden states (T, hidden)
Forward = Callable[[torch.Tensor, torch.Tensor, list[torch.Tensor], AttentionMetadata], torch.Tensor]


def bind_cpu_kernels(model: nn.Module, kv_caches: list[torch.Tensor], dtype: torch.dtype) -> Forward:
    """The model's forward on the CPU kernels, bound to its weights and ``kv_caches``; ValueError when its
    family has none (models/families.py ``cpu_forward``) or a shape the kernels cannot take."""
    config = getattr(model, "config", None)
    bind = engine_family(config.architecture).bind_cpu_forward() if isinstance(config, ModelConfig) else None
    if bind is None:
        raise ValueError(f"no CPU-kernel forward for {type(model).__name__}")
    forward: Forward = bind(model, kv_caches, dtype)
    return forward


def build_model(
    cfg: ModelConfig,
    weights: Iterable[tuple[str, torch.Tensor]] | None,
    dtype: torch.dtype,
    device: torch.device,
    seed: int = 0,
    where: str = "the checkpoint",
    kept: dict[str, Kept] | None = None,
    shard: Callable[[CausalLM], None] | None = None,
) -> CausalLM:
    """The model on ``device`` in ``dtype`` with ``weights`` (HF names) loaded, or random ones when None,
    and the ``packed`` weights (HF name -> blocks) kept in their blocks; then fused, in eval mode, and with
    no parameter requiring grad (an inference engine never trains: a forward run outside
    ``torch.inference_mode`` on inference tensors, such as a CUDA graph's outputs, would otherwise fail to
    save them for a backward that never comes). ``shard`` rewrites the model on the meta device before any
    weight exists (tensor parallelism: models/tensor_parallel.apply_tp), and ``weights`` are then shards."""
    with torch.device("meta"):
        model = engine_family(cfg.architecture).model_class()(cfg)
        if shard is not None:
            shard(model)
    model.to(dtype)  # still on meta: free
    model.to_empty(device=device)
    # Buffers (every rotary table) were created on meta: rebuild them for real, in float32.
    for module in model.modules():
        if isinstance(module, RotaryEmbedding):
            module.materialize(device)
    if kept:
        swap_in_kept(model, kept, dtype)
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
    if missing and all(n.startswith("mtp.") for n in missing):  # the MTP head (models/qwen3_next_mtp.py)
        raise ValueError(f"--speculative-config: method 'mtp' needs the checkpoint's MTP weights (mtp.*), "
                         f"which {where} lacks ({', '.join(missing[:4])}); use ngram or draft_model")  # fmt: skip
    if missing:
        raise ValueError(f"weights missing from {where}: {', '.join(missing[:8])}")
