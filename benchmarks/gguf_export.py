"""Write a Hugging Face checkpoint (Llama, Qwen2, Qwen3 or Phi-3 layout) as a GGUF file that llama.cpp can load.

The benchmark compares glassbox with llama.cpp on *the same* weights, so this exporter copies every tensor
unchanged: 2-D weights keep the checkpoint's dtype (bf16 stays bf16, f32 stays f32) unless ``dtype`` asks for
another (also q8_0 / q4_0: quantized by the gguf package, llama.cpp's reference quantization in Python, all
2-D weights including the embedding), and 1-D tensors (norms, biases) are always written as f32, as
llama.cpp expects.

Three things matter for greedy outputs to match transformers:

* Rotary layout. Hugging Face's Llama rotates the two *halves* of each head ("rotate_half"), while
  llama.cpp's ``llama`` architecture rotates *adjacent pairs*; so for ``llama`` the rows of the Q and K
  projections are reordered per head (row ``i`` of the first half and row ``i`` of the second half become
  rows ``2i`` and ``2i + 1``). llama.cpp runs ``qwen2``/``qwen3`` with the half-split ("neox") rotary, so their
  Q and K are written as they are.
* Llama 3 rope scaling. llama.cpp takes it as a ``rope_freqs`` tensor of per-frequency divisors.
* Vocabulary padding. The embedding may have more rows than the tokenizer has tokens (e.g. 151,936 vs 512);
  the GGUF token list is padded with unused placeholder tokens up to the embedding's row count.

The tokenizer must be a byte-level BPE ``tokenizer.json`` (GPT-2 style), as written by
``glassbox.tokenizer.training``; it is stored as ``tokenizer.ggml.model = "gpt2"`` with the GPT-2 split regex.
"""

from __future__ import annotations

import json
import math
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import gguf
import numpy as np
import torch
from safetensors import safe_open

from glassbox.models.gguf_names import gguf_tensor_name

# HF model_type -> GGUF arch
SUPPORTED_ARCHS = {"llama": "llama", "qwen2": "qwen2", "qwen3": "qwen3", "phi3": "phi3"}

_DTYPES = {
    "bf16": (torch.bfloat16, gguf.GGMLQuantizationType.BF16, gguf.LlamaFileType.MOSTLY_BF16),
    "f16": (torch.float16, gguf.GGMLQuantizationType.F16, gguf.LlamaFileType.MOSTLY_F16),
    "f32": (torch.float32, gguf.GGMLQuantizationType.F32, gguf.LlamaFileType.ALL_F32),
    "q8_0": (torch.float32, gguf.GGMLQuantizationType.Q8_0, gguf.LlamaFileType.MOSTLY_Q8_0),
    "q4_0": (torch.float32, gguf.GGMLQuantizationType.Q4_0, gguf.LlamaFileType.MOSTLY_Q4_0),
}
_TORCH_TO_NAME = {torch.bfloat16: "bf16", torch.float16: "f16", torch.float32: "f32"}


def _iter_safetensors(model_dir: Path) -> Iterator[tuple[str, torch.Tensor]]:
    """Every tensor of the checkpoint, single-file or sharded (``model.safetensors.index.json``)."""
    index = model_dir / "model.safetensors.index.json"
    if index.is_file():
        files = sorted(set(json.loads(index.read_text())["weight_map"].values()))
    else:
        files = ["model.safetensors"]
    for name in files:
        with safe_open(str(model_dir / name), framework="pt") as f:
            for key in f.keys():
                yield key, f.get_tensor(key)


def _checkpoint_dtype(model_dir: Path) -> torch.dtype:
    """The dtype of the checkpoint's 2-D weights (taken from its first 2-D tensor)."""
    for _, t in _iter_safetensors(model_dir):
        if t.ndim == 2:
            return t.dtype
    raise ValueError(f"no 2-D tensor in {model_dir}")


