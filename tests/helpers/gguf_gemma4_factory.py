"""Test helper: a tiny transformers Gemma 4 checkpoint written as a GGUF file the way llama.cpp's converter
writes it (conversion/gemma.py Gemma4Model), independently of glassbox's reader: tensor names from gguf-py's
own map (``gguf.get_tensor_name_map(MODEL_ARCH.GEMMA4, n)``, what the converter's ``map_tensor_name`` uses)
with the converter's own renames (the router's scale as ``ffn_gate_inp.scale``, the per-expert scale as
``ffn_down_exps.scale``, ``layer_scalar`` and the experts given a ``.weight``); norms as stored (Gemma 4's
have no + 1 to add); the full layers' proportional rope as ``rope_freqs`` (1 per turning pair, 1e30 per
other); per-layer KV heads and MLP widths as arrays; the settings read from transformers' own config
object. 2-D weights (and the experts) in the requested GGML type, the rest F32; the tiny vocabulary of
gguf_factory.write_model.
"""

from __future__ import annotations

import json
from pathlib import Path

import gguf
import numpy as np
from gguf import GGMLQuantizationType as Q
from gguf_factory import add_tiny_vocab, encode_tensor


def _gguf_name(name: str, names: gguf.TensorNameMap) -> str:
    if name.endswith("router.scale"):  # the converter: FFN_GATE_INP's ".scale"
        return _gguf_name(name.replace("router.scale", "router.proj.weight"), names).replace(
            ".weight", ".scale"
        )
    if name.endswith("router.per_expert_scale"):  # FFN_DOWN_EXP's ".scale"
        down = name.replace("router.per_expert_scale", "experts.down_proj")
        return _gguf_name(down, names).replace(".weight", ".scale")
    if name.endswith(("layer_scalar", "experts.gate_up_proj", "experts.down_proj")):
        name += ".weight"
    mapped = names.get_name(name, try_suffixes=(".weight", ".bias"))
    if mapped is None:
        raise KeyError(f"gguf-py has no Gemma 4 name for {name}")
    return mapped


def _metadata(writer: gguf.GGUFWriter, model_dir: Path) -> None:
    import transformers as tf

    cfg = tf.Gemma4TextConfig.from_pretrained(model_dir)
    n, types = cfg.num_hidden_layers, cfg.layer_types
    swa = [t == "sliding_attention" for t in types]
    layer = [cfg.per_layer_config[i] for i in range(n)]  # head dims and KV heads may vary by layer
    head_dim = layer[swa.index(True)].head_dim
    dim_full = layer[swa.index(False)].head_dim
    writer.add_name("tiny-gemma4")
    writer.add_block_count(n)
    writer.add_context_length(cfg.max_position_embeddings)
    writer.add_embedding_length(cfg.hidden_size)
    shared = n - cfg.num_kv_shared_layers
    ffn = cfg.intermediate_size
    writer.add_feed_forward_length(
        [ffn * (2 if cfg.use_double_wide_mlp and i >= shared else 1) for i in range(n)]
    )
    writer.add_head_count(cfg.num_attention_heads)
    writer.add_head_count_kv([c.num_key_value_heads for c in layer])
    writer.add_layer_norm_rms_eps(cfg.rms_norm_eps)
    writer.add_key_length(dim_full)
    writer.add_value_length(dim_full)
    writer.add_key_length_swa(head_dim)
    writer.add_value_length_swa(head_dim)
    rope = cfg.rope_parameters
    writer.add_rope_freq_base(rope["full_attention"]["rope_theta"])
    writer.add_rope_freq_base_swa(rope["sliding_attention"]["rope_theta"])
    writer.add_rope_dimension_count(dim_full)
    writer.add_rope_dimension_count_swa(head_dim)
    writer.add_sliding_window(cfg.sliding_window)
    writer.add_sliding_window_pattern(swa)
    writer.add_final_logit_softcapping(cfg.final_logit_softcapping)
    writer.add_shared_kv_layers(cfg.num_kv_shared_layers)
    writer.add_embedding_length_per_layer_input(cfg.hidden_size_per_layer_input or 0)
    if cfg.enable_moe_block:
        writer.add_expert_count(cfg.num_experts)
        writer.add_expert_used_count(cfg.top_k_experts)
        writer.add_expert_feed_forward_length(cfg.moe_intermediate_size)
    turning = int(rope["full_attention"]["partial_rotary_factor"] * dim_full / 2)
    freqs = [1.0] * turning + [1e30] * (dim_full // 2 - turning)
    writer.add_tensor("rope_freqs.weight", np.asarray(freqs, np.float32))
    add_tiny_vocab(writer, cfg.vocab_size)


def write_gemma4_gguf(path: Path, model_dir: Path, qtype: Q = Q.F32) -> None:
    """Write the tiny transformers Gemma 4 checkpoint in ``model_dir`` as a GGUF file at ``path``."""
    from safetensors.numpy import load_file

    layers = json.loads((model_dir / "config.json").read_text())["num_hidden_layers"]
    names = gguf.get_tensor_name_map(gguf.MODEL_ARCH.GEMMA4, layers)
    writer = gguf.GGUFWriter(path, "gemma4")
    _metadata(writer, model_dir)
    rng = np.random.default_rng(0)
    for name, values in load_file(model_dir / "model.safetensors").items():
        values = values.astype(np.float32)
        if values.ndim >= 2 and "router" not in name:
            lead = values.shape[:-1]
            data, raw = encode_tensor(values.reshape(-1, values.shape[-1]), qtype, rng)
            writer.add_tensor(_gguf_name(name, names), data.reshape(*lead, -1), raw_dtype=raw)
        else:
            writer.add_tensor(_gguf_name(name, names), values)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()


def dequantized_state(path: Path, model_dir: Path) -> dict[str, np.ndarray]:
    """The file's tensors dequantized by gguf.quants, under the names of the transformers checkpoint in
    ``model_dir`` it was written from (the reference's weights for a quantized file)."""
    from gguf.quants import dequantize
    from safetensors import safe_open

    layers = json.loads((model_dir / "config.json").read_text())["num_hidden_layers"]
    names = gguf.get_tensor_name_map(gguf.MODEL_ARCH.GEMMA4, layers)
    with safe_open(str(model_dir / "model.safetensors"), "np") as f:
        hf = {_gguf_name(name, names): name for name in f.keys()}  # noqa: SIM118 (not a dict)
    return {
        hf[t.name]: dequantize(t.data, t.tensor_type).reshape(tuple(reversed(t.shape.tolist())))
        for t in gguf.GGUFReader(path).tensors
        if t.name in hf
    }
