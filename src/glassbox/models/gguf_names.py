"""The one table of GGUF tensor names and glassbox's (Hugging Face) parameter names, both ways.

llama.cpp's converter (convert_hf_to_gguf.py, gguf-py's ``MODEL_TENSORS`` / ``TENSOR_NAMES``) names a
layer's tensors ``blk.N.<part>.weight|bias``; :func:`hf_tensor_name` maps them to the names glassbox's models
load (models/llama.py, models/moe.py, models/gpt_oss.py), and :func:`gguf_tensor_name` back (what the writers
use: tests/helpers/gguf_factory.py, benchmarks/gguf_export.py, benchmarks/moe_gguf.py). Torch- and gguf-free.

Mixture-of-experts files hold each layer's routed experts stacked, one 3-D tensor per projection:
``ffn_gate_exps`` / ``ffn_up_exps`` (E, I, H) and ``ffn_down_exps`` (E, H, I) in PyTorch order (gpt-oss adds
``.bias`` (E, I) / (E, H)). They map to ``mlp.experts.gate_proj.weight`` etc.: names no Hugging Face
checkpoint uses (theirs are per expert, ``mlp.experts.N.gate_proj.weight``, or fused,
``mlp.experts.gate_up_proj`` with no suffix), which models/moe.py's ``stacked_slot`` copies into the fused expert parameters. The router
is ``ffn_gate_inp`` (glassbox's ``mlp.gate``, gpt-oss's ``mlp.router``), Qwen2-MoE's shared expert
``ffn_{gate,up,down}_shexp`` with its gate ``ffn_gate_inp_shexp``, gpt-oss's attention sinks ``attn_sinks``
(a parameter without ``.weight`` in Hugging Face names) and its pre-MLP norm ``post_attention_norm``.
"""

from __future__ import annotations

import re

from glassbox.models.gguf_hybrid import (
    QWEN3NEXT_EXACT_NAMES,
    QWEN3NEXT_LAYER_NAMES,
    QWEN35_LAYER_NAMES,
    refused_part,
)
from glassbox.models.gguf_nemotron_h import (
    NEMOTRON_H_EXACT_NAMES,
    NEMOTRON_H_LAYER_NAMES,
    STACKED_EXPERT_PATHS,
)

