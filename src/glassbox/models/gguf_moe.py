"""The Hugging Face config keys of a GGUF mixture-of-experts file, as llama.cpp runs it.

llama.cpp reads few MoE settings from the file and hard-codes the rest per architecture (src/models/*.cpp:
each one's ``build_moe_ffn`` call); the config written here is what it runs, in transformers' spelling:

- every layer routed (its loaders build ``ffn_gate_inp`` + the stacked experts in each layer; a file with a
  layer that has no router is refused), softmax routing over all experts, top-``expert_used_count``;
- ``qwen2moe``: the top-k weights not renormalized (``norm_topk_prob`` False), experts of
  ``expert_feed_forward_length`` (else ``feed_forward_length`` / k), a shared expert of
  ``expert_shared_feed_forward_length`` (else ``feed_forward_length``) behind its sigmoid gate;
- ``qwen3moe``: renormalized; experts of ``expert_feed_forward_length``;
- ``llama`` with ``expert_count`` (Mixtral): renormalized; experts of ``feed_forward_length``;
- ``gpt-oss``: top-k of the logits then a softmax over the k, biases, the clamped SwiGLU with llama.cpp's
  constants (alpha 1.702, limit 7: not in the file), experts of ``expert_feed_forward_length``, sliding
  windows of ``attention.sliding_window`` on the layers ``attention.sliding_window_pattern`` names (a list
  of flags, or n: all but every n-th layer slide; default 2: the even layers).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

GPT_OSS_SWIGLU_LIMIT = 7.0  # llama-graph.cpp LLM_FFN_SWIGLU_OAI_MOE
GPT_OSS_SWIGLU_ALPHA = 1.702
GPT_OSS_SWA_PATTERN = 2  # openai-moe.cpp load_swa_pattern(ml, 2)
_GATING_SOFTMAX = (1, 3)  # LLAMA_EXPERT_GATING_FUNC_TYPE_SOFTMAX, _SOFTMAX_WEIGHT


def _swa_layers(pattern: Any, layers: int) -> list[bool]:
    """Which layers slide: llama.cpp's ``set_swa_pattern`` (n: layer i slides iff i % n < n - 1), or a
    list of flags as stored."""
    if isinstance(pattern, list):
        if len(pattern) != layers:
            raise ValueError(f"GGUF sliding_window_pattern has {len(pattern)} flags for {layers} layers")
        return [bool(p) for p in pattern]
    n = int(pattern)
    return [n == 0 or i % n < n - 1 for i in range(layers)]


def moe_fields(
    arch: str,
    get: Callable[..., Any],
    metadata: dict[str, Any],
    shapes: dict[str, tuple[int, ...]],
    config: dict[str, Any],
) -> dict[str, Any]:
    """The MoE keys of an ``arch`` file's HF config (``get(key, default)`` reads ``<arch>.<key>``, one value
    for all layers; ``metadata`` the raw key/values; ``config``: the dense keys already read). ValueError
    for what llama.cpp would not run as such."""
    layers = int(config["num_hidden_layers"])
    unrouted = [i for i in range(layers) if f"blk.{i}.ffn_gate_inp.weight" not in shapes]
    if unrouted:
        raise ValueError(f"GGUF {arch} file with experts has no router (ffn_gate_inp) in layers {unrouted}")
    gating = get("expert_gating_func", None)
    if gating is not None and int(gating) not in _GATING_SOFTMAX:
        raise ValueError(f"GGUF {arch}.expert_gating_func={gating}: only softmax routing is supported")
    experts, used = int(get("expert_count")), int(get("expert_used_count"))
    ffn = int(config["intermediate_size"])
    out: dict[str, Any] = {"num_experts_per_tok": used}
    if arch == "llama":
        if "blk.0.ffn_gate_shexp.weight" in shapes:
            raise ValueError("GGUF llama file with shared experts (Granite MoE) is not supported")
        return out | {"num_local_experts": experts}
    if arch in ("qwen2moe", "qwen3moe"):
        default = ffn // used if arch == "qwen2moe" else ffn
        out |= {
            "num_experts": experts,
            "moe_intermediate_size": int(get("expert_feed_forward_length", default) or default),
            "norm_topk_prob": arch == "qwen3moe",
            "decoder_sparse_step": 1,
            "mlp_only_layers": [],
        }
        if arch == "qwen2moe":
            shared = int(get("expert_shared_feed_forward_length", ffn) or ffn)
            out |= {"shared_expert_intermediate_size": shared, "qkv_bias": "blk.0.attn_q.bias" in shapes}
        return out
    if arch == "gpt-oss":
        base, swa_base = get("rope.freq_base", None), get("rope.freq_base_swa", None)
        if swa_base is not None and base is not None and float(swa_base) != float(base):
            raise ValueError(f"GGUF gpt-oss file with a sliding-layer rope base of its own ({swa_base})")
        window = get("attention.sliding_window", None)
        pattern = metadata.get(f"{arch}.attention.sliding_window_pattern", GPT_OSS_SWA_PATTERN)
        slides = _swa_layers(pattern, layers)
        if window is None:
            slides = [False] * layers
        return out | {
            "num_local_experts": experts,
            "intermediate_size": int(get("expert_feed_forward_length")),
            "swiglu_limit": GPT_OSS_SWIGLU_LIMIT,
            "swiglu_alpha": GPT_OSS_SWIGLU_ALPHA,
            "layer_types": ["sliding_attention" if s else "full_attention" for s in slides],
        }
    raise ValueError(f"GGUF {arch} file with experts is not supported")
