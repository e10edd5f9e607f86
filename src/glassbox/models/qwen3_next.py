"""Qwen3-Next and Qwen3.5 text decoders (Qwen3NextForCausalLM, Qwen3_5ForCausalLM, Qwen3_5MoeForCausalLM)
with Hugging Face's parameter names: hybrid models whose layers are Gated DeltaNet (``linear_attn``,
layers/gated_deltanet.py, a recurrent state per sequence) or gated full attention (``self_attn``,
layers/gated_attention.py, paged KV), as ``layer_types`` says (3 : 1 in the published models); each
followed by a gated MLP or a routed MoE with a sigmoid-gated shared expert (models/moe.py). Norms are
(1 + w) RMSNorms in float32 (layers/norm.GemmaRMSNorm), as transformers' Qwen3NextRMSNorm.

The forward takes, per layer, the KV cache of an attention layer or the state rows of a linear one
(engine/torch_executor.py allocates both), and ``meta.state`` (the step's state slots). A multimodal
Qwen3.5 checkpoint loads its text model: ``model.language_model.*`` read as ``model.*``, the vision tower
(``model.visual.*``) ignored, said once; the MTP layers (``mtp.*``) are loaded only for the "mtp"
speculative method (``cfg.with_mtp``; models/qwen3_next_mtp.py).
"""

from __future__ import annotations

import logging

import torch
from torch import nn

from glassbox.layers.attention import AttentionMetadata
from glassbox.layers.gated_attention import GatedAttention, Rope
from glassbox.layers.gated_deltanet import GatedDeltaNet
from glassbox.layers.norm import GemmaRMSNorm
from glassbox.layers.rotary import RotaryEmbedding
from glassbox.models.causal_lm import CausalLM
from glassbox.models.llama import LlamaMLP
from glassbox.models.model_config import ModelConfig
from glassbox.models.moe import SparseMoeBlock, checkpoint_name, checkpoint_slot, stacked_slot
from glassbox.models.qwen3_next_mtp import Qwen3NextMtp

logger = logging.getLogger(__name__)

TEXT_PREFIX = "model.language_model."  # a multimodal Qwen3.5 checkpoint's text model
IGNORED_PREFIXES = ("model.visual.", "visual.", "mtp.", "model.mtp.")
MTP_PREFIXES = ("mtp.", "model.mtp.")  # read where the model is built with its MTP head (cfg.with_mtp)


class Qwen3NextDecoderLayer(nn.Module):
    def __init__(self, cfg: ModelConfig, rotary: RotaryEmbedding, layer: int) -> None:
        super().__init__()
        spec = cfg.hybrid
        assert spec is not None and spec.gdn is not None
        h, eps = cfg.hidden_size, cfg.rms_norm_eps
        self.linear = spec.layer_mixers[layer] == "linear"
        if self.linear:
            self.linear_attn = GatedDeltaNet(spec.gdn, h, eps)
        else:
            self.self_attn = GatedAttention(
                h, cfg.num_heads, cfg.num_kv_heads, cfg.head_dim, eps, rotary, bias=cfg.qkv_bias
            )
        self.mlp: LlamaMLP | SparseMoeBlock = LlamaMLP(cfg)
        if cfg.layer_moe and cfg.layer_moe[layer]:
            shared = cfg.shared_expert_intermediate_size
            self.mlp = SparseMoeBlock(
                h,
                cfg.num_experts,
                cfg.experts_per_token,
                cfg.moe_intermediate_size,
                cfg.hidden_act,
                cfg.norm_topk_prob,
                LlamaMLP(cfg, shared) if shared else None,
                shared_gated=bool(shared),
            )
        self.input_layernorm = GemmaRMSNorm(h, eps)
        self.post_attention_layernorm = GemmaRMSNorm(h, eps)

    def forward(
        self, rope: Rope, x: torch.Tensor, cache: torch.Tensor, meta: AttentionMetadata
    ) -> torch.Tensor:
        h = self.input_layernorm(x)  # (T, hidden)
        if self.linear:
            assert meta.state is not None, "a hybrid model's step needs its state layout (meta.state)"
            h = self.linear_attn(h, cache, meta.state)
        else:
            h = self.self_attn(rope, h, cache, meta)
        x = x + h
        return x + self.mlp(self.post_attention_layernorm(x))


