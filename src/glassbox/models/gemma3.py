"""Gemma 3 text decoder (Gemma3ForCausalLM, model_type gemma3_text) with Hugging Face parameter names.

What sets it apart from the Llama family (models/llama.py):
- token embeddings times sqrt(hidden_size), that factor first rounded to the model dtype;
- (1 + w) RMSNorms taken in float32 (layers/norm.py GemmaRMSNorm): four per layer, around both the
  attention and the MLP (input, post-attention, pre-feedforward, post-feedforward), and per head on q, k;
- local (sliding-window) and global layers as ``layer_types`` says, each kind with its own rotary table:
  local layers rope_local (their own base, unscaled), global layers rope (theta and scaling);
- attention scale query_pre_attn_scalar ** -0.5; a GeGLU MLP (gelu, tanh approximation);
- final logits soft-capped (cap * tanh(logits / cap)) where the config sets final_logit_softcapping.

attn_logit_softcapping is not applied: transformers' Gemma 3 stores it and never passes it to attention
(Gemma 3 replaced Gemma 2's soft-capping with the q/k norms), and every published config leaves it unset.
No CPU-kernel forward (models/llama_native.py is Llama-only): on the CPU this runs on the PyTorch ops.
"""

from __future__ import annotations

import functools
import logging

import torch
from torch import nn

from glassbox.layers.activation import get_activation
from glassbox.layers.attention import AttentionMetadata, paged_attention, write_kv
from glassbox.layers.norm import GemmaRMSNorm
from glassbox.layers.rotary import RotaryEmbedding
from glassbox.models.causal_lm import CausalLM, softcapped_logits
from glassbox.models.model_config import ModelConfig
from glassbox.quant.dense.onednn import concat_linears

logger = logging.getLogger(__name__)

Rope = tuple[torch.Tensor, torch.Tensor]  # (cos, sin), each (T, 1, rotary_dim), from RotaryEmbedding.cos_sin


class Gemma3Attention(nn.Module):
    def __init__(self, cfg: ModelConfig, rotary: RotaryEmbedding, layer: int) -> None:
        super().__init__()
        self.num_heads, self.num_kv_heads, self.head_dim = cfg.num_heads, cfg.num_kv_heads, cfg.head_dim
        h, q_dim, kv_dim = cfg.hidden_size, cfg.num_heads * cfg.head_dim, cfg.num_kv_heads * cfg.head_dim
        self.q_proj = nn.Linear(h, q_dim, bias=cfg.qkv_bias)
        self.k_proj = nn.Linear(h, kv_dim, bias=cfg.qkv_bias)
        self.v_proj = nn.Linear(h, kv_dim, bias=cfg.qkv_bias)
        self.o_proj = nn.Linear(q_dim, h, bias=cfg.o_bias)
        self.q_norm = GemmaRMSNorm(self.head_dim, cfg.rms_norm_eps)
        self.k_norm = GemmaRMSNorm(self.head_dim, cfg.rms_norm_eps)
        self.rotary = [rotary]  # a list: the model owns the table, not each layer
        self.scale = cfg.attn_scale
        self.sliding_window = cfg.layer_windows[layer]
        self.qkv_proj: nn.Module | None = None  # set by fuse(): [q | k | v] along the output dim

    def fuse(self) -> None:
        self.qkv_proj = concat_linears(self.q_proj, self.k_proj, self.v_proj)
        del self.q_proj, self.k_proj, self.v_proj

    def forward(
        self,
        rope: Rope,
        x: torch.Tensor,  # (T, hidden) already normed
        kv_cache: torch.Tensor,  # (2, num_blocks, block_size, Hk, D)
        meta: AttentionMetadata,
    ) -> torch.Tensor:  # (T, hidden)
        t = x.shape[0]
        nq, nk = self.num_heads * self.head_dim, self.num_kv_heads * self.head_dim
        if self.qkv_proj is not None:
            q, k, v = self.qkv_proj(x).split([nq, nk, nk], dim=-1)
        else:
            q, k, v = self.q_proj(x), self.k_proj(x), self.v_proj(x)
        q = self.q_norm(q.reshape(t, self.num_heads, self.head_dim))  # (T, Hq, D), normed per head
        k = self.k_norm(k.reshape(t, self.num_kv_heads, self.head_dim))  # (T, Hk, D)
        v = v.reshape(t, self.num_kv_heads, self.head_dim)  # (T, Hk, D), not normed
        q, k = self.rotary[0](q, k, *rope)
        write_kv(kv_cache, k, v, meta.slot_mapping)
        o = paged_attention(q, k, v, kv_cache, meta, self.scale, self.sliding_window)  # (T, Hq, D)
        return self.o_proj(o.reshape(t, nq))


class Gemma3MLP(nn.Module):
    """down(act(gate(x)) * up(x)), act = gelu with the tanh approximation (hidden_activation)."""

    def __init__(self, cfg: ModelConfig) -> None:
        super().__init__()
        h, i, bias = cfg.hidden_size, cfg.intermediate_size, cfg.mlp_bias
        self.gate_proj = nn.Linear(h, i, bias=bias)
        self.up_proj = nn.Linear(h, i, bias=bias)
        self.down_proj = nn.Linear(i, h, bias=bias)
        self.act = get_activation(cfg.hidden_act)
        self.intermediate = i
        self.gate_up_proj: nn.Module | None = None  # set by fuse(): [gate | up] along the output dim

    def fuse(self) -> None:
        self.gate_up_proj = concat_linears(self.gate_proj, self.up_proj)
        del self.gate_proj, self.up_proj

    def forward(self, x: torch.Tensor) -> torch.Tensor:  # (T, hidden) -> (T, hidden)
        if self.gate_up_proj is not None:
            gate, up = self.gate_up_proj(x).split(self.intermediate, dim=-1)  # each (T, I)
        else:
            gate, up = self.gate_proj(x), self.up_proj(x)
        return self.down_proj(self.act(gate) * up)


