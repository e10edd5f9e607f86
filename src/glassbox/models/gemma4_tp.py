"""Tensor parallelism applied to a built Gemma 4 model (models/gemma4.py), Megatron's split as
models/tensor_parallel.py makes it for the Llama family and Gemma 3, layer by layer since Gemma 4's layers
differ:

- each layer's q heads split over the ranks, its K/V heads (the full layers' fewer ones too) split or,
  fewer than the ranks, replicated; o row-parallel (one all-reduce after attention); a layer reading another
  layer's KV reads the same heads of that layer's cache on its rank;
- the dense MLP by FFN width (its width: twice in the KV-sharing layers where the config doubles it),
  down row-parallel; the routed experts each by FFN width, their output all-reduced before the norm that
  follows them (``RowParallelExperts``); the router whole;
- the embedding and the LM head by vocabulary (Gemma's scaled table); the per-layer input table, its
  projection and each layer's per-layer gate and projection whole on every rank (they feed norms and
  products that need whole rows; in the E2B/E4B models the table is large: held once per rank);
- norms, the layer scalars and the router's scales whole.

Checkpoints: each rank reads its slices by name (models/tensor_parallel.shard_plan reads each layer's own
KV geometry). GGUF files are refused for now (their fused gate/up experts have no shard reader).
"""

from __future__ import annotations

import dataclasses

import torch
from torch import nn

from glassbox.distributed import all_reduce
from glassbox.models.causal_lm import CausalLM
from glassbox.models.gemma3 import ScaledEmbedding
from glassbox.models.gemma4 import Gemma4ForCausalLM
from glassbox.models.gemma4_layers import Gemma4DecoderLayer
from glassbox.models.llama import LlamaMLP
from glassbox.models.model_config import ModelConfig
from glassbox.models.moe import MoEExperts
from glassbox.models.tensor_parallel import (
    RowParallelLinear,
    ScaledVocabParallelEmbedding,
    VocabParallelLMHead,
    check_tp,
    kv_heads_of,
)


class RowParallelExperts(MoEExperts):
    """Routed experts holding 1/N of each expert's FFN width: their output is a partial sum, all-reduced here
    (the routing weights scale it linearly), before the norm that follows them."""

    def forward(self, x: torch.Tensor, ids: torch.Tensor, weights: torch.Tensor) -> torch.Tensor:
        return all_reduce(super().forward(x, ids, weights))


def _split_attention(layer: Gemma4DecoderLayer, cfg: ModelConfig, index: int, rank: int, world: int) -> None:
    attn, h = layer.self_attn, cfg.hidden_size
    dim, heads = attn.head_dim, attn.num_heads // world
    attn.num_heads = heads
    attn.q_proj = nn.Linear(h, heads * dim, bias=False)
    attn.o_proj = RowParallelLinear(heads * dim, h, bias=False)
    attn.splits = [heads * dim]
    if attn.owns_kv:
        kv = len(kv_heads_of(cfg, rank, world, index))
        attn.num_kv_heads = kv
        attn.k_proj = nn.Linear(h, kv * dim, bias=False)
        attn.v_proj = None if attn.k_eq_v else nn.Linear(h, kv * dim, bias=False)
        attn.splits += [kv * dim] if attn.k_eq_v else [kv * dim, kv * dim]


def _split_mlp(mlp: LlamaMLP, h: int, world: int) -> None:
    inter = mlp.intermediate // world
    mlp.gate_proj, mlp.up_proj = nn.Linear(h, inter, bias=False), nn.Linear(h, inter, bias=False)
    mlp.down_proj = RowParallelLinear(inter, h, bias=False)
    mlp.intermediate = inter


def apply_gemma4_tp(model: CausalLM, rank: int, world: int) -> None:
    """Replace ``model``'s layers by this rank's parallel ones (on the meta device, before any weight exists:
    the loader then fills the shards)."""
    assert isinstance(model, Gemma4ForCausalLM)
    cfg = model.config
    check_tp(cfg, world)
    h = cfg.hidden_size
    for i, layer in enumerate(model.model.layers):
        assert isinstance(layer, Gemma4DecoderLayer)
        _split_attention(layer, cfg, i, rank, world)
        _split_mlp(layer.mlp, h, world)
        if layer.experts is not None:
            old = layer.experts
            layer.experts = RowParallelExperts(old.num_experts, h, old.inter // world, old.glu)
    # the loader places each expert's checkpoint rows by the model's expert width: this rank's
    model.config = dataclasses.replace(cfg, moe_intermediate_size=cfg.moe_intermediate_size // world)
    table = model.model.embed_tokens
    assert isinstance(table, ScaledEmbedding)
    model.model.embed_tokens = ScaledVocabParallelEmbedding(cfg.vocab_size, h, rank, world, table.scale)
    model.lm_head = VocabParallelLMHead(h, cfg.vocab_size, world)
    if cfg.tie_word_embeddings:
        model.lm_head.weight = model.model.embed_tokens.weight