def _rope_params(cfg: dict[str, Any]) -> dict[str, Any]:
    """Rope settings from either the transformers 5 ``rope_parameters`` or the older top-level keys."""
    params = dict(cfg.get("rope_parameters") or cfg.get("rope_scaling") or {})
    params.setdefault("rope_theta", cfg.get("rope_theta", 10000.0))
    params.setdefault("rope_type", params.get("type", "default"))
    return params


def llama3_rope_divisors(head_dim: int, params: dict[str, Any]) -> np.ndarray:
    """Per-frequency divisors that turn plain rotary frequencies into Llama 3 scaled ones (``rope_freqs``).

    Long wavelengths (beyond ``original_max / low_freq_factor``) are slowed by ``factor``, short ones
    (below ``original_max / high_freq_factor``) are untouched, and the band between is blended linearly in
    ``original_max / wavelength``.
    """
    base = float(params["rope_theta"])
    factor = float(params["factor"])
    low = float(params.get("low_freq_factor", 1.0))
    high = float(params.get("high_freq_factor", 4.0))
    orig = float(params["original_max_position_embeddings"])
    divisors = []
    for i in range(0, head_dim, 2):
        freq = base ** (-i / head_dim)
        wavelength = 2.0 * math.pi / freq
        if wavelength < orig / high:
            divisors.append(1.0)
        elif wavelength > orig / low:
            divisors.append(factor)
        else:
            smooth = (orig / wavelength - low) / (high - low)
            divisors.append(1.0 / ((1.0 - smooth) / factor + smooth))
    return np.asarray(divisors, dtype=np.float32)


