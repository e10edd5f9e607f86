"""Gemma 4 text decoder (Gemma4ForCausalLM, model_type gemma4_text; the text model of
Gemma4ForConditionalGeneration too) with Hugging Face parameter names. Its layer: models/gemma4_layers.py;
what its config says: models/gemma4_facts.py.

Around the layers:
- token embeddings times sqrt(hidden_size) rounded to the model dtype (Gemma 3's ScaledEmbedding);
- per-layer inputs (``per_layer_input_size`` P > 0): the token's row of a second table (num_layers x P wide,
  times sqrt(P)) plus the RMS-normed projection of its embedding (times hidden ** -0.5), both (T, L, P),
  summed and scaled by 2 ** -0.5; layer i reads slice i;
- one rotary table per layer kind, each over its own head dim (full layers: proportional rope);
- KV sharing: a layer whose ``kv_owner`` is another attends over that layer's cache and this step's K/V
  (the engine's cache list holds the owner's tensor at its index: engine/kv_caches.py);
- final logits soft-capped (cap * tanh(logits / cap)) where the config sets final_logit_softcapping.

No CPU-kernel forward (models/llama_native.py is Llama-only): on the CPU this runs on the PyTorch ops.
"""

from __future__ import annotations

import torch
from torch import nn

from glassbox.layers.attention import AttentionMetadata
from glassbox.layers.rotary import RotaryEmbedding
from glassbox.models.causal_lm import CausalLM, softcapped_logits
from glassbox.models.gemma3 import ScaledEmbedding
from glassbox.models.gemma4_layers import KV, Gemma4DecoderLayer, Gemma4RMSNorm
from glassbox.models.llama import LlamaMLP
from glassbox.models.model_config import ModelConfig
from glassbox.models.moe import checkpoint_slot


class Gemma4Model(nn.Module):
    def __init__(self, cfg: ModelConfig) -> None:
        super().__init__()
        h, n, p = cfg.hidden_size, cfg.num_layers, cfg.per_layer_input_size
        self.embed_tokens: nn.Embedding = ScaledEmbedding(
            cfg.vocab_size, h, cfg.embed_scale
        )  # or its TP shard
        self.per_layer_input_size = p
        if p:
            if cfg.per_layer_input_vocab < cfg.vocab_size:
                raise ValueError(
                    f"gemma4 vocab_size_per_layer_input {cfg.per_layer_input_vocab} < vocab_size "
                    f"{cfg.vocab_size}: tokens past it have no per-layer input (not run)"
                )
            self.embed_tokens_per_layer = ScaledEmbedding(cfg.per_layer_input_vocab, n * p, p**0.5)
            self.per_layer_model_projection = nn.Linear(h, n * p, bias=False)
            self.per_layer_projection_norm = Gemma4RMSNorm(p, cfg.rms_norm_eps)
        self.local = [w is not None for w in cfg.layer_windows]  # per layer: sliding (local) or full
        # one table per layer kind, over that kind's head dim
        dims = {local: cfg.kv_shape(i)[1] for i, local in enumerate(self.local)}
        self.rotary_global = RotaryEmbedding(dims.get(False, cfg.head_dim), cfg.max_positions, cfg.rope)
        self.rotary_local = RotaryEmbedding(
            dims.get(True, cfg.head_dim), cfg.max_positions, cfg.rope_local or cfg.rope
        )
        self.layers = nn.ModuleList(
            Gemma4DecoderLayer(cfg, self.rotary_local if local else self.rotary_global, i)
            for i, local in enumerate(self.local)
        )
        self.norm = Gemma4RMSNorm(h, cfg.rms_norm_eps)
        self.sources = [cfg.kv_owner(i) for i in range(n)]
        self.producers = {s for i, s in enumerate(self.sources) if s != i}  # layers whose K/V others read

    def per_layer_inputs(self, ids: torch.Tensor, x: torch.Tensor) -> torch.Tensor:  # -> (T, L, P)
        t, n, p = ids.shape[0], len(self.layers), self.per_layer_input_size
        token = self.embed_tokens_per_layer(ids).reshape(t, n, p)
        proj = self.per_layer_model_projection(x) * self.embed_tokens.embedding_dim**-0.5
        proj = self.per_layer_projection_norm(proj.reshape(t, n, p))
        return (proj + token) * 2**-0.5

    def forward(
        self,
        input_ids: torch.Tensor,  # (T,)
        positions: torch.Tensor,  # (T,)
        kv_caches: list[torch.Tensor],  # per layer; a sharing layer's entry is its owner's (unused here)
        meta: AttentionMetadata,
    ) -> torch.Tensor:  # (T, hidden)
        x = self.embed_tokens(input_ids)
        inputs = self.per_layer_inputs(input_ids, x) if self.per_layer_input_size else None
        # each kind's rows looked up once per forward, shared by that kind's layers
        ropes = {
            kind: rotary.cos_sin(positions, x.dtype)
            for kind, rotary in ((True, self.rotary_local), (False, self.rotary_global))
            if kind in self.local
        }
        produced: dict[int, KV] = {}
        for i, (local, layer) in enumerate(zip(self.local, self.layers, strict=True)):
            src = self.sources[i]
            shared = produced[src] if src != i else None
            per_layer = None if inputs is None else inputs[:, i]
            x, kv = layer(ropes[local], x, kv_caches[src], meta, per_layer, shared)
            if i in self.producers:
                produced[i] = kv
        return self.norm(x)


class Gemma4ForCausalLM(CausalLM):
    def __init__(self, cfg: ModelConfig) -> None:
        super().__init__()
        self.config = cfg
        self.model = Gemma4Model(cfg)
        self.lm_head = nn.Linear(cfg.hidden_size, cfg.vocab_size, bias=False)
        if cfg.tie_word_embeddings:
            self.tie_weights()
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
        return [m for m in self.modules() if isinstance(m, (Gemma4RMSNorm, RotaryEmbedding, LlamaMLP))]

    def checkpoint_view(self, name: str, params: dict[str, nn.Parameter]) -> tuple[str, torch.Tensor] | None:
        """A GGUF file's experts (``experts.gate_up_proj.weight``, models/gguf_names.py) fill transformers'
        parameters, named without the suffix; a checkpoint storing one tensor per expert
        (``experts.N.gate_proj.weight``: quantized ones, widened) fills that expert's rows of them."""
        if name.endswith((".experts.gate_up_proj.weight", ".experts.down_proj.weight")):
            name = name.removesuffix(".weight")
        slot = checkpoint_slot(name, self.config.moe_intermediate_size)
        if slot is not None and slot[0] in params:
            target, e, rows = slot
            return target, params[target][e, rows]
        return super().checkpoint_view(name, params)

    def fuse(self) -> None:
        """Fuse q/k/v and gate/up projections; experts held as stored become linears."""
        for layer in self.model.layers:
            assert isinstance(layer, Gemma4DecoderLayer)
            layer.self_attn.fuse()
            layer.mlp.fuse()
            if layer.experts is not None:
                layer.experts.fuse()
