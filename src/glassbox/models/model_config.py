"""ModelConfig: what the model code needs, built from the model description (models/facts.py).

config.json is never read here: ModelFacts is the one reading of it, and ModelConfig is those facts, whole
(a subclass: no field copied by name), plus the torch side (the checkpoint's torch dtype), what this
context chooses (LongRoPE's factor set) and the check that the engine has code for the architecture
(models/families.py).
"""

from __future__ import annotations

from dataclasses import dataclass, fields
from typing import Any

import torch

from glassbox.models.facts import ModelFacts
from glassbox.models.families import engine_family
from glassbox.quant.blocks.ct_int_config import ct_int_spec
from glassbox.quant.config import group_quant, quant_method
from glassbox.quant.fp4.checkpoint import nvfp4_spec
from glassbox.quant.fp8.config import fp8_spec
from glassbox.spec_config import SpeculativeConfig

# canonical dtype names (glassbox.dtypes) <-> torch
TORCH_DTYPES = {"fp32": torch.float32, "bf16": torch.bfloat16, "fp16": torch.float16}
# a KV cache may also be 8-bit (layers/kv_quant.py)
KV_TORCH_DTYPES = {**TORCH_DTYPES, "fp8": torch.float8_e4m3fn, "int8": torch.int8}


def dtype_name(dtype: torch.dtype) -> str:
    """The canonical name of a torch dtype ("bf16", ...)."""
    return next(name for name, d in KV_TORCH_DTYPES.items() if d == dtype)


@dataclass(frozen=True)
class ModelConfig(ModelFacts):
    """The model description (its ModelFacts, whole) plus what the engine derives from it: the torch dtype,
    the rope settings chosen for this context (LongRoPE's factor set), the attention scale."""

    torch_dtype: torch.dtype = torch.float32
    attn_scale: float = 0.0  # softmax scale of q.k: query_pre_attn_scalar or head_dim, ** -0.5
    with_mtp: bool = False  # build and load the checkpoint's MTP layers (--speculative-config "mtp")

    @classmethod
    def from_facts(
        cls, facts: ModelFacts, max_model_len: int | None = None, speculative: SpeculativeConfig | None = None
    ) -> ModelConfig:
        """The engine's view of a model; ValueError when the engine cannot run its architecture.

        ``max_model_len`` (default: the model's own limit) picks LongRoPE's long factors where it passes
        the pre-training length (layers/rotary.py)."""
        family = engine_family(facts.architecture)
        method = (quant_method(facts.quantization_config) or "?") if facts.quantization_config else None
        # gpt-oss's MXFP4 experts: quant/fp4/checkpoint.py; FP8 experts: quant/fp8/checkpoint.py; GPTQ/AWQ and
        # compressed-tensors integer experts: quant/expert_parts.py
        qc = facts.quantization_config
        held = method in (None, "mxfp4") or fp8_spec(qc) is not None or group_quant(qc) is not None
        held = held or nvfp4_spec(qc) is not None  # ModelOpt NVFP4 experts: quant/fp4/checkpoint.py
        if method is not None and family.fused:  # their readers do not cut yet
            raise ValueError(f"{method}-quantized {facts.model_type} checkpoints are not read yet")
        if facts.is_moe and not (held or ct_int_spec(qc) is not None):
            raise ValueError(f"quantized ({method}) mixture-of-experts checkpoints are not supported yet")
        # HF's default for a config that names no dtype is float32
        dtype = TORCH_DTYPES[facts.dtype] if facts.dtype_declared else torch.float32
        described = {f.name: getattr(facts, f.name) for f in fields(ModelFacts)}
        described.update(
            rope=_rope_for(facts.rope, max_model_len or facts.max_positions),
            layer_moe=facts.layer_moe if facts.is_moe else (),
        )
        return cls(
            **described,
            torch_dtype=dtype,
            attn_scale=(facts.query_pre_attn_scalar or facts.head_dim) ** -0.5,
            with_mtp=_wants_mtp(facts, speculative),
        )


def _wants_mtp(cfg: ModelFacts, speculative: SpeculativeConfig | None) -> bool:
    """Whether to build the checkpoint's MTP head (--speculative-config "mtp", models/qwen3_next_mtp.py);
    ValueError naming the flag where the model has none this engine reads."""
    if speculative is None or speculative.method != "mtp":
        return False
    spec = cfg.hybrid
    flag = "--speculative-config: method 'mtp'"
    if spec is None or spec.gdn is None:
        what = "Nemotron-H's MTP layers are not read yet" if spec is not None else "it has none"
        raise ValueError(
            f"{flag} runs a Qwen3-Next / Qwen3.5 checkpoint's multi-token-prediction layers; "
            f"{cfg.architecture}: {what} (use ngram or draft_model)"
        )
    if spec.mtp_layers == 0:
        raise ValueError(
            f"{flag}: this checkpoint declares no MTP layers (config.json mtp_num_hidden_layers); "
            "use ngram or draft_model"
        )
    if spec.mtp_layers > 1:
        raise ValueError(f"{flag}: {spec.mtp_layers} MTP layers; only checkpoints with one are read")
    return True


def _rope_for(rope: dict[str, Any], max_model_len: int) -> dict[str, Any]:
    """The rope settings for a context of ``max_model_len``: LongRoPE's factor set is chosen here, once."""
    params = dict(rope)
    if params.get("rope_type") == "longrope":
        params["use_long_factor"] = max_model_len > int(params["original_max_position_embeddings"])
    return params
