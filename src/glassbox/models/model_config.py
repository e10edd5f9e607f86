"""ModelConfig: what the model code needs, built from the model description (models/facts.py).

config.json is never read here: ModelFacts is the one reading of it, and this adds only the torch side
(the checkpoint's torch dtype) and the check that the engine has code for the architecture.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import torch

from glassbox.models.facts import ModelFacts
from glassbox.models.fused_parts import FUSED_MODEL_TYPES
from glassbox.models.hybrid_spec import HybridSpec
from glassbox.quant.blocks.ct_int_config import ct_int_spec
from glassbox.quant.config import group_quant
from glassbox.quant.fp8.config import fp8_spec

SUPPORTED_ARCHITECTURES = (
    "LlamaForCausalLM",
    "Qwen2ForCausalLM",
    "Qwen3ForCausalLM",
    "MistralForCausalLM",
    "Gemma3ForCausalLM",
    "MixtralForCausalLM",
    "Qwen2MoeForCausalLM",
    "Qwen3MoeForCausalLM",
    "GptOssForCausalLM",
    "Phi3ForCausalLM",
    # hybrid models (a recurrent-state cache beside the paged KV cache): models/qwen3_next.py, nemotron_h.py
    "Qwen3NextForCausalLM",
    "Qwen3_5ForCausalLM",
    "Qwen3_5MoeForCausalLM",
    "NemotronHForCausalLM",
)

# canonical dtype names (glassbox.dtypes) <-> torch
TORCH_DTYPES = {"fp32": torch.float32, "bf16": torch.bfloat16, "fp16": torch.float16}
# a KV cache may also be 8-bit (layers/kv_quant.py)
KV_TORCH_DTYPES = {**TORCH_DTYPES, "fp8": torch.float8_e4m3fn, "int8": torch.int8}


def dtype_name(dtype: torch.dtype) -> str:
    """The canonical name of a torch dtype ("bf16", ...)."""
    return next(name for name, d in KV_TORCH_DTYPES.items() if d == dtype)


@dataclass(frozen=True)
class ModelConfig:
    architecture: str
    model_type: str
    hidden_size: int
    num_layers: int
    num_heads: int
    num_kv_heads: int
    head_dim: int
    intermediate_size: int
    vocab_size: int
    rms_norm_eps: float
    max_position_embeddings: int
    tie_word_embeddings: bool
    qkv_bias: bool
    o_bias: bool
    mlp_bias: bool
    qk_norm: bool
    hidden_act: str
    layer_windows: tuple[int | None, ...]  # per layer: its sliding window, or None (full attention)
    torch_dtype: torch.dtype
    rope: dict[str, Any] = field(default_factory=dict)
    rope_local: dict[str, Any] = field(default_factory=dict)  # sliding layers' rope; {}: the same as rope
    attn_scale: float = 0.0  # softmax scale of q.k (from_facts: query_pre_attn_scalar or head_dim, ** -0.5)
    embed_scale: float = 1.0  # token embeddings times this (Gemma: sqrt(hidden_size), rounded to the dtype)
    final_logit_softcapping: float | None = None
    attn_logit_softcapping: float | None = None
    attention_sinks: bool = False  # a learned logit per query head joins each softmax's denominator (gpt-oss)
    # mixture of experts (models/moe.py): the layers whose FFN is routed, and its shape and rules
    layer_moe: tuple[bool, ...] = ()  # per layer; (): no MoE layer
    num_experts: int = 0
    experts_per_token: int = 0
    moe_intermediate_size: int = 0
    norm_topk_prob: bool = False
    shared_expert_intermediate_size: int = 0  # 0: no shared expert
    shared_expert_gated: bool = False
    moe_router: str = "softmax_topk"  # or "topk_softmax" (ModelFacts.moe_router)
    moe_bias: bool = False
    swiglu_limit: float | None = None  # gpt-oss's clamped SwiGLU experts (ModelFacts.swiglu_limit)
    swiglu_alpha: float = 1.702
    hybrid: HybridSpec | None = None  # recurrent mixers (ModelFacts.hybrid); None: attention only

    @classmethod
    def from_facts(cls, facts: ModelFacts, max_model_len: int | None = None) -> ModelConfig:
        """The engine's view of a model; ValueError when the engine cannot run its architecture.

        ``max_model_len`` (default: the model's own limit) picks LongRoPE's long factors where it passes
        the pre-training length (layers/rotary.py)."""
        if facts.architecture not in SUPPORTED_ARCHITECTURES:
            raise ValueError(
                f"architecture {facts.architecture or '(none)'!r} is not supported by the engine; "
                f"supported: {', '.join(SUPPORTED_ARCHITECTURES)}"
            )
        method = facts.quantization_config.get("quant_method", "?") if facts.quantization_config else None
        # gpt-oss's MXFP4 experts: quant/fp4/checkpoint.py; FP8 experts: quant/fp8/checkpoint.py; GPTQ/AWQ and
        # compressed-tensors integer experts: quant/expert_parts.py
        qc = facts.quantization_config
        held = method in (None, "mxfp4") or fp8_spec(qc) is not None or group_quant(qc) is not None
        if method is not None and facts.hybrid is not None:  # not checked against a reference yet
            raise ValueError(f"{method}-quantized hybrid ({facts.model_type}) checkpoints are not read yet")
        if method is not None and facts.model_type in FUSED_MODEL_TYPES:  # their readers do not cut yet
            raise ValueError(f"{method}-quantized {facts.model_type} checkpoints are not read yet")
        if facts.is_moe and not (held or ct_int_spec(qc) is not None):
            raise ValueError(f"quantized ({method}) mixture-of-experts checkpoints are not supported yet")
        # HF's default for a config that names no dtype is float32
        dtype = TORCH_DTYPES[facts.dtype] if facts.dtype_declared else torch.float32
        return cls(
            architecture=facts.architecture,
            model_type=facts.model_type,
            hidden_size=facts.hidden_size,
            num_layers=facts.num_layers,
            num_heads=facts.num_heads,
            num_kv_heads=facts.num_kv_heads,
            head_dim=facts.head_dim,
            intermediate_size=facts.intermediate_size,
            vocab_size=facts.vocab_size,
            rms_norm_eps=facts.rms_norm_eps,
            max_position_embeddings=facts.max_positions,
            tie_word_embeddings=facts.tie_word_embeddings,
            qkv_bias=facts.qkv_bias,
            o_bias=facts.o_bias,
            mlp_bias=facts.mlp_bias,
            qk_norm=facts.qk_norm,
            hidden_act=facts.hidden_act,
            layer_windows=facts.layer_windows,
            torch_dtype=dtype,
            rope=_rope_for(facts.rope, max_model_len or facts.max_positions),
            rope_local=dict(facts.rope_local),
            attn_scale=(facts.query_pre_attn_scalar or facts.head_dim) ** -0.5,
            embed_scale=facts.embed_scale,
            final_logit_softcapping=facts.final_logit_softcapping,
            attn_logit_softcapping=facts.attn_logit_softcapping,
            attention_sinks=facts.attention_sinks,
            layer_moe=facts.layer_moe if facts.is_moe else (),
            num_experts=facts.num_experts,
            experts_per_token=facts.experts_per_token,
            moe_intermediate_size=facts.moe_intermediate_size,
            norm_topk_prob=facts.norm_topk_prob,
            shared_expert_intermediate_size=facts.shared_expert_intermediate_size,
            shared_expert_gated=facts.shared_expert_gated,
            moe_router=facts.moe_router,
            moe_bias=facts.moe_bias,
            swiglu_limit=facts.swiglu_limit,
            swiglu_alpha=facts.swiglu_alpha,
            hybrid=facts.hybrid,
        )


def _rope_for(rope: dict[str, Any], max_model_len: int) -> dict[str, Any]:
    """The rope settings for a context of ``max_model_len``: LongRoPE's factor set is chosen here, once."""
    params = dict(rope)
    if params.get("rope_type") == "longrope":
        params["use_long_factor"] = max_model_len > int(params["original_max_position_embeddings"])
    return params
