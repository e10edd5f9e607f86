"""Test helper: a transformers Qwen3-Next or Qwen3.5 (-MoE) checkpoint written as a GGUF file the way
llama.cpp's converter writes it (convert_hf_to_gguf.py ``Qwen3NextModel`` over ``Qwen2MoeModel``; Qwen3.5:
``_LinearAttentionVReorderBase`` before it, :func:`tiled_v_heads`), with the gguf package's own
tensor-name map (``gguf.get_tensor_name_map``), not glassbox's table: the reader is checked against the
converter's names and transforms, not against itself.

Transforms, as the converter applies them: MTP tensors dropped; ``A_log`` -> -exp(A_log); ``dt_bias`` ->
``dt_proj.bias``; ``conv1d`` squeezed to (C, K); every ``*norm.weight`` but ``linear_attn.norm`` + 1;
``in_proj_qkvz`` (per key head [q | k | v | z]) -> ``attn_qkv`` [all q | all k | all v] and ``attn_gate``
[all z]; per-expert weights stacked (E, out, in). 1-D tensors, the routers and conv1d in F32 (the converter
and llama.cpp's quantizer keep them so), the other 2-D weights in the requested type.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import gguf
import numpy as np
from gguf import GGMLQuantizationType as Q
from gguf_factory import add_tiny_vocab, encode_tensor
from safetensors.numpy import load_file

_F32_PARTS = ("mlp.gate.weight", "shared_expert_gate.weight", "conv1d", "A_log", "dt_bias")


def _split_qkvz(w: np.ndarray, cfg: dict[str, Any]) -> tuple[np.ndarray, np.ndarray]:
    """(qkv, z) rows of in_proj_qkvz (rows grouped per key head: q, k, v, z)."""
    nk, nv = cfg["linear_num_key_heads"], cfg["linear_num_value_heads"]
    dk, dv = cfg["linear_key_head_dim"], cfg["linear_value_head_dim"]
    sizes = [dk, dk, nv // nk * dv, nv // nk * dv]
    grouped = w.reshape(nk, sum(sizes), w.shape[1])
    q, k, v, z = np.split(grouped, np.cumsum(sizes)[:-1], axis=1)
    flat = [p.reshape(-1, w.shape[1]) for p in (q, k, v, z)]
    return np.concatenate(flat[:3]), flat[3]


def _tile(t: np.ndarray, axis: int, nk: int, head: int) -> np.ndarray:
    """``axis`` of length nv * head: v heads from grouped [k0 v0..v(r-1), k1 ...] to tiled [k0 v0, k1 v0, ...]."""
    shape = t.shape
    split = (*shape[:axis], nk, shape[axis] // nk // head, head, *shape[axis + 1 :])
    return np.swapaxes(t.reshape(split), axis, axis + 1).reshape(shape)


def tiled_v_heads(
    state: dict[str, np.ndarray], cfg: dict[str, Any], undo: bool = False
) -> dict[str, np.ndarray]:
    """The converter's Qwen3.5 v-head reorder (``_LinearAttentionVReorderBase.modify_tensors``), where
    there are more v heads than k heads: the v rows of in_proj_qkv and conv1d, the rows of in_proj_z /
    in_proj_b / in_proj_a, A_log and dt_bias, the columns of out_proj. ``undo``: tiled back to grouped
    (the same swap with the (k, r) grid read as (r, k))."""
    nk, nv = cfg["linear_num_key_heads"], cfg["linear_num_value_heads"]
    if nk == nv:
        return state
    dv, qk = cfg["linear_value_head_dim"], 2 * nk * cfg["linear_key_head_dim"]
    nk = nv // nk if undo else nk
    out = {}
    for name, t in state.items():
        if ".linear_attn." in name:
            if "in_proj_qkv" in name or "conv1d" in name:
                t = np.concatenate([t[:qk], _tile(t[qk:], 0, nk, dv)])
            elif "in_proj_z" in name:
                t = _tile(t, 0, nk, dv)
            elif any(p in name for p in ("in_proj_b", "in_proj_a", "A_log", "dt_bias")):
                t = _tile(t, 0, nk, 1)
            elif "out_proj" in name:
                t = _tile(t, 1, nk, dv)
        out[name] = t
    return out


def converted_tensors(state: dict[str, np.ndarray], cfg: dict[str, Any]) -> Iterator[tuple[str, np.ndarray]]:
    """(Hugging Face-side name the converter maps, values) after the converter's transforms."""
    experts: dict[str, dict[int, np.ndarray]] = {}
    for name, t in state.items():
        if name.startswith("mtp"):
            continue
        if name.endswith(".A_log"):
            t = -np.exp(t)
        elif name.endswith(".dt_bias"):
            name = name.replace(".dt_bias", ".dt_proj.bias")
        elif "conv1d" in name:
            t = t.squeeze()
        elif name.endswith("norm.weight") and not name.endswith("linear_attn.norm.weight"):
            t = t + np.float32(1)
        if "in_proj_qkvz" in name:
            qkv, z = _split_qkvz(t, cfg)
            yield name.replace("in_proj_qkvz", "in_proj_qkv"), qkv  # gguf maps it to attn_qkv
            yield name.replace("in_proj_qkvz", "in_proj_z"), z  # attn_gate
            continue
        parts = name.split(".")
        if len(parts) == 8 and parts[4] == "experts":  # model.layers.N.mlp.experts.E.proj.weight
            stem = ".".join(parts[:5] + parts[6:])
            experts.setdefault(stem, {})[int(parts[5])] = t
            continue
        yield name, t
    for stem, per_expert in experts.items():
        yield stem, np.stack([per_expert[e] for e in range(len(per_expert))])