def _interleave_rotary_rows(w: torch.Tensor, n_heads: int) -> torch.Tensor:
    """Reorder Q/K projection rows per head from the half-split rotary layout to the adjacent-pair layout."""
    rows = w.shape[0]
    head_dim = rows // n_heads
    rest = w.shape[1:]
    return w.reshape(n_heads, 2, head_dim // 2, *rest).transpose(1, 2).reshape(rows, *rest)


def _tokenizer_fields(model_dir: Path, n_vocab: int) -> dict[str, Any]:
    """Token strings, types and merges (padded to ``n_vocab``) plus the special ids, from tokenizer.json."""
    tok = json.loads((model_dir / "tokenizer.json").read_text(encoding="utf-8"))
    model = tok["model"]
    if model.get("type", "BPE") != "BPE":
        raise ValueError(f"only byte-level BPE tokenizers are supported, not {model.get('type')}")
    id_to_token: dict[int, str] = {int(i): t for t, i in model["vocab"].items()}
    types: dict[int, int] = {i: int(gguf.TokenType.NORMAL) for i in id_to_token}
    for added in tok.get("added_tokens", []):
        idx = int(added["id"])
        id_to_token[idx] = added["content"]
        types[idx] = int(gguf.TokenType.CONTROL if added.get("special") else gguf.TokenType.USER_DEFINED)
    n_tok = max(id_to_token) + 1
    if n_tok > n_vocab:
        raise ValueError(f"tokenizer has {n_tok} tokens but the embedding only {n_vocab} rows")
    tokens: list[str] = []
    token_types: list[int] = []
    for i in range(n_vocab):
        if i in id_to_token:
            tokens.append(id_to_token[i])
            token_types.append(types[i])
        else:  # a padding row of the embedding, or a hole in the id space
            tokens.append(f"[PAD{i}]")
            token_types.append(int(gguf.TokenType.UNUSED))
    merges = [m if isinstance(m, str) else " ".join(m) for m in model.get("merges", [])]

    tcfg_path = model_dir / "tokenizer_config.json"
    tcfg = json.loads(tcfg_path.read_text(encoding="utf-8")) if tcfg_path.is_file() else {}
    gen_path = model_dir / "generation_config.json"
    gen = json.loads(gen_path.read_text(encoding="utf-8")) if gen_path.is_file() else {}
    token_to_id = {t: i for i, t in id_to_token.items()}

    def special_id(name: str) -> int | None:
        val = tcfg.get(name)
        if isinstance(val, dict):
            val = val.get("content")
        return token_to_id.get(val) if isinstance(val, str) else None

    eos = gen.get("eos_token_id")
    if isinstance(eos, list):
        eos = eos[0] if eos else None
    return {
        "tokens": tokens,
        "types": token_types,
        "merges": merges,
        "bos": special_id("bos_token"),
        "eos": eos if eos is not None else special_id("eos_token"),
        "pad": special_id("pad_token"),
        "add_bos": bool(tcfg.get("add_bos_token", False)),
        "chat_template": tcfg.get("chat_template"),
    }


def _gguf_name(hf_name: str, arch: str) -> str | None:
    """The llama.cpp tensor name for a Hugging Face one (glassbox's table, models/gguf_names.py); None for
    tensors llama.cpp does not take."""
    if "rotary_emb" in hf_name:
        return None
    try:
        return gguf_tensor_name(hf_name, arch)
    except KeyError:
        raise ValueError(f"tensor {hf_name!r} has no llama.cpp counterpart in this exporter") from None


def export_gguf(model_dir: Path, out_path: Path, dtype: str = "auto") -> Path:
    """Write ``model_dir`` (config.json + safetensors + tokenizer.json) as an unquantized GGUF at ``out_path``.

    ``dtype`` is the storage type of the 2-D weights: "auto" keeps the checkpoint's (bf16, f16 or f32),
    or one of "bf16", "f16", "f32". 1-D tensors are always f32. Returns ``out_path``.
    """
    model_dir, out_path = Path(model_dir), Path(out_path)
    cfg = json.loads((model_dir / "config.json").read_text())
    model_type = cfg.get("model_type")
    if model_type not in SUPPORTED_ARCHS:
        raise ValueError(f"unsupported model_type {model_type!r}; supported: {sorted(SUPPORTED_ARCHS)}")
    arch = SUPPORTED_ARCHS[model_type]
    if dtype == "auto":
        dtype = _TORCH_TO_NAME.get(_checkpoint_dtype(model_dir), "f32")
    if dtype not in _DTYPES:
        raise ValueError(f"dtype must be 'auto' or one of {sorted(_DTYPES)}, not {dtype!r}")
    torch_dtype, ggml_type, file_type = _DTYPES[dtype]

    hidden = int(cfg["hidden_size"])
    n_head = int(cfg["num_attention_heads"])
    n_kv = int(cfg.get("num_key_value_heads") or n_head)
    head_dim = int(cfg.get("head_dim") or hidden // n_head)
    n_vocab = int(cfg["vocab_size"])
    tied = bool(cfg.get("tie_word_embeddings", False))
    rope = _rope_params(cfg)
    if cfg.get("hidden_act", "silu") != "silu":
        raise ValueError(f"only SiLU-gated MLPs are supported, not {cfg.get('hidden_act')!r}")
    if cfg.get("use_sliding_window") or (arch != "phi3" and cfg.get("sliding_window")):
        raise ValueError("sliding-window attention is not exported")

    out_path.parent.mkdir(parents=True, exist_ok=True)
    writer = gguf.GGUFWriter(str(out_path), arch)
    writer.add_name(model_dir.name)
    writer.add_file_type(int(file_type))
    writer.add_quantization_version(gguf.GGML_QUANT_VERSION)
    writer.add_vocab_size(n_vocab)
    writer.add_context_length(int(cfg.get("max_position_embeddings", 4096)))
    writer.add_embedding_length(hidden)
    writer.add_block_count(int(cfg["num_hidden_layers"]))
    writer.add_feed_forward_length(int(cfg["intermediate_size"]))
    writer.add_head_count(n_head)
    writer.add_head_count_kv(n_kv)
    writer.add_layer_norm_rms_eps(float(cfg.get("rms_norm_eps", 1e-6)))
    writer.add_rope_freq_base(float(rope["rope_theta"]))
    rope_dims = int(
        head_dim * float(rope.get("partial_rotary_factor", cfg.get("partial_rotary_factor", 1.0)))
    )
    writer.add_rope_dimension_count(rope_dims)
    if head_dim * n_head != hidden or arch == "qwen3":
        writer.add_key_length(head_dim)
        writer.add_value_length(head_dim)

    rope_type = rope["rope_type"]
    original = int(cfg.get("original_max_position_embeddings", 4096))
    if arch == "phi3":  # as llama.cpp's Phi3MiniModel: the pre-training length, the window (0: none)
        writer.add_rope_scaling_orig_ctx_len(original)
        writer.add_sliding_window(int(cfg.get("sliding_window") or 0))
    if rope_type == "longrope":  # the factor lists as tensors, the attention factor as metadata
        scale = int(cfg["max_position_embeddings"]) / original
        writer.add_rope_scaling_attn_factors(
            math.sqrt(1 + math.log(scale) / math.log(original)) if scale > 1 else 1.0
        )
        writer.add_tensor("rope_factors_long.weight", np.asarray(rope["long_factor"], np.float32))
        writer.add_tensor("rope_factors_short.weight", np.asarray(rope["short_factor"], np.float32))
    elif rope_type == "llama3":
        writer.add_tensor("rope_freqs.weight", llama3_rope_divisors(head_dim, rope))
    elif rope_type == "linear":
        writer.add_rope_scaling_type(gguf.RopeScalingType.LINEAR)
        writer.add_rope_scaling_factor(float(rope["factor"]))
    elif rope_type != "default":
        raise ValueError(f"rope type {rope_type!r} is not exported")

    vocab = _tokenizer_fields(model_dir, n_vocab)
    writer.add_tokenizer_model("gpt2")
    writer.add_tokenizer_pre("gpt-2")  # the GPT-2 split regex, as tokenizers' ByteLevel(use_regex=True)
    writer.add_token_list(vocab["tokens"])
    writer.add_token_types(vocab["types"])
    writer.add_token_merges(vocab["merges"])
    if vocab["bos"] is not None:
        writer.add_bos_token_id(int(vocab["bos"]))
    if vocab["eos"] is not None:
        writer.add_eos_token_id(int(vocab["eos"]))
    if vocab["pad"] is not None:
        writer.add_pad_token_id(int(vocab["pad"]))
    writer.add_add_bos_token(vocab["add_bos"])
    writer.add_add_eos_token(False)
    if vocab["chat_template"]:
        writer.add_chat_template(vocab["chat_template"])

    for hf_name, tensor in _iter_safetensors(model_dir):
        name = _gguf_name(hf_name, arch)
        if name is None or (tied and name == "output.weight"):
            continue
        if arch == "llama" and name.endswith(("attn_q.weight", "attn_k.weight")):
            tensor = _interleave_rotary_rows(tensor, n_head if "attn_q" in name else n_kv)
        if name == "token_embd.weight" and tensor.shape[0] != n_vocab:
            raise ValueError(f"embedding has {tensor.shape[0]} rows but config.vocab_size is {n_vocab}")
        if tensor.ndim == 1:
            writer.add_tensor(name, tensor.float().contiguous().numpy())
        elif dtype in ("q8_0", "q4_0"):
            packed = gguf.quants.quantize(tensor.float().contiguous().numpy(), ggml_type)
            writer.add_tensor(name, packed, raw_dtype=ggml_type)  # the element shape comes from the bytes
        elif torch_dtype == torch.bfloat16:  # numpy has no bf16: hand over the raw 16-bit patterns
            bits = tensor.to(torch.bfloat16).contiguous().view(torch.int16).numpy()
            writer.add_tensor(name, bits, raw_dtype=ggml_type)
        else:
            writer.add_tensor(name, tensor.to(torch_dtype).contiguous().numpy())

    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return out_path


def main() -> None:
    """``python benchmarks/gguf_export.py MODEL_DIR OUT.gguf [auto|bf16|f16|f32|q8_0|q4_0]``."""
    import sys

    if len(sys.argv) not in (3, 4):
        raise SystemExit(main.__doc__)
    out = export_gguf(Path(sys.argv[1]), Path(sys.argv[2]), *(sys.argv[3:]))
    print(f"wrote {out} ({out.stat().st_size / 2**20:.1f} MiB)")


if __name__ == "__main__":
    main()
