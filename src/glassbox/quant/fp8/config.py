"""FP8 (E4M3) weight checkpoints: their ``quantization_config`` read and checked (torch-free).

Two layouts are published and load (quant/fp8/checkpoint.py reads the tensors):

- HF "fp8" (``quant_method: fp8``; Qwen3-*-FP8, DeepSeek-V3, transformers' FineGrainedFP8Config): per
  quantized linear ``weight`` float8_e4m3fn (N, K) and ``weight_scale_inv`` (float32 or bf16) with one value
  per ``weight_block_size`` block, (ceil(N / 128), ceil(K / 128)) for [128, 128]; W = weight * scale_inv
  (the name notwithstanding, a multiplier). ``weight_block_size: null`` means one scale per tensor.
  ``scale_fmt: ue8m0`` scales are powers of two, stored as float32 or as E8M0 bytes (2^(b - 127)).
- compressed-tensors ``float-quantized`` (llm-compressor's FP8, FP8_DYNAMIC, FP8_BLOCK): ``config_groups``
  whose ``weights`` are {num_bits: 8, type: float, symmetric, not dynamic} with strategy "tensor" (a
  ``weight_scale`` of one value), "channel" ((N, 1)) or "block" (``block_structure`` [rows, cols]);
  W = weight * weight_scale. Layers in ``ignore`` (lm_head) are stored in 16 bits.

Activation quantization (HF ``activation_scheme`` dynamic/static with ``activation_scale``; compressed-tensors
``input_activations`` of 8-bit floats with ``input_scale``) is a choice of the GPU kernels that multiply
FP8 by FP8: glassbox runs the weights only (activations stay in the model's dtype, as vLLM's weight-only
FP8 path does on GPUs without FP8 units) and says so in a log line. A KV-cache scheme (``k_scale`` /
``v_scale``) is left aside too (``--kv-cache-dtype`` chooses the cache). Anything else (other widths or
types, zero points, dynamic weights, integer activation quantization, sparsity or transforms) is refused
with the key named.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from glassbox.quant.blocks.ct_int_config import is_int_config
from glassbox.quant.config import quant_method, unsupported_method

# what a checkpoint may carry besides weights and their scales, read and dropped (weight-only execution)
ACTIVATION_PARTS = ("input_scale", "activation_scale", "k_scale", "v_scale", "output_scale")


@dataclass(frozen=True)
class Fp8Layout:
    strategy: str  # "tensor" | "channel" | "block"
    block: tuple[int, int] | None = None  # (rows, cols) of a "block" layout

    @property
    def label(self) -> str:
        if self.block is not None:
            return f"FP8 block {self.block[0]}x{self.block[1]}"
        return f"FP8 per-{self.strategy}"


@dataclass(frozen=True)
class Fp8Spec:
    """An FP8 checkpoint's settings: where each layer's scale is and which layouts it may take."""

    method: str  # "fp8" (HF) | "compressed-tensors"
    scale_part: str  # "weight_scale_inv" | "weight_scale"
    layouts: tuple[Fp8Layout, ...]
    left_aside: tuple[str, ...] = ()  # what weight-only execution does not apply, for the log

    @property
    def label(self) -> str:
        return "+".join(lay.label for lay in self.layouts)


def _unsupported(key: str, value: Any, why: str) -> ValueError:
    return ValueError(f"quantization_config {key}={value!r}: {why}")


def _block(key: str, value: Any) -> tuple[int, int]:
    """[rows, cols] (or compressed-tensors' older "RxC") as two positive ints; ValueError naming ``key``."""
    if isinstance(value, str) and "x" in value:
        value = value.split("x")
    try:
        rows, cols = (int(v) for v in value)
    except (TypeError, ValueError):
        raise _unsupported(key, value, "a block is [rows, cols]") from None
    if rows <= 0 or cols <= 0 or cols % 16:
        raise _unsupported(key, value, "blocks are positive and a multiple of 16 columns wide")
    return rows, cols


def _hf_fp8(qc: dict[str, Any]) -> Fp8Spec:
    fmt = str(qc.get("fmt", "e4m3")).lower()
    if fmt != "e4m3":
        raise _unsupported("fmt", qc.get("fmt"), "FP8 weights load as E4M3 (float8_e4m3fn)")
    scheme = str(qc.get("activation_scheme", "dynamic")).lower()
    if scheme not in ("dynamic", "static"):
        raise _unsupported("activation_scheme", qc.get("activation_scheme"), "known schemes: dynamic, static")
    if str(qc.get("scale_fmt") or "float") not in ("float", "ue8m0"):
        raise _unsupported("scale_fmt", qc.get("scale_fmt"), "scales load as float or ue8m0")
    if str(qc.get("expert_dtype") or "fp8") != "fp8":
        raise _unsupported("expert_dtype", qc.get("expert_dtype"), "only FP8 experts are defined here")
    if qc.get("modules_to_convert"):
        raise _unsupported("modules_to_convert", qc.get("modules_to_convert"), "FP8 embeddings do not load")
    size = qc.get("weight_block_size")
    layout = Fp8Layout("tensor") if size is None else Fp8Layout("block", _block("weight_block_size", size))
    aside = (f"{scheme} FP8 activation quantization (activation_scheme)",)
    return Fp8Spec("fp8", "weight_scale_inv", (layout,), aside)


def _ct_group(name: str, group: dict[str, Any]) -> tuple[Fp8Layout, str | None]:
    """One compressed-tensors config group: its weight layout and the activation quantization it asks for
    (None: none)."""
    key = f"config_groups.{name}"
    w = group.get("weights")
    if not isinstance(w, dict):
        raise _unsupported(f"{key}.weights", w, "a group without weight quantization does not load")
    checks = (("num_bits", 8, "FP8 weights are 8 bits"), ("type", "float", "only float (FP8) weights load"),
              ("symmetric", True, "FP8 weights with zero points do not load"),
              ("dynamic", False, "weights quantized at run time do not load"))  # fmt: skip
    for field, want, why in checks:
        have = w.get(field, want if field in ("symmetric", "dynamic") else None)
        if have != want:
            raise _unsupported(f"{key}.weights.{field}", have, why)
    strategy = str(w.get("strategy"))
    if strategy not in ("tensor", "channel", "block"):
        raise _unsupported(f"{key}.weights.strategy", w.get("strategy"), "FP8 weights load per tensor, "
                           "channel or block")  # fmt: skip
    if w.get("actorder"):
        raise _unsupported(f"{key}.weights.actorder", w.get("actorder"), "no reordering for FP8 weights")
    block = (
        _block(f"{key}.weights.block_structure", w.get("block_structure")) if strategy == "block" else None
    )
    if group.get("output_activations"):
        raise _unsupported(f"{key}.output_activations", group["output_activations"], "output quantization "
                           "does not load")  # fmt: skip
    act = group.get("input_activations")
    if not act:
        return Fp8Layout(strategy, block), None
    if act.get("num_bits") != 8 or act.get("type") != "float":
        raise _unsupported(f"{key}.input_activations", {k: act.get(k) for k in ("num_bits", "type")},
                           "only FP8 activation quantization is left aside; weight-only execution cannot "
                           "stand in for other activation formats")  # fmt: skip
    kind = "dynamic" if act.get("dynamic") else "static"
    return Fp8Layout(strategy, block), f"{kind} FP8 activation quantization ({key}.input_activations)"


def _compressed_tensors(qc: dict[str, Any]) -> Fp8Spec | None:
    fmt = str(qc.get("format") or "")
    if "fp4" in fmt or is_int_config(qc):
        return None  # 4-bit float formats: not FP8; integer weights: quant/blocks/ct_int.py
    groups = qc.get("config_groups") or {}
    if not isinstance(groups, dict) or not groups:
        raise _unsupported("config_groups", groups, "no quantized weights are described")
    if qc.get("transform_config"):
        raise _unsupported(
            "transform_config", qc["transform_config"], "transforms (rotations) are not applied"
        )
    sparsity = qc.get("sparsity_config") or {}
    if sparsity and str(sparsity.get("format", "dense")) != "dense":
        raise _unsupported("sparsity_config.format", sparsity.get("format"), "sparse weights do not load")
    layouts: list[Fp8Layout] = []
    aside: list[str] = []
    for name, group in groups.items():
        gfmt = str(group.get("format") or fmt)
        if gfmt not in ("float-quantized", "naive-quantized"):
            where = f"config_groups.{name}.format" if group.get("format") else "format"
            raise _unsupported(where, gfmt or None, "FP8 weights load from the float-quantized format")
        layout, act = _ct_group(name, group)
        if layout not in layouts:
            layouts.append(layout)
        if act is not None and act not in aside:
            aside.append(act)
    if qc.get("kv_cache_scheme"):
        aside.append("the KV-cache scheme (kv_cache_scheme; --kv-cache-dtype chooses the cache)")
    return Fp8Spec("compressed-tensors", "weight_scale", tuple(layouts), tuple(aside))


def fp8_spec(qc: dict[str, Any]) -> Fp8Spec | None:
    """The FP8 settings of a ``quantization_config``: None for methods other than HF "fp8" and
    compressed-tensors (and for compressed-tensors' 4-bit float formats); ValueError naming the key and
    value of a setting that does not load, and for the FP8 methods that do not (fbgemm_fp8, ModelOpt FP8)."""
    method = quant_method(qc)
    if method == "fp8":
        return _hf_fp8(qc)
    if method == "compressed-tensors":
        return _compressed_tensors(qc)
    if method == "fbgemm_fp8":
        raise unsupported_method(method, "FP8 loads from the fp8 and compressed-tensors layouts")
    algo = str(qc.get("quant_algo", "")).upper()
    if method == "modelopt" and "FP8" in algo and "FP4" not in algo:
        raise _unsupported("quant_algo", qc.get("quant_algo"), "ModelOpt FP8 checkpoints do not load yet")
    return None