def _stored_type(hf_name: str, values: np.ndarray, qtype: Q) -> Q:
    """The type a tensor is written in: F32 for 1-D tensors, the routers, conv1d, A_log, dt_bias and rows
    off the block size (as llama.cpp's quantizer keeps them), else ``qtype``."""
    if values.ndim == 1 or any(p in hf_name for p in _F32_PARTS):
        return Q.F32
    return qtype if values.shape[-1] % gguf.GGML_QUANT_SIZES[qtype][0] == 0 else Q.F32


def quantized_hf_state(model_dir: Path, arch: str, qtype: Q) -> dict[str, np.ndarray]:
    """The Qwen3.5 checkpoint's parameters as a ``qtype`` file written by :func:`write_qwen3next_gguf` holds
    them, back in Hugging Face's layout: each quantized matrix through gguf.quants' quantize and dequantize
    in the file's (tiled) layout, then untiled (what transformers runs as the quantized file's reference)."""
    assert arch in ("qwen35", "qwen35moe") and qtype in (Q.Q8_0, Q.Q4_0)
    cfg = json.loads((model_dir / "config.json").read_text())
    state = tiled_v_heads(
        {k: v.astype(np.float32) for k, v in load_file(model_dir / "model.safetensors").items()}, cfg
    )
    for name, values in state.items():
        if _stored_type(name, values, qtype) != Q.F32:
            rows = values.reshape(-1, values.shape[-1])
            state[name] = gguf.quants.dequantize(gguf.quants.quantize(rows, qtype), qtype).reshape(
                values.shape
            )
    return tiled_v_heads(state, cfg, undo=True)


def _add_mtp_block(writer: gguf.GGUFWriter, bid: int, hidden: int, rng: np.random.Generator) -> None:
    """A multi-token-prediction block after the last layer, as _Qwen35MtpMixin writes one (random values:
    the engine must not read it)."""
    writer.add_nextn_predict_layers(1)
    for kind, shape in (("NEXTN_EH_PROJ", (hidden, 2 * hidden)), ("NEXTN_ENORM", (hidden,)),
                        ("NEXTN_HNORM", (hidden,)), ("NEXTN_SHARED_HEAD_NORM", (hidden,)),
                        ("ATTN_NORM", (hidden,))):  # fmt: skip
        name = gguf.TENSOR_NAMES[gguf.MODEL_TENSOR[kind]].format(bid=bid) + ".weight"
        writer.add_tensor(name, rng.standard_normal(shape, dtype=np.float32))


class _Writer(gguf.GGUFWriter):
    """gguf's writer, leaving out the metadata keys in ``skip`` (the missing-key tests)."""

    def __init__(self, path: Path, arch: str, skip: tuple[str, ...]) -> None:
        self.skip = skip  # before the base class writes general.architecture
        super().__init__(path, arch)

    def add_key_value(self, key: str, val: Any, vtype: Any, sub_type: Any = None) -> None:
        if key not in self.skip:
            super().add_key_value(key, val, vtype, sub_type)


