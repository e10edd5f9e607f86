"""Nemotron-H and Nemotron 3 (NemotronHForCausalLM) with Hugging Face's parameter names: one block per
layer, RMSNorm -> mixer -> residual, the mixer as ``hybrid_override_pattern`` lays them out: Mamba-2
(layers/mamba2.py, a recurrent state per sequence), attention (paged KV; no positional encoding: the Mamba
layers carry position), a squared-ReLU MLP or the routed (latent) MoE (models/nemotron_h_moe.py).

Checkpoints name the decoder ``backbone`` (``backbone.embeddings``, ``backbone.norm_f``); glassbox's module
is ``model`` with ``embed_tokens`` and ``norm`` (as transformers 5 renames them), and ``checkpoint_view``
maps the names. The MTP layers (``mtp.*``) are not loaded.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from glassbox.layers.attention import AttentionMetadata, paged_attention, write_kv
from glassbox.layers.mamba2 import Mamba2Mixer
from glassbox.models.causal_lm import CausalLM
from glassbox.models.model_config import ModelConfig
from glassbox.models.nemotron_h_moe import NemotronHMLP, NemotronHMoE, expert_slot

_RENAMES = (
    ("backbone.embeddings.", "model.embed_tokens."),
    ("backbone.norm_f.", "model.norm."),
    ("backbone.", "model."),
)


class Fp32WeightRMSNorm(nn.Module):
    """RMSNorm whose weight multiplies in float32 before the cast back (transformers' NemotronHRMSNorm)."""

    def __init__(self, dim: int, eps: float) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.ones(dim))
        self.eps = eps

    def forward(self, x: torch.Tensor) -> torch.Tensor:  # (..., dim)
        h = F.rms_norm(x.float(), (x.shape[-1],), eps=self.eps)
        return (self.weight.float() * h).to(x.dtype)


class NemotronHAttention(nn.Module):
    def __init__(self, cfg: ModelConfig) -> None:
        super().__init__()
        self.num_heads, self.num_kv_heads, self.head_dim = cfg.num_heads, cfg.num_kv_heads, cfg.head_dim
        h, q, kv = cfg.hidden_size, cfg.num_heads * cfg.head_dim, cfg.num_kv_heads * cfg.head_dim
        self.q_proj = nn.Linear(h, q, bias=False)
        self.k_proj = nn.Linear(h, kv, bias=False)
        self.v_proj = nn.Linear(h, kv, bias=False)
        self.o_proj = nn.Linear(q, h, bias=False)
        self.scale = cfg.head_dim**-0.5

    def forward(self, x: torch.Tensor, kv_cache: torch.Tensor, meta: AttentionMetadata) -> torch.Tensor:
        t = x.shape[0]
        q = self.q_proj(x).view(t, self.num_heads, self.head_dim)
        k = self.k_proj(x).view(t, self.num_kv_heads, self.head_dim)
        v = self.v_proj(x).view(t, self.num_kv_heads, self.head_dim)
        write_kv(kv_cache, k, v, meta.slot_mapping)
        o = paged_attention(q, k, v, kv_cache, meta, self.scale, None)  # (T, Hq, D)
        return self.o_proj(o.reshape(t, self.num_heads * self.head_dim))


class NemotronHBlock(nn.Module):
    def __init__(self, cfg: ModelConfig, layer: int) -> None:
        super().__init__()
        spec = cfg.hybrid
        assert spec is not None and spec.mamba is not None
        self.kind = spec.layer_mixers[layer]  # "mamba" | "full" | "none" (an MLP or MoE block)
        self.norm = Fp32WeightRMSNorm(cfg.hidden_size, spec.norm_eps)
        self.mixer: nn.Module
        if self.kind == "mamba":
            self.mixer = Mamba2Mixer(spec.mamba, cfg.hidden_size, spec.norm_eps)
        elif self.kind == "full":
            self.mixer = NemotronHAttention(cfg)
        elif cfg.layer_moe and cfg.layer_moe[layer]:
            self.mixer = NemotronHMoE(cfg, spec)
        else:
            self.mixer = NemotronHMLP(cfg.hidden_size, cfg.intermediate_size, spec.mlp_act, cfg.mlp_bias)

    def forward(self, x: torch.Tensor, cache: torch.Tensor, meta: AttentionMetadata) -> torch.Tensor:
        h = self.norm(x)
        if self.kind == "mamba":
            assert meta.state is not None, "a hybrid model's step needs its state layout (meta.state)"
            h = self.mixer(h, cache, meta.state)
        elif self.kind == "full":
            h = self.mixer(h, cache, meta)
        else:
            h = self.mixer(h)
        return x + h


class NemotronHModel(nn.Module):
    def __init__(self, cfg: ModelConfig) -> None:
        super().__init__()
        assert cfg.hybrid is not None
        self.embed_tokens = nn.Embedding(cfg.vocab_size, cfg.hidden_size)
        self.layers = nn.ModuleList(NemotronHBlock(cfg, i) for i in range(cfg.num_layers))
        self.norm = Fp32WeightRMSNorm(cfg.hidden_size, cfg.hybrid.norm_eps)

    def forward(
        self, input_ids: torch.Tensor, caches: list[torch.Tensor], meta: AttentionMetadata
    ) -> torch.Tensor:
        x = self.embed_tokens(input_ids)  # (T, hidden)
        for layer, cache in zip(self.layers, caches, strict=True):
            x = layer(x, cache, meta)
        return self.norm(x)


class NemotronHForCausalLM(CausalLM):
    def __init__(self, cfg: ModelConfig) -> None:
        super().__init__()
        self.config = cfg
        self.model = NemotronHModel(cfg)
        self.lm_head = nn.Linear(cfg.hidden_size, cfg.vocab_size, bias=False)
        if cfg.tie_word_embeddings:
            self.tie_weights()

    def forward(
        self,
        input_ids: torch.Tensor,
        positions: torch.Tensor,  # unused: no positional encoding
        kv_caches: list[torch.Tensor],  # per layer: KV (attention), state rows (Mamba) or empty
        meta: AttentionMetadata,
    ) -> torch.Tensor:
        return self.model(input_ids, kv_caches, meta)

    def compute_logits(self, hidden: torch.Tensor) -> torch.Tensor:  # (S, hidden) -> (S, vocab) float32
        return self.lm_head(hidden).float()

    def elementwise_modules(self) -> list[nn.Module]:
        return [m for m in self.modules() if isinstance(m, (Fp32WeightRMSNorm, NemotronHMLP))]

    def checkpoint_view(self, name: str, params: dict[str, nn.Parameter]) -> tuple[str, torch.Tensor] | None:
        """Checkpoint names (``backbone.*``) to glassbox's; per-expert tensors into the stacked experts."""
        if name.startswith(("mtp.", "model.mtp.")):
            return None
        for old, new in _RENAMES:
            if name.startswith(old):
                name = new + name[len(old) :]
                break
        slot = expert_slot(name, params)
        return slot if slot is not None else super().checkpoint_view(name, params)
