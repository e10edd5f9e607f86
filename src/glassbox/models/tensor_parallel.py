"""Tensor parallelism applied to a built Llama-family or Gemma 3 model (gpt-fast's ``apply_tp``, Megatron's
split), and each rank's shard read from safetensors without materializing a whole tensor.

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
- MoE layers (Mixtral, Qwen2-MoE, Qwen3-MoE): tensor-parallel within each expert (every rank holds every
  expert's gate/up rows and down columns [r I/N, (r+1) I/N), and the shared expert's likewise), the router
  and the shared expert's gate whole; the block's partial output is all-reduced once. Chosen over expert
  parallelism because every rank then reads 1/N of each chosen expert (balanced whatever the routing) and
  the block needs one all-reduce, as a dense MLP does, with no token exchange.
- norms (and Qwen3's and Gemma 3's q/k norms, per head_dim) whole; Gemma 3's scaled embedding scales the
  summed row.
- gpt-oss: its sinks by q head; its experts (stored transposed, gate and up interleaved) by FFN width as
  above, the experts' down bias added by rank 0 only.
Refused (``check_tp``): head or FFN widths the ranks do not divide.
"""

from __future__ import annotations

import dataclasses
import re
from collections.abc import Callable, Iterator
from collections.abc import Set as AbstractSet
from pathlib import Path

import torch
import torch.nn.functional as F
from safetensors import safe_open
from torch import nn

from glassbox.distributed import all_gather_last, all_reduce
from glassbox.models.causal_lm import CausalLM
from glassbox.models.families import FAMILIES
from glassbox.models.fused_parts import fused_config, fused_rows
from glassbox.models.gemma3 import Gemma3Attention, Gemma3ForCausalLM, Gemma3MLP, ScaledEmbedding, rounded
from glassbox.models.llama import LlamaAttention, LlamaForCausalLM, LlamaMLP
from glassbox.models.model_config import ModelConfig
from glassbox.models.moe import MoEExperts, SparseMoeBlock
from glassbox.models.safetensors_files import weight_files


class RowParallelLinear(nn.Linear):
    """y = all_reduce(x W_r^T) + b: this rank's input columns of W; the bias whole, added after the sum."""

    cuts_k = True  # layers/in_place.cuts_k

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return _plus(all_reduce(F.linear(x, self.weight)), self.bias)

    def around(self, inner: nn.Module) -> RowParallel:
        """The same layer with its weight kept packed in ``inner`` (built without the bias)."""
        return RowParallel(inner, self.bias)


class RowParallel(nn.Module):
    """all_reduce(inner(x)) + b: a row-parallel layer whose weight (this rank's input columns) ``inner``
    keeps packed (BlockQuantLinear: block quantization, GGUF blocks; FP4Linear), the bias whole after the
    sum. Made by ``RowParallelLinear.around`` when its weight is quantized or swapped for packed blocks."""

    def __init__(self, inner: nn.Module, bias: nn.Parameter | None) -> None:
        super().__init__()
        self.inner = inner
        self.bias = bias

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return _plus(all_reduce(self.inner(x)), self.bias)


def _plus(y: torch.Tensor, bias: torch.Tensor | None) -> torch.Tensor:
    return y if bias is None else y + bias