def write_qwen3next_gguf(
    path: Path,
    model_dir: Path,
    qtype: Q = Q.F32,
    drop: tuple[str, ...] = (),
    arch: str = "qwen3next",
    mtp: bool = False,
    drop_keys: tuple[str, ...] = (),
) -> None:
    """Write the Qwen3-Next (``arch`` "qwen3next") or Qwen3.5 ("qwen35", "qwen35moe") checkpoint in
    ``model_dir`` as ``path`` (tensors whose GGUF name contains one of ``drop`` and the metadata keys in
    ``drop_keys`` left out: the unsupported-variant tests; ``mtp``: with a trailing multi-token-prediction
    block, as the converter writes a Qwen3.5 whose config has ``mtp_num_hidden_layers``)."""
    cfg = json.loads((model_dir / "config.json").read_text())
    layers = cfg["num_hidden_layers"]
    writer = _Writer(path, arch, drop_keys)
    writer.add_name(f"tiny-{arch}")
    writer.add_block_count(layers + int(mtp))
    writer.add_context_length(cfg["max_position_embeddings"])
    writer.add_embedding_length(cfg["hidden_size"])
    if "intermediate_size" in cfg:  # Qwen3.5-MoE has none: the converter then writes no feed_forward_length
        writer.add_feed_forward_length(cfg["intermediate_size"])
    writer.add_head_count(cfg["num_attention_heads"])
    writer.add_head_count_kv(cfg["num_key_value_heads"])
    rope = cfg["rope_parameters"]
    writer.add_rope_freq_base(float(rope["rope_theta"]))
    writer.add_layer_norm_rms_eps(cfg["rms_norm_eps"])
    writer.add_key_length(cfg["head_dim"])
    writer.add_value_length(cfg["head_dim"])
    if "num_experts" in cfg:
        writer.add_expert_count(cfg["num_experts"])
        writer.add_expert_used_count(cfg["num_experts_per_tok"])
        writer.add_expert_feed_forward_length(cfg["moe_intermediate_size"])
        writer.add_expert_shared_feed_forward_length(cfg["shared_expert_intermediate_size"])
    if arch != "qwen3next":  # _Qwen35MRopeMixin: the default sections where the config names none
        writer.add_rope_dimension_sections(rope.get("mrope_section", [11, 11, 10, 0]))
    writer.add_ssm_conv_kernel(cfg["linear_conv_kernel_dim"])
    writer.add_ssm_state_size(cfg["linear_key_head_dim"])
    writer.add_ssm_group_count(cfg["linear_num_key_heads"])
    writer.add_ssm_time_step_rank(cfg["linear_num_value_heads"])
    writer.add_ssm_inner_size(cfg["linear_value_head_dim"] * cfg["linear_num_value_heads"])
    writer.add_full_attention_interval(cfg.get("full_attention_interval", 4))
    writer.add_rope_dimension_count(int(cfg["head_dim"] * rope.get("partial_rotary_factor", 0.25)))
    add_tiny_vocab(writer, cfg["vocab_size"])
    names = gguf.get_tensor_name_map(next(a for a, n in gguf.MODEL_ARCH_NAMES.items() if n == arch), layers)
    state = {k: v.astype(np.float32) for k, v in load_file(model_dir / "model.safetensors").items()}
    if arch != "qwen3next":
        state = tiled_v_heads(state, cfg)
    rng = np.random.default_rng(0)
    for hf, values in converted_tensors(state, cfg):
        stem, suffix = (hf.rsplit(".", 1) + [""])[:2] if hf.endswith((".weight", ".bias")) else (hf, "")
        mapped = names.get_name(stem)
        assert mapped is not None, f"gguf has no name for {hf}"
        name = f"{mapped}.{suffix}" if suffix else mapped
        if any(d in name for d in drop):
            continue
        if name.endswith("ffn_gate_inp_shexp.weight"):
            values = values.reshape(-1)  # written as {H}, as llama.cpp reads it
        want = _stored_type(hf, values, qtype)
        if want == Q.F32:
            writer.add_tensor(name, np.ascontiguousarray(values))
            continue
        lead = values.shape[:-1]
        data, raw = encode_tensor(values.reshape(-1, values.shape[-1]), want, rng)
        writer.add_tensor(name, data.reshape(*lead, -1), raw_dtype=raw)
    if mtp:
        _add_mtp_block(writer, layers, cfg["hidden_size"], rng)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
