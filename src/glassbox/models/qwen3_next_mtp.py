"""Qwen3-Next / Qwen3.5's multi-token-prediction (MTP) head with the checkpoint's names (``mtp.*``), a
speculative proposer's model (engine/mtp_proposer.py).

At position t, with h_t the target model's last hidden state there (after its final norm) and x_{t+1} the
token that followed:

    u_t = fc([norm_e(embed(x_{t+1})) | norm_h(h_t)])        fc: (2 * hidden) -> hidden, no bias
    g_t = norm(layer(u_t))                                  one full-attention decoder layer of the model
    logits of x_{t+2} = lm_head(g_t)                        embed and lm_head shared with the model

(vLLM's qwen3_next_mtp: the embedding first in the concat). The layer's attention reads the MTP's own K/V
of positions <= t (``MtpCache``: one sequence's dense K/V, not paged). Drafts after the first feed g_t back
as the next position's hidden state. Only one MTP layer (every published checkpoint has one).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import replace

import torch
import torch.nn.functional as F
from torch import nn

from glassbox.layers.gated_attention import GatedAttention, Rope
from glassbox.layers.norm import GemmaRMSNorm
from glassbox.layers.rotary import RotaryEmbedding
from glassbox.models.model_config import ModelConfig

MIN_CAPACITY = 64  # positions an MtpCache holds at first; it doubles when full


class MtpCache:
    """One sequence's MTP K/V: rows [first, length) hold positions first..length-1 (rows before ``first``:
    positions whose target hidden states never ran, a prefix-cache hit; not attended); rows past ``length``
    are scratch."""

    def __init__(self, num_kv_heads: int, head_dim: int, dtype: torch.dtype, device: torch.device) -> None:
        self.k = torch.empty(MIN_CAPACITY, num_kv_heads, head_dim, dtype=dtype, device=device)
        self.v = torch.empty_like(self.k)
        self.length = 0  # positions whose K/V are final (the sequence's committed tokens)
        self.first = 0  # the first position attended

    def reserve(self, end: int) -> None:
        """Room for positions < ``end``."""
        cap = self.k.shape[0]
        if end <= cap:
            return
        while cap < end:
            cap *= 2
        k = self.k.new_empty(cap, *self.k.shape[1:])
        v = self.v.new_empty(cap, *self.v.shape[1:])
        k[: self.k.shape[0]] = self.k
        v[: self.v.shape[0]] = self.v
        self.k, self.v = k, v

    @property
    def nbytes(self) -> int:
        return self.k.numel() * self.k.element_size() * 2


def dense_gated_attention(
    attn: GatedAttention, rope: Rope, x: torch.Tensor, cache: MtpCache, start: int
) -> torch.Tensor:
    """``attn``'s computation for rows at positions start..start+T-1 of one sequence (x: (T, hidden)
    normed), their K/V written to ``cache`` there, each row attending to positions <= its own."""
    t, d = x.shape[0], attn.head_dim
    q, gate = attn.q_proj(x).view(t, attn.num_heads, 2 * d).split([d, d], dim=-1)  # each (T, Hq, D)
    k = attn.k_norm(attn.k_proj(x).view(t, attn.num_kv_heads, d))
    v = attn.v_proj(x).view(t, attn.num_kv_heads, d)
    q, k = attn.rotary[0](attn.q_norm(q), k, *rope)
    end = start + t
    cache.reserve(end)
    cache.k[start:end] = k
    cache.v[start:end] = v
    group = attn.num_heads // attn.num_kv_heads
    keys = cache.k[:end].repeat_interleave(group, dim=1).transpose(0, 1)  # (Hq, end, D)
    vals = cache.v[:end].repeat_interleave(group, dim=1).transpose(0, 1)
    pos = torch.arange(start, end, device=x.device)
    cols = torch.arange(end, device=x.device)[None, :]
    mask = (cols <= pos[:, None]) & (cols >= cache.first)  # (T, end)
    o = F.scaled_dot_product_attention(
        q.transpose(0, 1).to(keys.dtype), keys, vals, attn_mask=mask, scale=attn.scale
    )  # (Hq, T, D)
    o = o.transpose(0, 1).to(x.dtype)
    return attn.o_proj((o * torch.sigmoid(gate)).reshape(t, attn.num_heads * d))


class Qwen3NextMtp(nn.Module):
    """The ``mtp.*`` modules: fc, the two pre-fc norms, ``layers`` (one full-attention decoder layer whose
    MLP is an MoE where the model's layer 0 is one), the final norm."""

    def __init__(
        self,
        cfg: ModelConfig,
        rotary: RotaryEmbedding,
        decoder_layer: Callable[[ModelConfig, RotaryEmbedding, int], nn.Module],  # the model's layer class
    ) -> None:
        super().__init__()
        spec = cfg.hybrid
        assert spec is not None
        h, eps = cfg.hidden_size, cfg.rms_norm_eps
        self.fc = nn.Linear(2 * h, h, bias=False)
        self.pre_fc_norm_embedding = GemmaRMSNorm(h, eps)
        self.pre_fc_norm_hidden = GemmaRMSNorm(h, eps)
        layer_cfg = replace(cfg, hybrid=replace(spec, layer_mixers=("full",)), layer_moe=cfg.layer_moe[:1])
        self.layers = nn.ModuleList([decoder_layer(layer_cfg, rotary, 0)])
        self.norm = GemmaRMSNorm(h, eps)
        self.rotary = [rotary]  # a list: the model owns the table

    def forward(
        self,
        embeds: torch.Tensor,  # (T, hidden): embed(x_{t+1}) of each row
        hidden: torch.Tensor,  # (T, hidden): h_t, the target's (or the previous draft's g) at each row
        start: int,  # the first row's position t; rows are consecutive positions of one sequence
        cache: MtpCache,
    ) -> torch.Tensor:  # (T, hidden): g_t, normed (the LM head's input)
        u = torch.cat([self.pre_fc_norm_embedding(embeds), self.pre_fc_norm_hidden(hidden)], dim=-1)
        x = self.fc(u)
        positions = torch.arange(start, start + x.shape[0], device=x.device)
        rope = self.rotary[0].cos_sin(positions, x.dtype)
        layer = self.layers[0]
        attn, mlp = layer.get_submodule("self_attn"), layer.get_submodule("mlp")
        assert isinstance(attn, GatedAttention)
        x = x + dense_gated_attention(attn, rope, layer.get_submodule("input_layernorm")(x), cache, start)
        x = x + mlp(layer.get_submodule("post_attention_layernorm")(x))
        return self.norm(x)
