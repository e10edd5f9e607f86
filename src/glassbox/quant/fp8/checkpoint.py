"""FP8 checkpoints (settings in quant/fp8/config.py) read from their safetensors files: each quantized
linear's E4M3 ``weight`` and its scale become ``Fp8Weights`` (quant/fp8/weights.py), kept as stored (one
byte per weight and the scales in float32); every other tensor is handed on as it is, and activation /
KV-cache scales are dropped (weight-only execution, logged once).
"""

from __future__ import annotations

import logging
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import torch
from safetensors import safe_open

from glassbox.models.safetensors_files import safetensors_tensors, weight_files
from glassbox.quant.expert_parts import sort_experts, widened_first
from glassbox.quant.fp8.config import ACTIVATION_PARTS, Fp8Layout, Fp8Spec, fp8_spec
from glassbox.quant.fp8.weights import Fp8Weights
from glassbox.quant.held_experts import HeldExperts

logger = logging.getLogger(__name__)

Tensors = Iterator[tuple[str, torch.Tensor]]
E4M3 = "F8_E4M3"  # safetensors' name of float8_e4m3fn


def scale_values(scale: torch.Tensor, name: str) -> torch.Tensor:
    """A stored scale tensor as float32: float types widened exactly, E8M0 bytes (uint8 or float8_e8m0fnu,
    ``scale_fmt: ue8m0``) as 2^(b - 127)."""
    e8m0 = getattr(torch, "float8_e8m0fnu", None)
    if scale.dtype == torch.uint8 or (e8m0 is not None and scale.dtype == e8m0):
        b = scale.view(torch.uint8)
        if bool((b == 255).any()):
            raise ValueError(f"{name}: E8M0 scale 255 (NaN)")
        return torch.ldexp(torch.ones(b.shape), b.to(torch.int32) - 127)
    if not scale.dtype.is_floating_point or scale.element_size() == 1:
        raise ValueError(f"{name}: scales of dtype {scale.dtype} do not load")
    return scale.to(torch.float32)


def layer_weights(weight: torch.Tensor, scale: torch.Tensor, spec: Fp8Spec, name: str) -> Fp8Weights:
    """One layer's E4M3 weight (N, K) and stored scale as ``Fp8Weights``, in the first of the config's
    layouts that the scale's shape fits; ValueError naming the layer otherwise (or for NaN codes)."""
    if weight.dim() != 2 or weight.dtype != torch.float8_e4m3fn:
        raise ValueError(f"{name}.weight: an FP8 weight is a float8_e4m3fn matrix, got {weight.dtype} "
                         f"{tuple(weight.shape)}")  # fmt: skip
    codes = weight.contiguous().view(torch.uint8)
    if bool(((codes & 0x7F) == 0x7F).any()):
        raise ValueError(f"{name}.weight: NaN codes (S.1111.111) in an FP8 weight")
    s = scale_values(scale, f"{name}.{spec.scale_part}")
    n, k = codes.shape

    def fits(layout: Fp8Layout) -> tuple[torch.Tensor, int, int] | None:
        if layout.strategy == "tensor" and s.numel() == 1:
            return s.reshape(1, 1), n, k
        if layout.strategy == "channel" and tuple(s.shape) in ((n, 1), (n,)):
            return s.reshape(n, 1), 1, k
        if layout.block is not None:
            r, c = layout.block
            if tuple(s.shape) == (-(-n // r), -(-k // c)):
                return s, r, c
        return None

    for layout in spec.layouts:
        found = fits(layout)
        if found is not None:
            grid, rows, cols = found
            return Fp8Weights(codes, grid.contiguous(), rows, cols, layout.label)
    raise ValueError(
        f"{name}.{spec.scale_part}: shape {tuple(s.shape)} fits none of the checkpoint's layouts "
        f"({spec.label}) for a {n}x{k} weight"
    )


def read_fp8(
    model_dir: Path, spec: Fp8Spec, cpu: bool = True
) -> tuple[dict[str, Fp8Weights | HeldExperts], Tensors]:
    """(the FP8 layers as ``Fp8Weights`` by HF weight name and, with ``cpu``, each MoE layer's routed
    experts as ``HeldExperts`` by module name; the other tensors one at a time). Off the CPU the experts
    are handed on dequantized (float32, the format's definition), for the fused MoE's float parameters."""
    files = weight_files(model_dir)
    layers: dict[str, dict[str, torch.Tensor]] = {}
    dropped: set[str] = set()
    for path in files:
        with safe_open(str(path), framework="pt") as f:
            for key in f.keys():  # noqa: SIM118 (safe_open is not a dict)
                prefix, _, part = key.rpartition(".")
                dtype = f.get_slice(key).get_dtype()
                if part == "weight" and dtype == E4M3:
                    layers.setdefault(prefix, {})["weight"] = f.get_tensor(key)
                elif part == spec.scale_part:
                    layers.setdefault(prefix, {})["scale"] = f.get_tensor(key)
                elif part in ACTIVATION_PARTS:
                    dropped.add(key)
                elif dtype.startswith("F8"):
                    raise ValueError(f"{key}: {dtype} tensors do not load (FP8 weights are E4M3)")
    weights: dict[str, Fp8Weights] = {}
    for prefix, parts in layers.items():
        if "weight" not in parts:
            raise ValueError(f"{prefix}.{spec.scale_part}: a scale for a weight that is not FP8")
        if "scale" not in parts:
            raise ValueError(f"{prefix}.weight: an FP8 weight without its {spec.scale_part}")
        weights[prefix] = layer_weights(parts["weight"], parts["scale"], spec, prefix)
    dense, held, widened = sort_experts(weights, cpu, "FP8")
    stored = sum(w.nbytes for w in weights.values()) - sum(w.nbytes for w in widened.values())
    kept: dict[str, Fp8Weights | HeldExperts] = {**dense, **held}
    skip = dropped | {f"{p}.weight" for p in layers} | {f"{p}.{spec.scale_part}" for p in layers}
    logger.info("FP8 weights kept 8-bit: %d linear layers, %d MoE layers' experts (%s), %.1f MiB",
                len(dense), len(held), spec.label, stored / 2**20)  # fmt: skip
    if spec.left_aside:
        logger.info("weight-only FP8: not applied (activations stay in the model's dtype): %s",
                    "; ".join(spec.left_aside))  # fmt: skip

    rest = safetensors_tensors(model_dir, skip)
    return kept, widened_first(widened, lambda w: w.dequantize_reference(torch.float32), rest, "FP8")


def read_checkpoint(
    path: Path, qc: dict[str, Any], device: torch.device, dtype: torch.dtype, cpu: bool
) -> tuple[Tensors, dict[str, Fp8Weights | HeldExperts]] | None:
    """An FP8 checkpoint (quant/fp8/config.py ``fp8_spec``) kept 8-bit on any device and dtype, in the
    readers' shape (quant/formats.py ``reader``); None for other checkpoints."""
    spec = fp8_spec(qc)
    if spec is None:
        return None
    layers, rest = read_fp8(path, spec, cpu)
    return rest, dict(layers)
