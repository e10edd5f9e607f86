"""Write a Qwen3-MoE or gpt-oss Hugging Face checkpoint (bf16) as a GGUF file that llama.cpp loads.

The names and metadata keys are llama.cpp's (its convert_hf_to_gguf.py and the architectures' loaders
``qwen3moe`` and ``gpt-oss``; the names from glassbox's table, models/gguf_names.py); the code is ours. Every tensor keeps its values: 2-D and 3-D weights stay
bf16 (the same bytes glassbox and transformers read), 1-D tensors (norms, biases, sinks) are f32 as
llama.cpp expects. The routed experts are stacked per layer as (E, rows, cols) tensors
``ffn_gate_exps`` / ``ffn_up_exps`` / ``ffn_down_exps`` (ggml's shapes: {H, I, E}, {H, I, E}, {I, H, E}):

* Qwen3-MoE checkpoints (as transformers' ``save_pretrained`` writes them) hold one tensor per expert
  (``mlp.experts.N.gate_proj`` ...): stacked here.
* gpt-oss holds ``mlp.experts.gate_up_proj`` (E, H, 2I) with gate and up interleaved along 2I and
  ``down_proj`` (E, I, H): de-interleaved and transposed here, the biases split the same way;
  ``mlp.router`` is ``ffn_gate_inp``, ``post_attention_layernorm`` is ``post_attention_norm``, and
  ``self_attn.sinks`` is ``attn_sinks``. YaRN rope and the 128-token sliding window on every other layer
  (llama.cpp's default pattern for gpt-oss: even layers slide) go in as metadata.

The file is written tensor by tensor (the header from the checkpoint's shapes, then each tensor's bytes),
so memory holds one stacked expert tensor at a time, not the model.

    python benchmarks/moe_gguf.py MODEL_DIR OUT.gguf
"""

from __future__ import annotations

import json
from collections.abc import Callable, Iterator
from functools import partial
from pathlib import Path
from typing import Any

import gguf
import numpy as np
import torch
from gguf_export import _tokenizer_fields
from safetensors import safe_open

from glassbox.models.gguf_names import gguf_tensor_name

ARCHS = {"qwen3_moe": "qwen3moe", "gpt_oss": "gpt-oss"}
BF16 = gguf.GGMLQuantizationType.BF16
F32 = gguf.GGMLQuantizationType.F32

Producer = Callable[[], torch.Tensor]
Planned = tuple[str, tuple[int, ...], Producer]  # GGUF name, numpy-order shape, the tensor


class Checkpoint:
    """Lazy access to a (possibly sharded) safetensors checkpoint by tensor name."""

    def __init__(self, model_dir: Path) -> None:
        index = model_dir / "model.safetensors.index.json"
        if index.is_file():
            where = json.loads(index.read_text())["weight_map"]
        else:
            with safe_open(str(model_dir / "model.safetensors"), framework="pt") as f:
                where = {k: "model.safetensors" for k in f.keys()}
        self.dir, self.where = model_dir, where
        self._open: dict[str, Any] = {}

    def names(self) -> list[str]:
        return list(self.where)

    def _file(self, name: str) -> Any:
        file = self.where[name]
        if file not in self._open:
            self._open[file] = safe_open(str(self.dir / file), framework="pt")
        return self._open[file]

    def get(self, name: str) -> torch.Tensor:
        return self._file(name).get_tensor(name)

    def shape(self, name: str) -> tuple[int, ...]:
        return tuple(self._file(name).get_slice(name).get_shape())

    def stacked(self, pattern: str, n: int) -> torch.Tensor:
        """Tensors ``pattern.format(0..n-1)`` stacked along a new first dim (per-expert -> (E, ...))."""
        return torch.stack([self.get(pattern.format(e)) for e in range(n)])

    def every_other(self, name: str, start: int, transpose: bool) -> torch.Tensor:
        """``name``'s last dim from ``start`` in steps of 2 (de-interleaved), its last two dims swapped
        where ``transpose``."""
        t = self.get(name)[..., start::2]
        return t.transpose(1, 2) if transpose else t

    def transposed(self, name: str) -> torch.Tensor:
        return self.get(name).transpose(1, 2)


