"""Test helper: a transformers Nemotron-H checkpoint written as a GGUF file the way llama.cpp's converter
writes it (convert_hf_to_gguf.py ``NemotronHModel`` over ``GraniteHybridModel`` over ``Mamba2Model``), with
the gguf package's own tensor-name map (``gguf.get_tensor_name_map``), not glassbox's table.

The architecture: ``nemotron_h_moe`` for a pattern with MoE blocks ("E"), else ``nemotron_h`` (the converter
picks the MoE one when the config has ``num_experts_per_tok``, which a Nemotron-H 8B / Nano 2 config has
not; transformers 5 writes it into every config it saves, so the choice is made from the pattern here).
Transforms, as the converter applies them: ``A_log`` -> -exp(A_log) as (H, 1); ``D`` as (H, 1); ``dt_bias``
-> ``dt_proj.bias``; ``conv1d`` squeezed to (C, K); the mixer's gated norm as (n_groups, d_inner / n_groups);
q/k rows permuted per head as LlamaModel.permute does (``undo_permute``); per-expert weights stacked
(E, out, in) under ``model.layers.N.mlp.experts``; the router's ``e_score_correction_bias`` as
``exp_probs_b.bias``. Metadata: per-layer ``head_count_kv`` and ``feed_forward_length`` (0 where the block has
none), ``attention.layer_norm_epsilon`` (the config's ``layer_norm_epsilon``), the Mamba-2 sizes, the MoE keys
(``expert_group_count`` and no ``expert_group_used_count``, as the converter writes them). 1-D tensors, the
routers, conv1d, A, D and the norms in F32, the other 2-D weights in the requested type.
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

_PATTERN = {"linear_attention": "M", "full_attention": "*", "mlp": "-", "moe": "E"}
_F32_PARTS = ("conv1d", "A_log", "mixer.D", "norm.weight", "mixer.gate.weight")


def pattern_of(cfg: dict[str, Any]) -> str:
    """The config's block pattern (M, *, -, E) from hybrid_override_pattern or layers_block_type."""
    pattern = cfg.get("hybrid_override_pattern")
    return pattern if isinstance(pattern, str) else "".join(_PATTERN[t] for t in cfg["layers_block_type"])