class Qwen3NextModel(nn.Module):
    def __init__(self, cfg: ModelConfig) -> None:
        super().__init__()
        self.embed_tokens = nn.Embedding(cfg.vocab_size, cfg.hidden_size)
        # rotary on the first partial_rotary_factor of each head (rope["partial_rotary_factor"])
        self.rotary_emb = RotaryEmbedding(cfg.head_dim, cfg.max_positions, cfg.rope)
        self.layers = nn.ModuleList(
            Qwen3NextDecoderLayer(cfg, self.rotary_emb, i) for i in range(cfg.num_layers)
        )
        self.norm = GemmaRMSNorm(cfg.hidden_size, cfg.rms_norm_eps)

    def forward(
        self,
        input_ids: torch.Tensor,
        positions: torch.Tensor,
        caches: list[torch.Tensor],
        meta: AttentionMetadata,
    ) -> torch.Tensor:  # (T,) -> (T, hidden)
        x = self.embed_tokens(input_ids)
        rope = self.rotary_emb.cos_sin(positions, x.dtype)
        for layer, cache in zip(self.layers, caches, strict=True):
            x = layer(rope, x, cache, meta)
        return self.norm(x)


class Qwen3NextForCausalLM(CausalLM):
    def __init__(self, cfg: ModelConfig) -> None:
        super().__init__()
        self.config = cfg
        self.model = Qwen3NextModel(cfg)
        self.lm_head = nn.Linear(cfg.hidden_size, cfg.vocab_size, bias=False)
        if cfg.tie_word_embeddings:
            self.tie_weights()
        self._said_vision = False
        if cfg.with_mtp:  # --speculative-config "mtp" (models/qwen3_next_mtp.py, engine/mtp_proposer.py)
            self.mtp = Qwen3NextMtp(cfg, self.model.rotary_emb, Qwen3NextDecoderLayer)

    def forward(
        self,
        input_ids: torch.Tensor,
        positions: torch.Tensor,
        kv_caches: list[torch.Tensor],  # per layer: KV (attention) or state rows (linear)
        meta: AttentionMetadata,
    ) -> torch.Tensor:
        return self.model(input_ids, positions, kv_caches, meta)

    def compute_logits(self, hidden: torch.Tensor) -> torch.Tensor:  # (S, hidden) -> (S, vocab) float32
        return self.lm_head(hidden).float()

    def elementwise_modules(self) -> list[nn.Module]:
        return [m for m in self.modules() if isinstance(m, (GemmaRMSNorm, LlamaMLP))]

    def fuse(self) -> None:
        """Fuse the MLPs' gate/up projections (after the checkpoint is loaded by HF names)."""
        mtp = getattr(self, "mtp", None)
        for layer in [*self.model.layers, *(mtp.layers if mtp is not None else [])]:
            assert isinstance(layer, Qwen3NextDecoderLayer)
            if isinstance(layer.mlp, LlamaMLP):
                layer.mlp.fuse()
                continue
            layer.mlp.experts.fuse()
            if isinstance(layer.mlp.shared_expert, LlamaMLP):
                layer.mlp.shared_expert.fuse()

    def checkpoint_view(self, name: str, params: dict[str, nn.Parameter]) -> tuple[str, torch.Tensor] | None:
        """A multimodal checkpoint's text tensors by their text-model names; per-expert and stacked (GGUF)
        expert tensors into their rows of the fused expert parameters."""
        if self.config.with_mtp and name.startswith(MTP_PREFIXES):
            name = name[name.index("mtp.") :]  # a multimodal checkpoint's model.mtp.* too
        elif name.startswith(IGNORED_PREFIXES):
            if "visual." in name and not self._said_vision:
                logger.info("a multimodal checkpoint: its text model is loaded, the vision tower ignored")
                self._said_vision = True
            return None
        if name.startswith(TEXT_PREFIX):
            name = "model." + name[len(TEXT_PREFIX) :]
        if not self.config.layer_moe:
            return super().checkpoint_view(name, params)
        slot = checkpoint_slot(name, self.config.moe_intermediate_size)
        if slot is not None and slot[0] in params:
            target, e, rows = slot
            return target, params[target][e, rows]
        stacked = stacked_slot(name, params, self.config.moe_intermediate_size, False)
        if stacked is not None:
            return stacked
        return super().checkpoint_view(checkpoint_name(name), params)
