"""Llama-family decoder (Llama, Qwen2, Qwen3, Mistral; with routed experts (models/moe.py) in the layers
the config names: Mixtral, Qwen2-MoE, Qwen3-MoE; with attention sinks and gpt-oss's experts: gpt-oss,
models/gpt_oss.py) with Hugging Face parameter names."""

from __future__ import annotations

import torch
from torch import nn

from glassbox.layers.activation import get_activation
from glassbox.layers.attention import AttentionMetadata, paged_attention, write_kv
from glassbox.layers.norm import RMSNorm
from glassbox.layers.rotary import RotaryEmbedding
from glassbox.models.causal_lm import CausalLM
from glassbox.models.model_config import ModelConfig
from glassbox.models.moe import SparseMoeBlock, checkpoint_name, checkpoint_slot, stacked_slot
from glassbox.quant.dense.onednn import concat_linears


class LlamaAttention(nn.Module):
    def __init__(self, cfg: ModelConfig, rotary: RotaryEmbedding, layer: int) -> None:
        super().__init__()
        self.num_heads, self.num_kv_heads, self.head_dim = cfg.num_heads, cfg.num_kv_heads, cfg.head_dim
        h, bias = cfg.hidden_size, cfg.qkv_bias
        self.q_proj = nn.Linear(h, self.num_heads * self.head_dim, bias=bias)
        self.k_proj = nn.Linear(h, self.num_kv_heads * self.head_dim, bias=bias)
        self.v_proj = nn.Linear(h, self.num_kv_heads * self.head_dim, bias=bias)
        self.o_proj = nn.Linear(self.num_heads * self.head_dim, h, bias=cfg.o_bias)
        self.q_norm = RMSNorm(self.head_dim, cfg.rms_norm_eps) if cfg.qk_norm else None
        self.k_norm = RMSNorm(self.head_dim, cfg.rms_norm_eps) if cfg.qk_norm else None
        self.rotary = [rotary]  # a list so the shared table is not registered once per layer
        self.scale = self.head_dim**-0.5
        self.sliding_window = cfg.layer_windows[layer]
        # gpt-oss: a learned logit per query head in each softmax's denominator
        self.sinks = nn.Parameter(torch.empty(self.num_heads)) if cfg.attention_sinks else None
        self.qkv_proj: nn.Module | None = None  # set by fuse()

    def fuse(self) -> None:
        """Replace q/k/v projections with one matmul (weights concatenated along the output dim)."""
        self.qkv_proj = concat_linears(self.q_proj, self.k_proj, self.v_proj)
        del self.q_proj, self.k_proj, self.v_proj

    def forward(
        self,
        rope: tuple[torch.Tensor, torch.Tensor],
        x: torch.Tensor,
        kv_cache: torch.Tensor,
        meta: AttentionMetadata,
    ) -> torch.Tensor:
        t = x.shape[0]
        nq, nk = self.num_heads * self.head_dim, self.num_kv_heads * self.head_dim
        if self.qkv_proj is not None:
            q, k, v = self.qkv_proj(x).split([nq, nk, nk], dim=-1)
        else:
            q, k, v = self.q_proj(x), self.k_proj(x), self.v_proj(x)
        q = q.reshape(t, self.num_heads, self.head_dim)  # (T, Hq, D)
        k = k.reshape(t, self.num_kv_heads, self.head_dim)  # (T, Hk, D)
        v = v.reshape(t, self.num_kv_heads, self.head_dim)
        if self.q_norm is not None and self.k_norm is not None:
            q, k = self.q_norm(q), self.k_norm(k)
        q, k = self.rotary[0](q, k, *rope)
        write_kv(kv_cache, k, v, meta.slot_mapping)
        o = paged_attention(q, k, v, kv_cache, meta, self.scale, self.sliding_window, self.sinks)
        return self.o_proj(o.reshape(t, nq))


class LlamaMLP(nn.Module):
    def __init__(self, cfg: ModelConfig, intermediate: int | None = None) -> None:
        super().__init__()
        h, i, bias = cfg.hidden_size, intermediate or cfg.intermediate_size, cfg.mlp_bias
        self.gate_proj = nn.Linear(h, i, bias=bias)
        self.up_proj = nn.Linear(h, i, bias=bias)
        self.down_proj = nn.Linear(i, h, bias=bias)
        self.act = get_activation(cfg.hidden_act)
        self.gate_up_proj: nn.Module | None = None  # set by fuse()
        self.intermediate = i

    def fuse(self) -> None:
        self.gate_up_proj = concat_linears(self.gate_proj, self.up_proj)
        del self.gate_proj, self.up_proj

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.gate_up_proj is not None:
            gate, up = self.gate_up_proj(x).split(self.intermediate, dim=-1)
        else:
            gate, up = self.gate_proj(x), self.up_proj(x)
        return self.down_proj(self.act(gate) * up)