def _plan(ck: Checkpoint, cfg: dict[str, Any], arch: str) -> Iterator[Planned]:
    """Every tensor llama.cpp takes, in file order, with its shape (read from the checkpoint's header); the
    names from glassbox's table (models/gguf_names.py), gpt-oss's ``mlp.router`` being glassbox's
    ``mlp.gate``."""

    def same(hf: str) -> Planned:
        return (
            gguf_tensor_name(hf.replace(".mlp.router.", ".mlp.gate."), arch),
            ck.shape(hf),
            partial(ck.get, hf),
        )

    def stacked(hf: str, shape: tuple[int, ...], make: Producer) -> Planned:
        return gguf_tensor_name(hf, arch), shape, make

    names = ck.names()
    for hf in ("model.embed_tokens.weight", "model.norm.weight", "lm_head.weight"):
        if hf in names:
            yield same(hf)
    n_exp = int(cfg.get("num_experts") or cfg["num_local_experts"])
    for layer in range(int(cfg["num_hidden_layers"])):
        pre = f"model.layers.{layer}."
        for hf in sorted(n for n in names if n.startswith(pre) and ".mlp.experts." not in n):
            yield same(hf)
        if arch == "qwen3moe":
            for proj in ("gate_proj", "up_proj", "down_proj"):
                one = f"{pre}mlp.experts.{{}}.{proj}.weight"
                shape = (n_exp, *ck.shape(one.format(0)))
                yield stacked(f"{pre}mlp.experts.{proj}.weight", shape, partial(ck.stacked, one, n_exp))
            continue
        gu, dn = pre + "mlp.experts.gate_up_proj", pre + "mlp.experts.down_proj"
        e, h, i2 = ck.shape(gu)  # (E, H, 2I), gate and up interleaved along 2I
        # -> (E, I, H) each; down (E, I, H) -> (E, H, I); the biases de-interleaved the same way
        experts = f"{pre}mlp.experts."
        yield stacked(experts + "gate_proj.weight", (e, i2 // 2, h), partial(ck.every_other, gu, 0, True))
        yield stacked(experts + "up_proj.weight", (e, i2 // 2, h), partial(ck.every_other, gu, 1, True))
        yield stacked(experts + "down_proj.weight", (e, h, i2 // 2), partial(ck.transposed, dn))
        yield stacked(
            experts + "gate_proj.bias", (e, i2 // 2), partial(ck.every_other, gu + "_bias", 0, False)
        )
        yield stacked(experts + "up_proj.bias", (e, i2 // 2), partial(ck.every_other, gu + "_bias", 1, False))
        yield stacked(experts + "down_proj.bias", ck.shape(dn + "_bias"), partial(ck.get, dn + "_bias"))


def _is_f32(name: str, shape: tuple[int, ...]) -> bool:
    """1-D tensors and every bias (the experts' are 2-D) are f32 in llama.cpp's files; weights bf16."""
    return len(shape) == 1 or name.endswith(".bias")


def _as_stored(name: str, t: torch.Tensor) -> np.ndarray:
    if _is_f32(name, tuple(t.shape)):
        return t.float().contiguous().numpy()
    return t.to(torch.bfloat16).contiguous().view(torch.int16).numpy()  # bf16 bit patterns


def _metadata(w: gguf.GGUFWriter, cfg: dict[str, Any], arch: str, model_dir: Path) -> None:
    hidden, n_head = int(cfg["hidden_size"]), int(cfg["num_attention_heads"])
    head_dim = int(cfg.get("head_dim") or hidden // n_head)
    n_vocab = int(cfg["vocab_size"])
    rope = dict(cfg.get("rope_parameters") or cfg.get("rope_scaling") or {})
    w.add_name(model_dir.name)
    w.add_file_type(int(gguf.LlamaFileType.MOSTLY_BF16))
    w.add_quantization_version(gguf.GGML_QUANT_VERSION)
    w.add_vocab_size(n_vocab)
    w.add_context_length(int(cfg["max_position_embeddings"]))
    w.add_embedding_length(hidden)
    w.add_block_count(int(cfg["num_hidden_layers"]))
    w.add_feed_forward_length(int(cfg["intermediate_size"]))
    w.add_head_count(n_head)
    w.add_head_count_kv(int(cfg["num_key_value_heads"]))
    w.add_key_length(head_dim)
    w.add_value_length(head_dim)
    w.add_rope_dimension_count(head_dim)
    w.add_layer_norm_rms_eps(float(cfg["rms_norm_eps"]))
    w.add_rope_freq_base(float(rope.get("rope_theta", cfg.get("rope_theta", 10000.0))))
    w.add_expert_count(int(cfg.get("num_experts") or cfg["num_local_experts"]))
    w.add_expert_used_count(int(cfg["num_experts_per_tok"]))
    if arch == "qwen3moe":
        w.add_expert_feed_forward_length(int(cfg["moe_intermediate_size"]))
    else:
        w.add_expert_feed_forward_length(int(cfg["intermediate_size"]))
        w.add_sliding_window(int(cfg["sliding_window"]))
        kinds = cfg.get("layer_types") or []
        if any(k != ("sliding_attention" if i % 2 == 0 else "full_attention") for i, k in enumerate(kinds)):
            raise ValueError("gpt-oss export: only the alternating sliding/full layer pattern is written")
    if rope.get("rope_type", "default") == "yarn":
        w.add_rope_scaling_type(gguf.RopeScalingType.YARN)
        w.add_rope_scaling_factor(float(rope["factor"]))
        w.add_rope_scaling_orig_ctx_len(int(rope["original_max_position_embeddings"]))
        w.add_rope_scaling_yarn_beta_fast(float(rope.get("beta_fast", 32.0)))
        w.add_rope_scaling_yarn_beta_slow(float(rope.get("beta_slow", 1.0)))
    elif rope.get("rope_type", "default") != "default":
        raise ValueError(f"rope type {rope.get('rope_type')!r} is not exported")
    vocab = _tokenizer_fields(model_dir, n_vocab)
    w.add_tokenizer_model("gpt2")
    w.add_tokenizer_pre("gpt-2")
    w.add_token_list(vocab["tokens"])
    w.add_token_types(vocab["types"])
    w.add_token_merges(vocab["merges"])
    if vocab["eos"] is not None:
        w.add_eos_token_id(int(vocab["eos"]))
    w.add_add_bos_token(False)
    w.add_add_eos_token(False)


def export_moe_gguf(model_dir: Path, out_path: Path) -> Path:
    """Write ``model_dir`` (a qwen3_moe or gpt_oss checkpoint) as a bf16 GGUF at ``out_path``."""
    model_dir, out_path = Path(model_dir), Path(out_path)
    cfg = json.loads((model_dir / "config.json").read_text())
    if cfg.get("model_type") not in ARCHS:
        raise ValueError(f"model_type {cfg.get('model_type')!r} is not one of {sorted(ARCHS)}")
    if cfg.get("tie_word_embeddings"):
        raise ValueError("tied embeddings are not exported (the benchmark's shapes have an lm_head)")
    arch = ARCHS[cfg["model_type"]]
    ck = Checkpoint(model_dir)
    plan = list(_plan(ck, cfg, arch))
    tmp = out_path.with_suffix(".partial")
    w = gguf.GGUFWriter(str(tmp), arch)
    _metadata(w, cfg, arch, model_dir)
    for name, shape, _ in plan:
        f32 = _is_f32(name, shape)
        nbytes = int(np.prod(shape)) * (4 if f32 else 2)
        w.add_tensor_info(
            name, shape, np.dtype(np.float32 if f32 else np.int16), nbytes, F32 if f32 else BF16
        )
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_ti_data_to_file()
    for name, shape, make in plan:
        data = _as_stored(name, make())
        if data.shape != shape:
            raise ValueError(f"{name}: produced {data.shape}, planned {shape}")
        w.write_tensor_data(data)
        del data
    w.close()
    tmp.rename(out_path)
    return out_path


def quantize_gguf(src: Path, out: Path, ftype: str, threads: int = 2) -> Path:
    """``src`` quantized by llama.cpp's own quantizer (llama-cpp-python's ``llama_model_quantize``) to
    ``ftype``, a llama.cpp file type name ("Q4_K_M", "Q4_0", "MXFP4_MOE", ...): the file llama.cpp and
    glassbox then both load. Kept when already there."""
    import llama_cpp

    if out.is_file():
        return out
    params = llama_cpp.llama_model_quantize_default_params()
    params.ftype = getattr(llama_cpp, f"LLAMA_FTYPE_MOSTLY_{ftype}")
    params.nthread = threads
    tmp = out.with_suffix(".partial")
    rc = llama_cpp.llama_model_quantize(str(src).encode(), str(tmp).encode(), params)
    if rc != 0:
        raise RuntimeError(f"llama_model_quantize({src.name} -> {ftype}) returned {rc}")
    tmp.rename(out)
    return out


if __name__ == "__main__":
    import sys

    if len(sys.argv) != 3:
        raise SystemExit(__doc__)
    out = export_moe_gguf(Path(sys.argv[1]), Path(sys.argv[2]))
    print(f"wrote {out} ({out.stat().st_size / 2**30:.2f} GiB)")
