"""CausalLM: what the engine calls on a model family's top module, whichever the family.

Each family file (models/llama.py, models/gemma3.py) subclasses it with Hugging Face's parameter names,
so that a checkpoint loads by name; the loader builds one through the class models/families.py names and
the engine never names the family.
"""

from __future__ import annotations

import torch
from torch import nn

from glassbox.layers.attention import AttentionMetadata
from glassbox.models.model_config import ModelConfig


class CausalLM(nn.Module):
    """A decoder with an ``lm_head`` over a ``model.embed_tokens`` table (HF names), run on the paged cache."""

    config: ModelConfig
    lm_head: nn.Linear

    def forward(
        self,
        input_ids: torch.Tensor,  # (T,) the batch's new tokens, decodes first
        positions: torch.Tensor,  # (T,)
        kv_caches: list[torch.Tensor],  # per layer (2, num_blocks, block_size, Hk, D)
        meta: AttentionMetadata,
    ) -> torch.Tensor:  # (T, hidden) final hidden states
        raise NotImplementedError

    def compute_logits(self, hidden: torch.Tensor) -> torch.Tensor:  # (S, hidden) -> (S, vocab) float32
        raise NotImplementedError

    def elementwise_modules(self) -> list[nn.Module]:
        """The modules whose forwards are chains of small elementwise kernels, for torch.compile on CUDA
        (attention stays outside: it mutates the cache and runs triton itself)."""
        raise NotImplementedError

    def fuse(self) -> None:
        """Rearrange weights for speed once the checkpoint is loaded by HF names (a no-op is valid)."""

    def checkpoint_view(self, name: str, params: dict[str, nn.Parameter]) -> tuple[str, torch.Tensor] | None:
        """(parameter name, the tensor a checkpoint tensor ``name`` is copied into: the parameter or a view
        of it), or None when the model has no place for it. ``params``: the model's, by name."""
        return (name, params[name]) if name in params else None

    def tie_weights(self) -> None:
        """Share the embedding table with the LM head (tied checkpoints store it once)."""
        embed = self.get_submodule("model.embed_tokens")
        assert isinstance(embed, nn.Embedding)
        self.lm_head.weight = embed.weight


def softcapped_logits(lm_head: nn.Module, hidden: torch.Tensor, cap: float | None) -> torch.Tensor:
    """(S, hidden) -> (S, vocab) float32 logits, soft-capped where ``cap`` is set: cap * tanh(logits / cap),
    each logit in (-cap, cap) (Gemma's final_logit_softcapping)."""
    logits = lm_head(hidden).float()
    return logits if cap is None else torch.tanh(logits / cap) * cap