def _permute(w: np.ndarray, heads: int) -> np.ndarray:
    """LlamaModel.permute: each head's rows (x half, y half) interleaved (x0, y0, x1, y1, ...)."""
    return w.reshape(heads, 2, w.shape[0] // heads // 2, *w.shape[1:]).swapaxes(1, 2).reshape(w.shape)


def converted_tensors(state: dict[str, np.ndarray], cfg: dict[str, Any]) -> Iterator[tuple[str, np.ndarray]]:
    """(the name the converter maps, values) after the converter's transforms."""
    experts: dict[str, dict[int, np.ndarray]] = {}
    groups = cfg["n_groups"]
    for name, t in state.items():
        if name.startswith("mtp."):
            continue
        if name.endswith(".A_log"):
            t = -np.exp(t).reshape(-1, 1)
        elif name.endswith(".D"):
            t = t.reshape(-1, 1)
        elif name.endswith(".dt_bias"):
            name = name.replace(".dt_bias", ".dt_proj.bias")
        elif name.endswith("conv1d.weight"):
            t = t.squeeze()
        elif name.endswith("mixer.norm.weight"):
            t = t.reshape(groups, -1)
        elif name.endswith("q_proj.weight"):
            t = _permute(t, cfg["num_attention_heads"])
        elif name.endswith("k_proj.weight"):
            t = _permute(t, cfg["num_key_value_heads"])
        elif name.endswith("e_score_correction_bias"):
            name = name.replace("e_score_correction_bias", "e_score_correction.bias")
        parts = name.split(".")
        if len(parts) == 8 and parts[4] == "experts":  # backbone.layers.N.mixer.experts.E.proj.weight
            experts.setdefault(f"model.layers.{parts[2]}.mlp.experts.{parts[6]}", {})[int(parts[5])] = t
            continue
        yield name, t
    for stem, per_expert in experts.items():
        yield stem + ".weight", np.stack([per_expert[e] for e in range(len(per_expert))])


def _add_metadata(writer: gguf.GGUFWriter, cfg: dict[str, Any], pattern: str, moe: bool) -> None:
    """``pattern``: the layers' kinds, and "X" for a trailing MTP block (attention and MoE both)."""
    layers = len(pattern)
    writer.add_block_count(layers)
    writer.add_context_length(2**20)  # GraniteHybridModel: no rope, so "any length"
    writer.add_embedding_length(cfg["hidden_size"])
    ffn_kind, ffn = ("E", cfg["moe_intermediate_size"]) if moe else ("-", cfg["intermediate_size"])
    writer.add_feed_forward_length([ffn if k in (ffn_kind, "X") else 0 for k in pattern])
    writer.add_head_count(cfg["num_attention_heads"])
    writer.add_head_count_kv([cfg["num_key_value_heads"] if k in "*X" else 0 for k in pattern])
    writer.add_key_length(cfg["head_dim"])
    writer.add_value_length(cfg["head_dim"])
    writer.add_layer_norm_eps(cfg["layer_norm_epsilon"])
    writer.add_ssm_conv_kernel(cfg["conv_kernel"])
    writer.add_ssm_state_size(cfg["ssm_state_size"])
    writer.add_ssm_group_count(cfg["n_groups"])
    writer.add_ssm_inner_size(cfg["mamba_num_heads"] * cfg["mamba_head_dim"])
    writer.add_ssm_time_step_rank(cfg["mamba_num_heads"])
    writer.add_rope_scaling_finetuned(False)
    if moe:
        writer.add_expert_used_count(cfg["num_experts_per_tok"])
        writer.add_expert_feed_forward_length(cfg["moe_intermediate_size"])
        writer.add_expert_shared_feed_forward_length(cfg["moe_shared_expert_intermediate_size"])
        writer.add_expert_count(cfg["n_routed_experts"])
        writer.add_expert_shared_count(cfg["n_shared_experts"])
        writer.add_expert_weights_norm(cfg["norm_topk_prob"])
        writer.add_expert_weights_scale(cfg["routed_scaling_factor"])
        writer.add_expert_group_count(cfg["n_group"])
        if cfg.get("moe_latent_size") is not None:
            writer.add_moe_latent_size(cfg["moe_latent_size"])
    if pattern.endswith("X"):
        writer.add_nextn_predict_layers(1)


def _add_mtp_block(writer: gguf.GGUFWriter, bid: int, cfg: dict[str, Any], rng: np.random.Generator) -> None:
    """Some of a Nemotron 3 MTP block's tensors (random: the engine must not read them)."""
    h, q = cfg["hidden_size"], cfg["num_attention_heads"] * cfg["head_dim"]
    for name, shape in ((f"blk.{bid}.nextn.eh_proj.weight", (h, 2 * h)), (f"blk.{bid}.attn_norm.weight", (h,)),
                        (f"blk.{bid}.attn_q.weight", (q, h)), (f"blk.{bid}.ffn_gate_inp.weight", (8, h))):  # fmt: skip
        writer.add_tensor(name, rng.standard_normal(shape, dtype=np.float32))


def stored_type(name: str, values: np.ndarray, qtype: Q) -> Q:
    """F32 for 1-D tensors, conv1d, A, D, the norms and the routers (as llama.cpp keeps them) and rows off
    the block size; else ``qtype``."""
    if values.ndim == 1 or any(p in name for p in _F32_PARTS):
        return Q.F32
    return qtype if values.shape[-1] % gguf.GGML_QUANT_SIZES[qtype][0] == 0 else Q.F32


def write_nemotron_h_gguf(
    path: Path, model_dir: Path, qtype: Q = Q.F32, drop: tuple[str, ...] = (), mtp: bool = False
) -> str:
    """Write the Nemotron-H checkpoint in ``model_dir`` as ``path`` (tensors whose GGUF name contains one
    of ``drop`` left out; ``mtp``: with a trailing MTP block, as the converter writes a Nemotron 3 whose
    config has ``num_nextn_predict_layers``); returns the architecture written."""
    cfg = json.loads((model_dir / "config.json").read_text())
    pattern = pattern_of(cfg)
    moe = "E" in pattern
    assert moe or not mtp, "the converter writes an MTP block for the MoE variant only"
    arch = gguf.MODEL_ARCH.NEMOTRON_H_MOE if moe else gguf.MODEL_ARCH.NEMOTRON_H
    writer = gguf.GGUFWriter(path, gguf.MODEL_ARCH_NAMES[arch])
    writer.add_name("tiny-nemotron-h")
    _add_metadata(writer, cfg, pattern + "X" * mtp, moe)
    add_tiny_vocab(writer, cfg["vocab_size"])
    names = gguf.get_tensor_name_map(arch, len(pattern))
    state = {k: v.astype(np.float32) for k, v in load_file(model_dir / "model.safetensors").items()}
    rng = np.random.default_rng(0)
    for hf, values in converted_tensors(state, cfg):
        mapped = names.get_name(hf, try_suffixes=(".weight", ".bias"))
        assert mapped is not None, f"gguf has no name for {hf}"
        if any(d in mapped for d in drop):
            continue
        want = stored_type(hf, values, qtype)
        if want == Q.F32:
            writer.add_tensor(mapped, np.ascontiguousarray(values))
            continue
        data, raw = encode_tensor(values.reshape(-1, values.shape[-1]), want, rng)
        writer.add_tensor(mapped, data.reshape(*values.shape[:-1], -1), raw_dtype=raw)
    if mtp:
        _add_mtp_block(writer, len(pattern), cfg, rng)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return gguf.MODEL_ARCH_NAMES[arch]


def quantized_hf_state(model_dir: Path, qtype: Q) -> dict[str, np.ndarray]:
    """The checkpoint's parameters as a ``qtype`` file of :func:`write_nemotron_h_gguf` holds them: each
    quantized matrix through gguf.quants' quantize and dequantize by rows (the converter's q/k row
    permutation moves whole rows, so it does not change a row's blocks)."""
    state = {k: v.astype(np.float32) for k, v in load_file(model_dir / "model.safetensors").items()}
    for name, values in state.items():
        if stored_type(name, values, qtype) != Q.F32:
            blocks = gguf.quants.quantize(values.reshape(-1, values.shape[-1]), qtype)
            state[name] = gguf.quants.dequantize(blocks, qtype).reshape(values.shape)
    return state