class LlamaDecoderLayer(nn.Module):
    def __init__(self, cfg: ModelConfig, rotary: RotaryEmbedding, layer: int) -> None:
        super().__init__()
        self.self_attn = LlamaAttention(cfg, rotary, layer)
        self.mlp: LlamaMLP | SparseMoeBlock = LlamaMLP(cfg)
        if cfg.layer_moe and cfg.layer_moe[layer]:
            shared = cfg.shared_expert_intermediate_size
            self.mlp = SparseMoeBlock(
                cfg.hidden_size,
                cfg.num_experts,
                cfg.experts_per_token,
                cfg.moe_intermediate_size,
                cfg.hidden_act,
                cfg.norm_topk_prob,
                LlamaMLP(cfg, shared) if shared else None,
                cfg.shared_expert_gated,
                router=cfg.moe_router,
                bias=cfg.moe_bias,
                swiglu=None if cfg.swiglu_limit is None else (cfg.swiglu_alpha, cfg.swiglu_limit),
            )
        self.input_layernorm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps)
        self.post_attention_layernorm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps)

    def forward(
        self,
        rope: tuple[torch.Tensor, torch.Tensor],
        x: torch.Tensor,
        kv_cache: torch.Tensor,
        meta: AttentionMetadata,
    ) -> torch.Tensor:
        x = x + self.self_attn(rope, self.input_layernorm(x), kv_cache, meta)
        return x + self.mlp(self.post_attention_layernorm(x))


class LlamaModel(nn.Module):
    def __init__(self, cfg: ModelConfig) -> None:
        super().__init__()
        self.embed_tokens = nn.Embedding(cfg.vocab_size, cfg.hidden_size)
        self.rotary_emb = RotaryEmbedding(cfg.head_dim, cfg.max_positions, cfg.rope)
        self.layers = nn.ModuleList(LlamaDecoderLayer(cfg, self.rotary_emb, i) for i in range(cfg.num_layers))
        self.norm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps)

    def forward(
        self,
        input_ids: torch.Tensor,  # (T,)
        positions: torch.Tensor,  # (T,)
        kv_caches: list[torch.Tensor],
        meta: AttentionMetadata,
    ) -> torch.Tensor:  # (T, hidden)
        x = self.embed_tokens(input_ids)
        rope = self.rotary_emb.cos_sin(positions, x.dtype)  # looked up once, shared by every layer
        for layer, cache in zip(self.layers, kv_caches, strict=True):
            x = layer(rope, x, cache, meta)
        return self.norm(x)


class LlamaForCausalLM(CausalLM):
    def __init__(self, cfg: ModelConfig) -> None:
        super().__init__()
        self.config = cfg
        self.model = LlamaModel(cfg)
        self.lm_head = nn.Linear(cfg.hidden_size, cfg.vocab_size, bias=False)
        if cfg.tie_word_embeddings:
            self.lm_head.weight = self.model.embed_tokens.weight

    def forward(
        self,
        input_ids: torch.Tensor,
        positions: torch.Tensor,
        kv_caches: list[torch.Tensor],
        meta: AttentionMetadata,
    ) -> torch.Tensor:
        return self.model(input_ids, positions, kv_caches, meta)

    def compute_logits(self, hidden: torch.Tensor) -> torch.Tensor:  # (S, hidden) -> (S, vocab) float32
        return self.lm_head(hidden).float()

    def elementwise_modules(self) -> list[nn.Module]:
        """The modules whose forwards are chains of small elementwise kernels, for torch.compile on CUDA
        (attention stays outside: it mutates the cache and runs triton itself)."""
        return [m for m in self.modules() if isinstance(m, (RMSNorm, RotaryEmbedding, LlamaMLP))]

    def fuse(self) -> None:
        """Fuse q/k/v and gate/up projections (after the checkpoint is loaded by HF names)."""
        for layer in self.model.layers:
            assert isinstance(layer, LlamaDecoderLayer)
            layer.self_attn.fuse()
            if isinstance(layer.mlp, LlamaMLP):
                layer.mlp.fuse()
                continue
            layer.mlp.experts.fuse()  # experts held as stored become linears (their biases now loaded)
            if isinstance(layer.mlp.shared_expert, LlamaMLP):
                layer.mlp.shared_expert.fuse()

    def checkpoint_view(self, name: str, params: dict[str, nn.Parameter]) -> tuple[str, torch.Tensor] | None:
        """MoE checkpoints: one expert's tensor fills its rows of the fused expert tensors."""
        if not self.config.layer_moe:
            return super().checkpoint_view(name, params)
        slot = checkpoint_slot(name, self.config.moe_intermediate_size)
        if slot is not None and slot[0] in params:
            target, e, rows = slot
            return target, params[target][e, rows]
        interleaved = self.config.swiglu_limit is not None  # gpt-oss's gate/up rows
        stacked = stacked_slot(name, params, self.config.moe_intermediate_size, interleaved)
        if stacked is not None:  # GGUF files' stacked experts
            return stacked
        return super().checkpoint_view(checkpoint_name(name), params)