TOP_LEVEL_NAMES = {
    "token_embd": "model.embed_tokens",
    "output_norm": "model.norm",
    "output": "lm_head",
    # Gemma 4's per-layer input embeddings: the table, the projection to it and its norm
    "per_layer_token_embd": "model.embed_tokens_per_layer",
    "per_layer_model_proj": "model.per_layer_model_projection",
    "per_layer_proj_norm": "model.per_layer_projection_norm",
}
LAYER_NAMES = {
    "attn_q": "self_attn.q_proj",
    "attn_k": "self_attn.k_proj",
    "attn_v": "self_attn.v_proj",
    "attn_output": "self_attn.o_proj",
    "attn_q_norm": "self_attn.q_norm",
    "attn_k_norm": "self_attn.k_norm",
    "attn_norm": "input_layernorm",
    "ffn_norm": "post_attention_layernorm",
    "ffn_gate": "mlp.gate_proj",
    "ffn_up": "mlp.up_proj",
    "ffn_down": "mlp.down_proj",
    # mixture of experts
    "ffn_gate_inp": "mlp.gate",
    "ffn_gate_exps": "mlp.experts.gate_proj",
    "ffn_up_exps": "mlp.experts.up_proj",
    "ffn_down_exps": "mlp.experts.down_proj",
    "ffn_gate_inp_shexp": "mlp.shared_expert_gate",
    "ffn_gate_shexp": "mlp.shared_expert.gate_proj",
    "ffn_up_shexp": "mlp.shared_expert.up_proj",
    "ffn_down_shexp": "mlp.shared_expert.down_proj",
}
# Gemma 3 norms around both the attention and the MLP: its ffn_norm is the norm *before* the MLP.
_GEMMA3_LAYER_NAMES = {
    **LAYER_NAMES,
    "post_attention_norm": "post_attention_layernorm",
    "ffn_norm": "pre_feedforward_layernorm",
    "post_ffw_norm": "post_feedforward_layernorm",
}
# gpt-oss: the norm before the MLP is post_attention_norm (no ffn_norm); sinks per attention head
_GPT_OSS_LAYER_NAMES = {
    **{k: v for k, v in LAYER_NAMES.items() if k != "ffn_norm"},
    "post_attention_norm": "post_attention_layernorm",
    "attn_sinks": "self_attn.sinks",
}
# Phi-3: Q/K/V in one tensor, gate and up in one ffn_up of twice the FFN width (models/fused_parts.py)
_PHI3_LAYER_NAMES = {**LAYER_NAMES, "attn_qkv": "self_attn.qkv_proj", "ffn_up": "mlp.gate_up_proj"}
# Gemma 4 (llama.cpp's conversion/gemma.py Gemma4Model): Gemma 3's norms (weights as stored: no + 1), the
# router ffn_gate_inp beside the dense MLP, each layer's experts with gate and up fused (ffn_gate_up_exps
# (E, 2I, H), read as models/gemma4.py's experts.gate_up_proj), norms around them, the per-layer input's gate,
# projection and norm, the layer scalar; the router's input scale and per-expert scale stored as
# ffn_gate_inp.scale and ffn_down_exps.scale (_SCALES)
_GEMMA4_LAYER_NAMES = {
    **{k: v for k, v in _GEMMA3_LAYER_NAMES.items() if not k.startswith("ffn_gate_inp") and "exp" not in k},
    "ffn_gate_inp": "router.proj",
    "ffn_gate_up_exps": "experts.gate_up_proj",
    "ffn_down_exps": "experts.down_proj",
    "pre_ffw_norm_2": "pre_feedforward_layernorm_2",
    "post_ffw_norm_1": "post_feedforward_layernorm_1",
    "post_ffw_norm_2": "post_feedforward_layernorm_2",
    "inp_gate": "per_layer_input_gate",
    "proj": "per_layer_projection",
    "post_norm": "post_per_layer_input_norm",
    "layer_output_scale": "layer_scalar",
}
# Qwen3-Next (models/gguf_hybrid.py): Gated DeltaNet in ssm_* / attn_qkv / attn_gate; the MLP norm post_attention_norm
_QWEN3NEXT_LAYER_NAMES = {
    **{k: v for k, v in LAYER_NAMES.items() if k != "ffn_norm"},
    **QWEN3NEXT_LAYER_NAMES,
}
# Qwen3.5 / Qwen3.5-MoE: the same, with in_proj_b / in_proj_a stored apart (ssm_beta / ssm_alpha)
_QWEN35_LAYER_NAMES = {**{k: v for k, v in LAYER_NAMES.items() if k != "ffn_norm"}, **QWEN35_LAYER_NAMES}
ARCH_LAYER_NAMES = {
    "gemma3": _GEMMA3_LAYER_NAMES,
    "gemma4": _GEMMA4_LAYER_NAMES,
    "gpt-oss": _GPT_OSS_LAYER_NAMES,
    "phi3": _PHI3_LAYER_NAMES,
    "qwen3next": _QWEN3NEXT_LAYER_NAMES,
    "qwen35": _QWEN35_LAYER_NAMES,
    "qwen35moe": _QWEN35_LAYER_NAMES,
    "nemotron_h": NEMOTRON_H_LAYER_NAMES,  # models/gguf_nemotron_h.py
    "nemotron_h_moe": NEMOTRON_H_LAYER_NAMES,
}
# tensors named whole after "blk.N." (no .weight added: llama.cpp's ssm_a), mapped to the whole HF name
ARCH_EXACT_NAMES = {
    **{a: QWEN3NEXT_EXACT_NAMES for a in ("qwen3next", "qwen35", "qwen35moe")},
    **{a: NEMOTRON_H_EXACT_NAMES for a in ("nemotron_h", "nemotron_h_moe")},
}
# Hugging Face parameters named without a ".weight" (GGUF stores them as "<part>.weight")
_BARE = frozenset({"self_attn.sinks", "layer_scalar", *STACKED_EXPERT_PATHS})
# "blk.N.<part>.scale" tensors: (architecture, part) -> the Hugging Face parameter (named without a suffix)
_SCALES = {("gemma4", "ffn_gate_inp"): "router.scale", ("gemma4", "ffn_down_exps"): "router.per_expert_scale"}
# Tensors with no Hugging Face parameter that carry nothing the config does not already hold:
# rope_freqs (llama 3.x) is the llama3 rope scaling, turned into config["rope_scaling"] and checked there;
# attn_rot_embd (old llama conversions) is the rotary inverse-frequency buffer, recomputed from rope_theta;
# rope_factors_long/short (Phi-3's LongRoPE) are the factor lists, turned into config["rope_scaling"].
_REDUNDANT = re.compile(
    r"^(rope_freqs\.weight|rope_factors_(long|short)\.weight|blk\.\d+\.attn_rot_embd(\.weight)?)$"
)
_ANY_LAYER_TENSOR = re.compile(r"^blk\.(?P<layer>\d+)\.(?P<rest>.+)$")
_LAYER_TENSOR = re.compile(r"^blk\.(?P<layer>\d+)\.(?P<part>\w+)\.(?P<kind>weight|bias|scale)$")
# layouts other converters or older llama.cpp wrote, which glassbox does not read
_REFUSED = {
    "ffn_gate_up_exps": "fused gate/up experts (convert_hf_to_gguf.py --fuse-gate-up-exps) are not read yet",
}
_OLD_EXPERT = re.compile(r"^blk\.\d+\.ffn_(gate|up|down)\.\d+\.weight$")
STACKED_EXPERTS = ("mlp.experts.gate_proj", "mlp.experts.up_proj", "mlp.experts.down_proj")