class RowParallelMoeBlock(SparseMoeBlock):
    """A SparseMoeBlock whose experts (and shared expert) hold 1/N of their FFN width: its output is a
    partial sum, all-reduced here (the routing weights and the shared gate scale it linearly)."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return all_reduce(super().forward(x))


def _vocab_lookup(
    ids: torch.Tensor, start: int, rows: int, lookup: Callable[[torch.Tensor], torch.Tensor]
) -> torch.Tensor:
    """Rows of the vocabulary shard [start, start + rows): other tokens look up zeros; then one all-reduce."""
    local = ids - start
    mine = (local >= 0) & (local < rows)
    out = lookup(torch.where(mine, local, 0))
    return all_reduce(out.masked_fill(~mine.unsqueeze(-1), 0.0))


class VocabParallelEmbedding(nn.Embedding):
    """Rows [start, start + P) of the table; other tokens look up zeros, then one all-reduce."""

    def __init__(self, vocab_size: int, hidden: int, rank: int, world: int) -> None:
        per = -(-vocab_size // world)
        super().__init__(per, hidden)
        self.start, self.vocab_size = rank * per, vocab_size

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        return _vocab_lookup(ids, self.start, self.num_embeddings, lambda i: F.embedding(i, self.weight))

    def around(self, inner: nn.Module) -> VocabParallelTable:
        """The same table kept packed in ``inner`` (a BlockQuantEmbedding)."""
        return VocabParallelTable(inner, self.start, self.num_embeddings)


class VocabParallelTable(nn.Module):
    """A vocab-parallel embedding whose shard ``inner`` keeps packed (a BlockQuantEmbedding)."""

    def __init__(self, inner: nn.Module, start: int, rows: int) -> None:
        super().__init__()
        self.inner, self.start, self.rows = inner, start, rows

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        return _vocab_lookup(ids, self.start, self.rows, self.inner)


class ScaledVocabParallelEmbedding(VocabParallelEmbedding):
    """Gemma 3's table (models/gemma3.ScaledEmbedding) by vocabulary: the summed row times the scale rounded
    to the dtype, as the whole table's lookup does (adding the other ranks' zeros is exact)."""

    def __init__(self, vocab_size: int, hidden: int, rank: int, world: int, scale: float) -> None:
        super().__init__(vocab_size, hidden, rank, world)
        self.scale = scale

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        x = super().forward(ids)
        return x * rounded(self.scale, x.dtype)


class VocabParallelLMHead(nn.Linear):
    """Logits of vocabulary rows [start, start + P); all-gathered to (rows, V)."""

    def __init__(self, hidden: int, vocab_size: int, world: int) -> None:
        super().__init__(hidden, -(-vocab_size // world), bias=False)
        self.vocab_size = vocab_size

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return all_gather_last(F.linear(x, self.weight))[..., : self.vocab_size]

    def around(self, inner: nn.Module) -> GatheredLogits:
        """The same head kept packed in ``inner`` (a BlockQuantLinear)."""
        return GatheredLogits(inner, self.vocab_size)


class GatheredLogits(nn.Module):
    """A vocab-parallel LM head whose shard ``inner`` keeps packed: its logits all-gathered to (rows, V)."""

    def __init__(self, inner: nn.Module, vocab_size: int) -> None:
        super().__init__()
        self.inner, self.vocab_size = inner, vocab_size

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return all_gather_last(self.inner(x))[..., : self.vocab_size]


def check_tp(cfg: ModelConfig, world: int) -> None:
    """ValueError naming what tensor parallelism over ``world`` ranks cannot run for this model."""
    if world == 1:
        return
    family = FAMILIES.get(cfg.architecture)
    if family is None or not family.tensor_parallel:
        built = sorted(a for a, f in FAMILIES.items() if f.tensor_parallel)
        raise ValueError(
            f"--tensor-parallel-size {world}: {cfg.architecture} has no tensor-parallel split yet "
            f"(built for {', '.join(built)})"
        )
    widths = {"FFN width": cfg.intermediate_size}
    if any(cfg.layer_moe):
        widths["expert FFN width"] = cfg.moe_intermediate_size
        widths["shared expert FFN width"] = cfg.shared_expert_intermediate_size
    if cfg.num_heads % world:
        raise ValueError(f"--tensor-parallel-size {world} must divide the model's {cfg.num_heads} heads")
    for kv in sorted({cfg.kv_shape(i)[0] for i in range(cfg.num_layers)}):
        if kv % world and world % kv:
            raise ValueError(
                f"--tensor-parallel-size {world} and the model's {kv} KV heads: one must divide the other"
            )
    for what, width in widths.items():
        if width % world:
            raise ValueError(f"--tensor-parallel-size {world} must divide the model's {what} {width}")


def kv_heads_of(cfg: ModelConfig, rank: int, world: int, layer: int = 0) -> range:
    """The KV heads rank ``rank`` holds (of ``layer``'s: Gemma 4's full layers have fewer)."""
    kv = cfg.kv_shape(layer)[0]
    if kv >= world:
        per = kv // world
        return range(rank * per, (rank + 1) * per)
    head = rank // (world // kv)
    return range(head, head + 1)


def _split_mlp(mlp: LlamaMLP | Gemma3MLP, h: int, world: int, bias: bool, reduce: bool) -> None:
    """Gate/up by output rows, down by input columns (all-reduced after unless inside an MoE block)."""
    inter = mlp.intermediate // world
    mlp.gate_proj, mlp.up_proj = nn.Linear(h, inter, bias=bias), nn.Linear(h, inter, bias=bias)
    mlp.down_proj = (RowParallelLinear if reduce else nn.Linear)(inter, h, bias=bias)
    mlp.intermediate = inter


def apply_tp(model: CausalLM, rank: int, world: int) -> None:
    """Replace ``model``'s layers by this rank's parallel ones (on the meta device, before any weight is
    allocated: the loader then fills the shards)."""
    assert isinstance(model, LlamaForCausalLM | Gemma3ForCausalLM)
    cfg = model.config
    check_tp(cfg, world)
    h, hd = cfg.hidden_size, cfg.head_dim
    heads, kv_heads = cfg.num_heads // world, len(kv_heads_of(cfg, rank, world))
    for layer in model.model.layers:
        attn, mlp = layer.self_attn, layer.mlp
        assert isinstance(attn, LlamaAttention | Gemma3Attention)
        attn.num_heads, attn.num_kv_heads = heads, kv_heads
        attn.q_proj = nn.Linear(h, heads * hd, bias=cfg.qkv_bias)
        attn.k_proj = nn.Linear(h, kv_heads * hd, bias=cfg.qkv_bias)
        attn.v_proj = nn.Linear(h, kv_heads * hd, bias=cfg.qkv_bias)
        attn.o_proj = RowParallelLinear(heads * hd, h, bias=cfg.o_bias)
        if getattr(attn, "sinks", None) is not None:  # gpt-oss: one sink logit per q head
            attn.sinks = nn.Parameter(torch.empty(heads))
        if isinstance(mlp, LlamaMLP | Gemma3MLP):
            _split_mlp(mlp, h, world, cfg.mlp_bias, reduce=True)
            continue
        assert isinstance(mlp, SparseMoeBlock)
        old = mlp.experts
        # gpt-oss's biases: gate/up's split with their rows; down's added by rank 0 alone (_shard)
        bias = old.gate_up_proj_bias is not None
        mlp.experts = MoEExperts(old.num_experts, h, old.inter // world, old.glu, bias=bias)
        if isinstance(mlp.shared_expert, LlamaMLP):
            _split_mlp(mlp.shared_expert, h, world, cfg.mlp_bias, reduce=False)
        mlp.__class__ = RowParallelMoeBlock  # one all-reduce of the block's partial output
    # the loader places each expert's checkpoint rows by the model's expert width: this rank's
    model.config = dataclasses.replace(cfg, moe_intermediate_size=cfg.moe_intermediate_size // world)
    old_table = model.model.embed_tokens
    model.model.embed_tokens = (
        ScaledVocabParallelEmbedding(cfg.vocab_size, h, rank, world, old_table.scale)
        if isinstance(old_table, ScaledEmbedding)
        else VocabParallelEmbedding(cfg.vocab_size, h, rank, world)
    )
    model.lm_head = VocabParallelLMHead(h, cfg.vocab_size, world)
    if cfg.tie_word_embeddings:
        model.lm_head.weight = model.model.embed_tokens.weight


_LAYER = re.compile(r"\.layers\.(\d+)\.")
_ROWS = ("q_proj", "gate_proj", "up_proj", "w1", "w3")  # split by output rows (per expert too)
_COLS = ("o_proj", "down_proj", "w2")  # by input columns


def shard_plan(
    name: str, shape: list[int], cfg: ModelConfig, rank: int, world: int
) -> tuple[str, int, int, int]:
    """How rank ``rank`` reads tensor ``name``: ("rows" | "cols" | "whole" | "zeros" | "gate_up" | "cols3" |
    "rows3" (dim 1 of a 3-D tensor), start, end, padded rows)."""
    part = name.rsplit(".", 2)
    module, kind = (part[-2], part[-1]) if len(part) >= 2 else ("", name)
    if cfg.model_type == "gpt_oss" and module == "experts":  # stored as gpt-oss stores them
        return _gpt_oss_experts(kind, shape, rank, world)
    if kind == "sinks":  # (H,): this rank's q heads
        per = shape[0] // world
        return "rows", rank * per, (rank + 1) * per, per
    if len(shape) == 3 and kind == "gate_up_proj":  # fused experts (E, 2I, H): [gate | up] rows each
        per = shape[1] // 2 // world
        return "gate_up", rank * per, (rank + 1) * per, shape[1] // 2
    if len(shape) == 3 and kind == "down_proj":  # fused experts (E, H, I)
        per = shape[2] // world
        return "cols3", rank * per, (rank + 1) * per, 0
    if (
        len(shape) == 3 and kind == "weight"
    ):  # a GGUF file's stacked experts: gate/up (E, I, H), down (E, H, I)
        if module == "down_proj":
            per = shape[2] // world
            return "cols3", rank * per, (rank + 1) * per, 0
        if module in ("gate_proj", "up_proj"):
            per = shape[1] // world
            return "rows3", rank * per, (rank + 1) * per, per
    if ".experts." in name and kind == "bias" and len(shape) == 2:  # a GGUF file's stacked (E, I) / (E, H)
        if module == "down_proj":  # added once, after the all-reduce: rank 0's
            return ("whole" if rank == 0 else "zeros"), 0, 0, 0
        per = shape[1] // world
        return "cols", rank * per, (rank + 1) * per, 0
    if module in ("embed_tokens", "lm_head"):
        per = -(-cfg.vocab_size // world)
        return "rows", min(rank * per, shape[0]), min((rank + 1) * per, shape[0]), per
    if module in ("k_proj", "v_proj"):
        layer = int(m[1]) if (m := _LAYER.search(name)) else 0
        r, hd = kv_heads_of(cfg, rank, world, layer), cfg.kv_shape(layer)[1]
        return "rows", r.start * hd, r.stop * hd, len(r) * hd
    if module in _ROWS:
        per = shape[0] // world
        return "rows", rank * per, (rank + 1) * per, per
    if module in _COLS and kind == "weight":
        per = shape[1] // world
        return "cols", rank * per, (rank + 1) * per, 0
    return "whole", 0, 0, 0


def _gpt_oss_experts(kind: str, shape: list[int], rank: int, world: int) -> tuple[str, int, int, int]:
    """gpt-oss's experts as transformers stores them: ``gate_up_proj`` (E, H, 2I) with gate and up
    interleaved along 2I (this rank's I/N pairs are one run of columns), its bias (E, 2I) likewise,
    ``down_proj`` (E, I, H) by rows of I; ``down_proj_bias`` (E, H) added once: rank 0's, zeros elsewhere."""
    if kind == "gate_up_proj":
        per = shape[2] // world
        return "cols3", rank * per, (rank + 1) * per, 0
    if kind == "gate_up_proj_bias":
        per = shape[1] // world
        return "cols", rank * per, (rank + 1) * per, 0
    if kind == "down_proj":
        per = shape[1] // world
        return "cols", rank * per, (rank + 1) * per, 0  # dim 1 of (E, I, H)
    if kind == "down_proj_bias":
        return ("whole" if rank == 0 else "zeros"), 0, 0, 0
    return "whole", 0, 0, 0


def sharded_safetensors(
    model_dir: Path, cfg: ModelConfig, rank: int, world: int, skip: AbstractSet[str] = frozenset()
) -> Iterator[tuple[str, torch.Tensor]]:
    """(HF name, this rank's shard) of every tensor but those in ``skip`` (a quantized checkpoint's reader
    took them: quant/shards.py), each read with safetensors' ``get_slice`` (only the shard's bytes
    leave the file)."""
    sizes = fused_config(cfg)
    for path in weight_files(model_dir):
        with safe_open(str(path), framework="pt") as f:
            for name in f.keys():  # noqa: SIM118 (safe_open is not a dict)
                if name in skip:
                    continue
                sl = f.get_slice(name)
                fused = fused_rows(name, sizes)
                for part, start, end in fused or []:  # Phi-3's qkv/gate_up: each part's shard of its rows
                    how, a, b, _ = shard_plan(part, [end - start, *sl.get_shape()[1:]], cfg, rank, world)
                    assert how == "rows", f"{part}: a {how} split of a fused tensor"
                    yield part, sl[start + a : start + b]
                if fused:
                    continue
                how, a, b, rows = shard_plan(name, list(sl.get_shape()), cfg, rank, world)
                if how == "whole":
                    yield name, f.get_tensor(name)
                elif how == "zeros":
                    t = f.get_tensor(name)
                    yield name, torch.zeros_like(t)
                elif how == "cols":
                    yield name, sl[:, a:b]
                elif how == "cols3":
                    yield name, sl[:, :, a:b]
                elif how == "gate_up":  # rows is I: this rank's gate rows, then its up rows
                    yield name, torch.cat([sl[:, a:b], sl[:, rows + a : rows + b]], dim=1)
                else:
                    t = sl[a:b]
                    if t.shape[0] < rows:  # the last vocabulary shard: zero rows up to P
                        t = torch.cat([t, t.new_zeros((rows - t.shape[0], *t.shape[1:]))])
                    yield name, t
