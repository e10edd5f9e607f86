"""Tensor parallelism applied to a built Llama-family model (gpt-fast's ``apply_tp``, Megatron's split), and
each rank's shard read from safetensors without materializing a whole tensor.

On ``world`` ranks, rank r holds:
- q/k/v and gate/up: column-parallel (its output rows): q heads [r H/N, (r+1) H/N); KV heads split the same
  way, or, with fewer KV heads than ranks, the one KV head its q heads read (replicated over N/KV ranks);
  gate/up rows [r I/N, (r+1) I/N). No communication.
- o and down: row-parallel (its input columns); their partial sums are all-reduced (one all-reduce after
  attention, one after the MLP), the bias added once after the sum.
- the embedding: vocab-parallel, rows [r P, (r+1) P) with P = ceil(V/N) (the last shard zero-padded): a
  token's row comes from the rank that holds it, zeros elsewhere, summed by one all-reduce.
- the LM head: vocab-parallel the same way; the sampled rows' logits are all-gathered (every rank ends the
  step with the full logits; rank 0 samples). A tied head shares the embedding's shard.
- norms (and Qwen3's q/k norms, per head_dim) whole.
Refused (``check_tp``): MoE layers, attention sinks, head or FFN counts the ranks do not divide.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import torch
import torch.nn.functional as F
from safetensors import safe_open
from torch import nn

from glassbox.distributed import all_gather_last, all_reduce
from glassbox.models.causal_lm import CausalLM
from glassbox.models.llama import LlamaAttention, LlamaForCausalLM, LlamaMLP
from glassbox.models.loader import weight_files
from glassbox.models.model_config import ModelConfig


class RowParallelLinear(nn.Linear):
    """y = all_reduce(x W_r^T) + b: this rank's input columns of W; the bias whole, added after the sum."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = all_reduce(F.linear(x, self.weight))
        return y if self.bias is None else y + self.bias


