"""Gemma 4's decoder layer with Hugging Face parameter names (models/gemma4.py stacks them; what the
config says: models/gemma4_facts.py).

One layer: x += post_attn_norm(attention(input_norm(x))); h = mlp(pre_ffn_norm(x)); with experts,
h = post_ffn_norm_1(h) + post_ffn_norm_2(experts(pre_ffn_norm_2(x))), routed by the router over x;
x += post_ffn_norm(h); with per-layer inputs p, x += post_per_layer_norm(proj(act(gate(x)) * p));
x *= layer_scalar. Norms are RMSNorms applied in float32 with a plain weight (not Gemma 3's 1 + w).
"""

from __future__ import annotations

import torch
from torch import nn

from glassbox.layers.activation import get_activation
from glassbox.layers.attention import AttentionMetadata, paged_attention, write_kv
from glassbox.layers.rotary import RotaryEmbedding
from glassbox.models.llama import LlamaMLP
from glassbox.models.model_config import ModelConfig
from glassbox.models.moe import MoEExperts, RouterLinear, gated, route
from glassbox.quant.dense.onednn import concat_linears

Rope = tuple[torch.Tensor, torch.Tensor]  # (cos, sin), each (T, 1, head_dim), from RotaryEmbedding.cos_sin
KV = tuple[torch.Tensor, torch.Tensor]  # this step's K and V, each (T, Hk, D), rotated and normed


class Gemma4RMSNorm(nn.Module):
    """x * (mean(x^2) + eps) ** -0.5 in float32, times the weight in float32 (none: ``scale=False``, v's
    and the router's norm), cast back: transformers' Gemma4RMSNorm, operation for operation."""

    def __init__(self, dim: int, eps: float, scale: bool = True) -> None:
        super().__init__()
        self.eps = eps
        self.weight = nn.Parameter(torch.ones(dim)) if scale else None

    def forward(self, x: torch.Tensor) -> torch.Tensor:  # (..., dim)
        h = x.float()
        h = h * torch.pow(h.pow(2).mean(-1, keepdim=True) + self.eps, -0.5)
        if self.weight is not None:
            h = h * self.weight.float()
        return h.to(x.dtype)


class Gemma4Attention(nn.Module):
    """q (normed, rotated) over the layer's own K/V (k normed and rotated, v normed; in full layers with
    ``attention_k_eq_v`` V is the K projection, before either norm), or over the K/V of the layer whose
    cache it shares (``owns_kv`` False: no k/v projections, nothing written). Scale 1."""

    def __init__(self, cfg: ModelConfig, rotary: RotaryEmbedding, layer: int) -> None:
        super().__init__()
        self.num_kv_heads, self.head_dim = cfg.kv_shape(layer)
        self.num_heads, h, eps, bias = cfg.num_heads, cfg.hidden_size, cfg.rms_norm_eps, cfg.qkv_bias
        q_dim, kv_dim = self.num_heads * self.head_dim, self.num_kv_heads * self.head_dim
        self.owns_kv = cfg.kv_owner(layer) == layer
        self.q_proj = nn.Linear(h, q_dim, bias=bias)
        self.q_norm = Gemma4RMSNorm(self.head_dim, eps)
        self.o_proj = nn.Linear(q_dim, h, bias=bias)
        self.k_eq_v = cfg.attention_k_eq_v and cfg.layer_mixers[layer] == "full"
        self.splits = [q_dim]
        if self.owns_kv:
            self.k_proj = nn.Linear(h, kv_dim, bias=bias)
            self.v_proj = None if self.k_eq_v else nn.Linear(h, kv_dim, bias=bias)
            self.k_norm = Gemma4RMSNorm(self.head_dim, eps)
            self.v_norm = Gemma4RMSNorm(self.head_dim, eps, scale=False)
            self.splits += [kv_dim] if self.k_eq_v else [kv_dim, kv_dim]
        self.rotary = [rotary]  # a list: the model owns the table, not each layer
        self.sliding_window = cfg.layer_windows[layer]
        self.qkv_proj: nn.Module | None = None  # set by fuse(): [q | k | v] (or [q | k]) along the output dim

    def fuse(self) -> None:
        if not self.owns_kv:
            return
        parts = [self.q_proj, self.k_proj] + ([] if self.v_proj is None else [self.v_proj])
        self.qkv_proj = concat_linears(*parts)
        del self.q_proj, self.k_proj, self.v_proj

    def forward(
        self,
        rope: Rope,
        x: torch.Tensor,  # (T, hidden) already normed
        kv_cache: torch.Tensor,  # (2, num_blocks, block_size, Hk, D): its own, or the one it shares
        meta: AttentionMetadata,
        shared: KV | None,  # the sharing layer's K/V of this step, where it reads another's cache
    ) -> tuple[torch.Tensor, KV]:  # (T, hidden), the K/V attended over
        t, rotary = x.shape[0], self.rotary[0]
        if self.qkv_proj is not None:
            parts = self.qkv_proj(x).split(self.splits, dim=-1)
        elif self.owns_kv:
            parts = (self.q_proj(x), self.k_proj(x), *(() if self.v_proj is None else (self.v_proj(x),)))
        else:
            parts = (self.q_proj(x),)
        q = self.q_norm(parts[0].reshape(t, self.num_heads, self.head_dim))  # (T, Hq, D)
        if shared is not None:
            k, v = shared
            q = rotary.rotate(q, *rope)
        else:
            k = parts[1].reshape(t, self.num_kv_heads, self.head_dim)  # (T, Hk, D)
            v = k if self.k_eq_v else parts[2].reshape(t, self.num_kv_heads, self.head_dim)
            v = self.v_norm(v)
            q, k = rotary(q, self.k_norm(k), *rope)
            write_kv(kv_cache, k, v, meta.slot_mapping)
        o = paged_attention(q, k, v, kv_cache, meta, 1.0, self.sliding_window)  # (T, Hq, D)
        return self.o_proj(o.reshape(t, self.num_heads * self.head_dim)), (k, v)


