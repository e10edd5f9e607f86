"""Qwen3-Next / Qwen3.5's full attention with Hugging Face's names: paged attention whose output is gated.

q_proj yields, per head, [query (D) | gate (D)]; q and k get a (1 + w) RMSNorm per head (float32), rotary
on their first ``partial_rotary_factor`` of each head; the attention output times sigmoid(gate) goes
through o_proj.
"""

from __future__ import annotations

import torch
from torch import nn

from glassbox.layers.attention import AttentionMetadata, paged_attention, write_kv
from glassbox.layers.norm import GemmaRMSNorm
from glassbox.layers.rotary import RotaryEmbedding

Rope = tuple[torch.Tensor, torch.Tensor]  # (cos, sin), each (T, 1, rotary_dim)


class GatedAttention(nn.Module):
    def __init__(
        self,
        hidden: int,
        num_heads: int,
        num_kv_heads: int,
        head_dim: int,
        eps: float,
        rotary: RotaryEmbedding,
        bias: bool = False,
    ) -> None:
        super().__init__()
        self.num_heads, self.num_kv_heads, self.head_dim = num_heads, num_kv_heads, head_dim
        self.q_proj = nn.Linear(hidden, 2 * num_heads * head_dim, bias=bias)
        self.k_proj = nn.Linear(hidden, num_kv_heads * head_dim, bias=bias)
        self.v_proj = nn.Linear(hidden, num_kv_heads * head_dim, bias=bias)
        self.o_proj = nn.Linear(num_heads * head_dim, hidden, bias=bias)
        self.q_norm = GemmaRMSNorm(head_dim, eps)
        self.k_norm = GemmaRMSNorm(head_dim, eps)
        self.rotary = [rotary]  # a list: the model owns the table
        self.scale = head_dim**-0.5

    def forward(
        self,
        rope: Rope,
        x: torch.Tensor,  # (T, hidden) normed
        kv_cache: torch.Tensor,  # (2, num_blocks, block_size, Hk, D)
        meta: AttentionMetadata,
    ) -> torch.Tensor:  # (T, hidden)
        t, d = x.shape[0], self.head_dim
        q, gate = self.q_proj(x).view(t, self.num_heads, 2 * d).split([d, d], dim=-1)  # each (T, Hq, D)
        k = self.k_norm(self.k_proj(x).view(t, self.num_kv_heads, d))
        v = self.v_proj(x).view(t, self.num_kv_heads, d)
        q, k = self.rotary[0](self.q_norm(q), k, *rope)
        write_kv(kv_cache, k, v, meta.slot_mapping)
        o = paged_attention(q, k, v, kv_cache, meta, self.scale, None)  # (T, Hq, D)
        return self.o_proj((o * torch.sigmoid(gate)).reshape(t, self.num_heads * d))
