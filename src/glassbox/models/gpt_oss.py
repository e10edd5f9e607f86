"""gpt-oss (``GptOssForCausalLM``): Llama-family layers (models/llama.py) with q/k/v/o biases, attention
sinks, alternating sliding-window / full layers, YaRN rope, and in every layer routed experts
(models/moe.py) with biases, top-k-then-softmax routing and the clamped SwiGLU.

What this file adds is the checkpoint's names and layouts (bf16/float32 checkpoints, as transformers
writes them): the router is ``mlp.router`` (glassbox's ``mlp.gate``), and the experts' matrices are
stored transposed, ``gate_up_proj`` (E, H, 2I) with gate and up interleaved along 2I and ``down_proj``
(E, I, H). glassbox holds them as (E, 2I, H) and (E, H, I), the layout of its other MoE families, with the
gate_up rows left interleaved (``ClampedSwiGLU`` reads them so): each checkpoint tensor is copied into a
transposed view of its parameter. GGUF files (models/gguf_names.py) hold the gate and up matrices apart,
untransposed: they fill the interleaved rows (models/moe.py ``stacked_slot``).
"""

from __future__ import annotations

import torch
from torch import nn

from glassbox.models.llama import LlamaForCausalLM

_TRANSPOSED = (".mlp.experts.gate_up_proj", ".mlp.experts.down_proj")


class GptOssForCausalLM(LlamaForCausalLM):
    def checkpoint_view(self, name: str, params: dict[str, nn.Parameter]) -> tuple[str, torch.Tensor] | None:
        name = name.replace(".mlp.router.", ".mlp.gate.")
        if name.endswith(_TRANSPOSED) and name in params:
            return name, params[name].transpose(1, 2)
        return super().checkpoint_view(name, params)  # GGUF files' stacked experts among them