def layer_names(arch: str) -> dict[str, str]:
    """GGUF part -> Hugging Face module path within a layer, for a GGUF ``arch``."""
    return ARCH_LAYER_NAMES.get(arch, LAYER_NAMES)


def is_redundant(gguf_name: str) -> bool:
    return _REDUNDANT.match(gguf_name) is not None


def hf_tensor_name(gguf_name: str, arch: str = "llama") -> str | None:
    """The Hugging Face parameter name of a GGUF tensor of an ``arch`` model; None for a known-redundant
    tensor (rope_freqs). ValueError for a tensor this reader does not know."""
    if is_redundant(gguf_name):
        return None
    stem, _, kind = gguf_name.rpartition(".")
    if stem in TOP_LEVEL_NAMES and kind in ("weight", "bias"):
        return f"{TOP_LEVEL_NAMES[stem]}.{kind}"
    whole = _ANY_LAYER_TENSOR.match(gguf_name)
    exact = ARCH_EXACT_NAMES.get(arch, {})
    if whole and whole["rest"] in exact:
        return f"model.layers.{int(whole['layer'])}.{exact[whole['rest']]}"
    m = _LAYER_TENSOR.match(gguf_name)
    names = layer_names(arch)
    if m and m["kind"] == "scale" and (arch, m["part"]) in _SCALES:
        return f"model.layers.{int(m['layer'])}.{_SCALES[arch, m['part']]}"
    if m and m["part"] in names and m["kind"] != "scale":
        path = names[m["part"]]
        suffix = "" if path in _BARE and m["kind"] == "weight" else f".{m['kind']}"
        return f"model.layers.{int(m['layer'])}.{path}{suffix}"
    if m and m["part"] in _REFUSED:
        raise ValueError(f"GGUF tensor {gguf_name!r}: {_REFUSED[m['part']]}")
    why = refused_part(arch, m["part"]) if m else None
    if why is not None:
        raise ValueError(f"GGUF tensor {gguf_name!r} of a {arch} file: {why}")
    if _OLD_EXPERT.match(gguf_name):
        raise ValueError(
            f"GGUF tensor {gguf_name!r}: experts stored one tensor each (an old llama.cpp layout) are not "
            "read; "
            "convert the model again with a current llama.cpp (experts stacked in ffn_*_exps)"
        )
    raise ValueError(f"GGUF tensor {gguf_name!r} has no known Hugging Face parameter name")


def gguf_tensor_name(hf_name: str, arch: str = "llama") -> str:
    """The GGUF name llama.cpp gives the Hugging Face parameter ``hf_name`` of an ``arch`` model (the inverse
    of :func:`hf_tensor_name`); KeyError for a name it has none for."""
    for top, hf in TOP_LEVEL_NAMES.items():
        if hf_name.startswith(hf + ".") and hf_name.count(".") == hf.count(".") + 1:
            return f"{top}.{hf_name.rpartition('.')[2]}"
    m = re.match(r"^model\.layers\.(\d+)\.(.+)$", hf_name)
    if m is None:
        raise KeyError(hf_name)
    layer, rest = m.groups()
    scale = next((part for (a, part), hf in _SCALES.items() if a == arch and hf == rest), None)
    if scale is not None:
        return f"blk.{layer}.{scale}.scale"
    for part, hf in ARCH_EXACT_NAMES.get(arch, {}).items():
        if hf == rest:
            return f"blk.{layer}.{part}"
    path, kind = (rest, "weight") if rest in _BARE else rest.rpartition(".")[::2]
    for part, hf in layer_names(arch).items():
        if hf == path:
            return f"blk.{layer}.{part}.{kind}"
    raise KeyError(hf_name)