class Gemma3DecoderLayer(nn.Module):
    def __init__(self, cfg: ModelConfig, rotary: RotaryEmbedding, layer: int) -> None:
        super().__init__()
        h, eps = cfg.hidden_size, cfg.rms_norm_eps
        self.self_attn = Gemma3Attention(cfg, rotary, layer)
        self.mlp = Gemma3MLP(cfg)
        self.input_layernorm = GemmaRMSNorm(h, eps)
        self.post_attention_layernorm = GemmaRMSNorm(h, eps)
        self.pre_feedforward_layernorm = GemmaRMSNorm(h, eps)
        self.post_feedforward_layernorm = GemmaRMSNorm(h, eps)

    def forward(
        self, rope: Rope, x: torch.Tensor, kv_cache: torch.Tensor, meta: AttentionMetadata
    ) -> torch.Tensor:  # x (T, hidden) -> (T, hidden)
        x = x + self.post_attention_layernorm(self.self_attn(rope, self.input_layernorm(x), kv_cache, meta))
        return x + self.post_feedforward_layernorm(self.mlp(self.pre_feedforward_layernorm(x)))


@functools.cache
def rounded(scale: float, dtype: torch.dtype) -> float:
    """``scale`` rounded to ``dtype``: exact in it, so that a product with it rounds once, like HF's."""
    return float(torch.tensor(scale, dtype=dtype).item())


class ScaledEmbedding(nn.Embedding):
    """An embedding table whose rows are multiplied by ``scale`` rounded to the table's dtype (as HF does:
    in bf16, sqrt(3072) = 55.43 becomes 55.5)."""

    def __init__(self, num_embeddings: int, embedding_dim: int, scale: float) -> None:
        super().__init__(num_embeddings, embedding_dim)
        self.scale = scale

    def forward(self, input_ids: torch.Tensor) -> torch.Tensor:  # (T,) -> (T, hidden)
        x = super().forward(input_ids)
        return x * rounded(self.scale, x.dtype)


class Gemma3Model(nn.Module):
    def __init__(self, cfg: ModelConfig) -> None:
        super().__init__()
        self.embed_tokens = ScaledEmbedding(cfg.vocab_size, cfg.hidden_size, cfg.embed_scale)
        # one table per layer kind; both rotate the whole head (rotary_dim == head_dim)
        self.rotary_global = RotaryEmbedding(cfg.head_dim, cfg.max_positions, cfg.rope)
        self.rotary_local = RotaryEmbedding(cfg.head_dim, cfg.max_positions, cfg.rope_local or cfg.rope)
        self.local = [w is not None for w in cfg.layer_windows]  # per layer: sliding (local) or global
        self.layers = nn.ModuleList(
            Gemma3DecoderLayer(cfg, self.rotary_local if local else self.rotary_global, i)
            for i, local in enumerate(self.local)
        )
        self.norm = GemmaRMSNorm(cfg.hidden_size, cfg.rms_norm_eps)

    def forward(
        self,
        input_ids: torch.Tensor,  # (T,)
        positions: torch.Tensor,  # (T,)
        kv_caches: list[torch.Tensor],
        meta: AttentionMetadata,
    ) -> torch.Tensor:  # (T, hidden)
        x = self.embed_tokens(input_ids)
        # each kind's rows looked up once per forward, shared by that kind's layers
        ropes = {
            kind: rotary.cos_sin(positions, x.dtype)
            for kind, rotary in ((True, self.rotary_local), (False, self.rotary_global))
            if kind in self.local
        }
        for local, layer, cache in zip(self.local, self.layers, kv_caches, strict=True):
            x = layer(ropes[local], x, cache, meta)
        return self.norm(x)


class Gemma3ForCausalLM(CausalLM):
    def __init__(self, cfg: ModelConfig) -> None:
        super().__init__()
        self.config = cfg
        self.model = Gemma3Model(cfg)
        self.lm_head = nn.Linear(cfg.hidden_size, cfg.vocab_size, bias=False)
        if cfg.tie_word_embeddings:
            self.tie_weights()
        if cfg.attn_logit_softcapping is not None:
            logger.warning(
                "attn_logit_softcapping=%s is not applied (transformers' Gemma 3 does not apply it either)",
                cfg.attn_logit_softcapping,
            )
        self.softcap = cfg.final_logit_softcapping

    def forward(
        self,
        input_ids: torch.Tensor,
        positions: torch.Tensor,
        kv_caches: list[torch.Tensor],
        meta: AttentionMetadata,
    ) -> torch.Tensor:
        return self.model(input_ids, positions, kv_caches, meta)

    def compute_logits(self, hidden: torch.Tensor) -> torch.Tensor:  # (S, hidden) -> (S, vocab) float32
        return softcapped_logits(self.lm_head, hidden, self.softcap)

    def elementwise_modules(self) -> list[nn.Module]:
        return [m for m in self.modules() if isinstance(m, (GemmaRMSNorm, RotaryEmbedding, Gemma3MLP))]

    def fuse(self) -> None:
        """Fuse q/k/v and gate/up projections (after the checkpoint is loaded by HF names)."""
        for layer in self.model.layers:
            assert isinstance(layer, Gemma3DecoderLayer)
            layer.self_attn.fuse()
            layer.mlp.fuse()