class VocabParallelEmbedding(nn.Embedding):
    """Rows [start, start + P) of the table; other tokens look up zeros, then one all-reduce."""

    def __init__(self, vocab_size: int, hidden: int, rank: int, world: int) -> None:
        per = -(-vocab_size // world)
        super().__init__(per, hidden)
        self.start, self.vocab_size = rank * per, vocab_size

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        local = ids - self.start
        mine = (local >= 0) & (local < self.num_embeddings)
        out = F.embedding(torch.where(mine, local, 0), self.weight)
        return all_reduce(out.masked_fill(~mine.unsqueeze(-1), 0.0))


class VocabParallelLMHead(nn.Linear):
    """Logits of vocabulary rows [start, start + P); all-gathered to (rows, V)."""

    def __init__(self, hidden: int, vocab_size: int, world: int) -> None:
        super().__init__(hidden, -(-vocab_size // world), bias=False)
        self.vocab_size = vocab_size

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return all_gather_last(F.linear(x, self.weight))[..., : self.vocab_size]


def check_tp(cfg: ModelConfig, world: int) -> None:
    """ValueError naming what tensor parallelism over ``world`` ranks cannot run for this model."""
    if world == 1:
        return
    if cfg.architecture not in TP_ARCHITECTURES:
        raise ValueError(
            f"--tensor-parallel-size {world}: {cfg.architecture} has no tensor-parallel split yet "
            f"(built for {', '.join(sorted(TP_ARCHITECTURES))})"
        )
    if any(cfg.layer_moe):
        raise ValueError(
            f"--tensor-parallel-size {world}: MoE layers are not split across ranks yet (dense models only)"
        )
    if cfg.attention_sinks:
        raise ValueError(f"--tensor-parallel-size {world}: attention sinks are not split across ranks yet")
    if cfg.num_heads % world:
        raise ValueError(f"--tensor-parallel-size {world} must divide the model's {cfg.num_heads} heads")
    kv = cfg.num_kv_heads
    if kv % world and world % kv:
        raise ValueError(
            f"--tensor-parallel-size {world} and the model's {kv} KV heads: one must divide the other"
        )
    if cfg.intermediate_size % world:
        raise ValueError(
            f"--tensor-parallel-size {world} must divide the model's FFN width {cfg.intermediate_size}"
        )


TP_ARCHITECTURES = frozenset(
    {"LlamaForCausalLM", "Qwen2ForCausalLM", "Qwen3ForCausalLM", "MistralForCausalLM"}
)


def kv_heads_of(cfg: ModelConfig, rank: int, world: int) -> range:
    """The KV heads rank ``rank`` holds."""
    kv = cfg.num_kv_heads
    if kv >= world:
        per = kv // world
        return range(rank * per, (rank + 1) * per)
    head = rank // (world // kv)
    return range(head, head + 1)


def apply_tp(model: CausalLM, rank: int, world: int) -> None:
    """Replace ``model``'s layers by this rank's parallel ones (on the meta device, before any weight is
    allocated: the loader then fills the shards)."""
    assert isinstance(model, LlamaForCausalLM)
    cfg = model.config
    check_tp(cfg, world)
    h, hd = cfg.hidden_size, cfg.head_dim
    heads, kv_heads, inter = (
        cfg.num_heads // world,
        len(kv_heads_of(cfg, rank, world)),
        cfg.intermediate_size // world,
    )
    for layer in model.model.layers:
        attn, mlp = layer.self_attn, layer.mlp
        assert isinstance(attn, LlamaAttention) and isinstance(mlp, LlamaMLP)
        attn.num_heads, attn.num_kv_heads = heads, kv_heads
        attn.q_proj = nn.Linear(h, heads * hd, bias=cfg.qkv_bias)
        attn.k_proj = nn.Linear(h, kv_heads * hd, bias=cfg.qkv_bias)
        attn.v_proj = nn.Linear(h, kv_heads * hd, bias=cfg.qkv_bias)
        attn.o_proj = RowParallelLinear(heads * hd, h, bias=cfg.o_bias)
        bias = cfg.mlp_bias
        mlp.gate_proj, mlp.up_proj = nn.Linear(h, inter, bias=bias), nn.Linear(h, inter, bias=bias)
        mlp.down_proj = RowParallelLinear(inter, h, bias=bias)
        mlp.intermediate = inter
    model.model.embed_tokens = VocabParallelEmbedding(cfg.vocab_size, h, rank, world)
    model.lm_head = VocabParallelLMHead(h, cfg.vocab_size, world)
    if cfg.tie_word_embeddings:
        model.lm_head.weight = model.model.embed_tokens.weight


def _shard(name: str, shape: list[int], cfg: ModelConfig, rank: int, world: int) -> tuple[str, int, int, int]:
    """How rank ``rank`` reads tensor ``name``: ("rows" | "cols" | "whole", start, end, padded rows)."""
    hd = cfg.head_dim
    part = name.rsplit(".", 2)
    module, kind = (part[-2], part[-1]) if len(part) >= 2 else ("", name)
    if module in ("embed_tokens", "lm_head"):
        per = -(-cfg.vocab_size // world)
        return "rows", min(rank * per, shape[0]), min((rank + 1) * per, shape[0]), per
    if module == "q_proj":
        per = cfg.num_heads // world * hd
        return "rows", rank * per, (rank + 1) * per, per
    if module in ("k_proj", "v_proj"):
        r = kv_heads_of(cfg, rank, world)
        return "rows", r.start * hd, r.stop * hd, len(r) * hd
    if module in ("gate_proj", "up_proj"):
        per = cfg.intermediate_size // world
        return "rows", rank * per, (rank + 1) * per, per
    if module in ("o_proj", "down_proj") and kind == "weight":
        per = shape[1] // world
        return "cols", rank * per, (rank + 1) * per, 0
    return "whole", 0, 0, 0


def sharded_safetensors(
    model_dir: Path, cfg: ModelConfig, rank: int, world: int
) -> Iterator[tuple[str, torch.Tensor]]:
    """(HF name, this rank's shard) of every tensor, each read with safetensors' ``get_slice`` (only the
    shard's bytes leave the file)."""
    for path in weight_files(model_dir):
        with safe_open(str(path), framework="pt") as f:
            for name in f.keys():  # noqa: SIM118 (safe_open is not a dict)
                sl = f.get_slice(name)
                how, a, b, rows = _shard(name, list(sl.get_shape()), cfg, rank, world)
                if how == "whole":
                    yield name, f.get_tensor(name)
                elif how == "cols":
                    yield name, sl[:, a:b]
                else:
                    t = sl[a:b]
                    if t.shape[0] < rows:  # the last vocabulary shard: zero rows up to P
                        t = torch.cat([t, t.new_zeros((rows - t.shape[0], *t.shape[1:]))])
                    yield name, t