class Gemma4Router(nn.Module):
    """Top-k experts per token over rmsnorm(x) * scale / sqrt(hidden) (the norm without a weight): softmax in
    float32, top-k, renormalized to 1, each weight times its expert's ``per_expert_scale``."""

    def __init__(self, hidden: int, num_experts: int, top_k: int, eps: float) -> None:
        super().__init__()
        self.norm = Gemma4RMSNorm(hidden, eps, scale=False)
        self.proj = RouterLinear(hidden, num_experts, bias=False)  # stays in the model's dtype
        self.scale = nn.Parameter(torch.ones(hidden))
        self.per_expert_scale = nn.Parameter(torch.ones(num_experts))
        self.top_k, self.root = top_k, hidden**-0.5

    def forward(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:  # (T, H) -> weights, ids (T, k)
        weights, ids = route(self.proj(self.norm(x) * self.scale * self.root), self.top_k, renormalize=True)
        return (weights * self.per_expert_scale[ids]).to(x.dtype), ids


class Gemma4DecoderLayer(nn.Module):
    def __init__(self, cfg: ModelConfig, rotary: RotaryEmbedding, layer: int) -> None:
        super().__init__()
        h, eps = cfg.hidden_size, cfg.rms_norm_eps
        width = cfg.layer_intermediate[layer] if cfg.layer_intermediate else cfg.intermediate_size
        self.self_attn = Gemma4Attention(cfg, rotary, layer)
        self.mlp = LlamaMLP(cfg, width)
        self.input_layernorm = Gemma4RMSNorm(h, eps)
        self.post_attention_layernorm = Gemma4RMSNorm(h, eps)
        self.pre_feedforward_layernorm = Gemma4RMSNorm(h, eps)
        self.post_feedforward_layernorm = Gemma4RMSNorm(h, eps)
        self.layer_scalar = nn.Parameter(torch.ones(1))  # a buffer in transformers, stored in checkpoints
        self.router: Gemma4Router | None = None
        self.experts: MoEExperts | None = None
        if cfg.layer_moe and cfg.layer_moe[layer]:  # routed experts beside the dense MLP
            self.router = Gemma4Router(h, cfg.num_experts, cfg.experts_per_token, eps)
            self.experts = MoEExperts(cfg.num_experts, h, cfg.moe_intermediate_size, gated(cfg.hidden_act))
            self.post_feedforward_layernorm_1 = Gemma4RMSNorm(h, eps)
            self.post_feedforward_layernorm_2 = Gemma4RMSNorm(h, eps)
            self.pre_feedforward_layernorm_2 = Gemma4RMSNorm(h, eps)
        self.per_layer_input_size = p = cfg.per_layer_input_size
        if p:
            self.act = get_activation(cfg.hidden_act)
            self.per_layer_input_gate = nn.Linear(h, p, bias=False)
            self.per_layer_projection = nn.Linear(p, h, bias=False)
            self.post_per_layer_input_norm = Gemma4RMSNorm(h, eps)

    def forward(
        self,
        rope: Rope,
        x: torch.Tensor,  # (T, hidden)
        kv_cache: torch.Tensor,
        meta: AttentionMetadata,
        per_layer_input: torch.Tensor | None,  # (T, P): this layer's slice of the per-layer inputs
        shared: KV | None,
    ) -> tuple[torch.Tensor, KV]:  # (T, hidden), the K/V its attention read
        a, kv = self.self_attn(rope, self.input_layernorm(x), kv_cache, meta, shared)
        x = x + self.post_attention_layernorm(a)
        h = self.mlp(self.pre_feedforward_layernorm(x))
        if self.router is not None and self.experts is not None:
            weights, ids = self.router(x)
            e = self.experts(self.pre_feedforward_layernorm_2(x), ids, weights)
            h = self.post_feedforward_layernorm_1(h) + self.post_feedforward_layernorm_2(e)
        x = x + self.post_feedforward_layernorm(h)
        if per_layer_input is not None:
            g = self.act(self.per_layer_input_gate(x)) * per_layer_input
            x = x + self.post_per_layer_input_norm(self.per_layer_projection(g))
        return x * self.layer_scalar, kv
