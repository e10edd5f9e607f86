"""Checkpoints (Hugging Face directories) whose weights are 4-bit floats, kept packed at load
(quant/fp4/weights.py) and run by quant/fp4/linear.py (linears) and models/moe.py (routed experts).

NVIDIA ModelOpt NVFP4: the settings come from ``quantization_config`` (config.json: ``quant_method``
"modelopt", ``quant_algo`` "NVFP4", ``group_size``, ``ignore``; or the older hf_quant_config.json's
``quantization`` section, folded in by models/config_reader.py: ``quant_algo``, ``group_size``,
``exclude_modules``). A quantized linear ``P`` stores ``P.weight`` uint8 (N, K/2) (value 2i in the low
nibble of byte i), ``P.weight_scale`` float8_e4m3fn (N, K/16), ``P.weight_scale_2`` float32 (the
per-tensor scale) and ``P.input_scale`` float32 (the activations' scale for NVFP4 x NVFP4 GEMMs: glassbox
runs the weights only, with activations in bf16/float32 or its own int8 blocks, so it is not read).
Layers without ``weight_scale`` (the excluded ones: lm_head, routers, ...) load as float tensors.
A mixture-of-experts checkpoint's routed experts (``...experts.E.gate_proj`` etc., one NVFP4 linear each)
are held by MoE layer (quant/expert_parts.py); under tensor parallelism they are refused (quant/fp4/shards.py).

gpt-oss's MXFP4 (``quant_method`` "mxfp4"): each MoE layer's experts store ``E.gate_up_proj_blocks``
(E, 2I, H/32, 16) uint8, ``E.gate_up_proj_scales`` (E, 2I, H/32) E8M0, and the same for ``down_proj``
(E, H, I/32, 16) / (E, H, I/32); their biases and everything else (attention, router, embeddings,
lm_head: ``modules_to_not_convert``) are float tensors.
"""

from __future__ import annotations

import importlib.util
from collections.abc import Iterator
from contextlib import ExitStack
from dataclasses import dataclass
from fnmatch import fnmatch
from pathlib import Path
from typing import Any

import torch
from safetensors import safe_open

from glassbox.models.safetensors_files import weight_files
from glassbox.quant.config import quant_method
from glassbox.quant.expert_parts import sort_experts
from glassbox.quant.fp4.weights import FP4Weights, from_nvfp4, mxfp4_experts
from glassbox.quant.held_experts import HeldExperts

Tensors = Iterator[tuple[str, torch.Tensor]]
EXPERT_PARTS = ("gate_up_proj_blocks", "gate_up_proj_scales", "down_proj_blocks", "down_proj_scales")
PARTS = ("weight", "weight_scale", "weight_scale_2", "input_scale")
ALGOS = ("NVFP4", "W4A16_NVFP4")  # the same weights; W4A16 stores no input_scale


@dataclass(frozen=True)
class NVFP4Spec:
    algo: str
    exclude: tuple[str, ...]  # module name patterns (fnmatch) the checkpoint left unquantized

    @property
    def label(self) -> str:
        return "NVFP4"


def nvfp4_spec(qc: dict[str, Any]) -> NVFP4Spec | None:
    """The NVFP4 settings of a ``quantization_config`` (None for other methods and ModelOpt's FP8);
    ValueError naming the key and value of a 4-bit setting the loader cannot run."""
    if not quant_method(qc).startswith("modelopt"):
        return None
    section = qc.get("quantization")
    src: dict[str, Any] = section if isinstance(section, dict) else qc
    algo = str(src.get("quant_algo", "")).upper()
    if "FP4" not in algo:
        return None
    if algo not in ALGOS:
        raise ValueError(f"quantization_config quant_algo={algo!r}: ModelOpt checkpoints load as NVFP4 "
                         f"({', '.join(ALGOS)}) only")  # fmt: skip
    group = src.get("group_size")
    for g in (src.get("config_groups") or {}).values():  # compressed-tensors style groups
        if group is None and isinstance(g, dict):
            group = (g.get("weights") or {}).get("group_size")
    if group is not None and int(group) != 16:
        raise ValueError(f"quantization_config group_size={group!r}: NVFP4 loads scales per 16 values")
    exclude = src.get("exclude_modules", src.get("ignore")) or []
    if not isinstance(exclude, list):
        raise ValueError(f"quantization_config exclude_modules/ignore={exclude!r}: expected a list")
    return NVFP4Spec(algo, tuple(str(e) for e in exclude))


def _excluded(spec: NVFP4Spec, module: str) -> bool:
    return any(module == p or fnmatch(module, p) for p in spec.exclude)


def layer_weights(spec: NVFP4Spec, parts: dict[str, torch.Tensor], name: str) -> FP4Weights:
    """One linear's stored tensors as packed weights; ``name`` (the module) for errors."""
    missing = [p for p in PARTS[:3] if p not in parts]
    if missing:
        raise ValueError(f"{name}: NVFP4 layer without {', '.join(missing)}")
    if _excluded(spec, name):
        raise ValueError(f"{name}: stored in NVFP4 but quantization_config excludes it")
    try:
        return from_nvfp4(parts["weight"], parts["weight_scale"], parts["weight_scale_2"], spec.label)
    except ValueError as e:
        raise ValueError(f"{name}: {e}") from None


def is_mxfp4(qc: dict[str, Any]) -> bool:
    """Whether a ``quantization_config`` is gpt-oss's MXFP4."""
    return quant_method(qc) == "mxfp4"


def is_fp4(qc: dict[str, Any]) -> bool:
    """Whether a ``quantization_config`` is a 4-bit float one (NVFP4 or MXFP4)."""
    return nvfp4_spec(qc) is not None or is_mxfp4(qc)


class SafetensorsFiles:
    """A checkpoint's safetensors files open at once (for the life of ``stack``): any tensor whole or
    sliced (``get_slice``: only the slice's bytes are read) by name."""

    def __init__(self, stack: ExitStack, files: list[Path]) -> None:
        handles = [stack.enter_context(safe_open(str(p), framework="pt")) for p in files]
        self.where = {key: h for h in handles for key in h.keys()}  # noqa: SIM118 (safe_open is not a dict)

    def slice(self, name: str) -> Any:
        return self.where[name].get_slice(name)

    def tensor(self, name: str) -> torch.Tensor:
        return self.where[name].get_tensor(name)

    def need(self, prefix: str, parts: tuple[str, ...], what: str) -> list[str]:
        """The names ``prefix.part`` of ``parts``; ValueError naming the missing ones."""
        names = [f"{prefix}.{part}" for part in parts]
        missing = [part for part, n in zip(parts, names, strict=True) if n not in self.where]
        if missing:
            raise ValueError(f"{what} without {', '.join(missing)}")
        return names


def read_nvfp4(model_dir: Path, spec: NVFP4Spec) -> tuple[dict[str, FP4Weights | HeldExperts], Tensors]:
    """(the NVFP4 linears as packed weights by HF weight name and each MoE layer's routed experts, stored
    one linear per expert and projection, held by module name (quant/expert_parts.py; on CUDA stacked for
    the fused block MoE as MXFP4's are); the other tensors one at a time)."""
    files = weight_files(model_dir)
    layers = {}
    with ExitStack() as stack:
        f = SafetensorsFiles(stack, files)
        quantized = sorted(k.removesuffix(".weight_scale") for k in f.where if k.endswith(".weight_scale"))
        for prefix in quantized:
            names = [f"{prefix}.{part}" for part in PARTS[:3] if f"{prefix}.{part}" in f.where]
            parts = {n.rpartition(".")[2]: f.tensor(n) for n in names}
            layers[prefix] = layer_weights(spec, parts, prefix)
    dense, held, _ = sort_experts(layers, True, "NVFP4")
    return {**dense, **held}, _floats(files, {f"{p}.{part}" for p in quantized for part in PARTS})


def _floats(files: list[Path], skip: set[str]) -> Tensors:
    """The tensors not in ``skip``, one at a time; ValueError on a packed (uint8) weight left over."""
    for path in files:
        with safe_open(str(path), framework="pt") as f:
            for key in f.keys():  # noqa: SIM118
                if key in skip:
                    continue
                tensor = f.get_tensor(key)
                if tensor.dtype == torch.uint8 and key.endswith(("weight", "_blocks")):
                    raise ValueError(f"{key}: a packed uint8 tensor without the scales this loader reads")
                yield key, tensor


def read_mxfp4_experts(model_dir: Path) -> tuple[dict[str, HeldExperts], Tensors]:
    """(each MoE layer's experts by module name, the other tensors one at a time) of a gpt-oss MXFP4
    checkpoint."""
    files = weight_files(model_dir)
    experts: dict[str, HeldExperts] = {}
    with ExitStack() as stack:
        f = SafetensorsFiles(stack, files)
        layers = sorted({k.rpartition(".")[0] for k in f.where if k.endswith(EXPERT_PARTS)})
        for prefix in layers:
            try:
                gb, gs, db, ds = (f.tensor(n) for n in f.need(prefix, EXPERT_PARTS, "MXFP4 experts"))
                gate_up, down = mxfp4_experts(gb, gs), mxfp4_experts(db, ds)
            except ValueError as e:
                raise ValueError(f"{prefix}: {e}") from None
            experts[prefix] = HeldExperts([(w,) for w in gate_up], down)
    skip = {f"{p}.{part}" for p in layers for part in EXPERT_PARTS}
    return experts, _floats(files, skip)


def read_fp4(
    model_dir: Path, qc: dict[str, Any], device: torch.device, dtype: torch.dtype
) -> tuple[dict[str, FP4Weights | HeldExperts], Tensors] | None:
    """A 4-bit float checkpoint's packed weights by HF name (NVFP4 linears by weight name, MXFP4 experts
    by module name) and its other tensors; None for other checkpoints. ValueError for settings the loader
    cannot run, or where no kernel runs them: the CPU in bf16 or float32; CUDA with triton in bf16, float16 or
    float32: NVFP4 linears on the block kernels (quant/fp4/triton.py), MXFP4 experts held for the fused
    block MoE (kernels/triton_block_moe.py)."""
    nvfp4 = nvfp4_spec(qc)
    mxfp4 = is_mxfp4(qc)
    if nvfp4 is None and not mxfp4:
        return None
    cuda = device.type == "cuda" and importlib.util.find_spec("triton") is not None
    if cuda and dtype not in (torch.bfloat16, torch.float16, torch.float32):
        raise ValueError(f"{'NVFP4' if nvfp4 else 'MXFP4'} weights run in bf16, float16 or float32 on CUDA "
                         f"(got {dtype})")  # fmt: skip
    if not cuda and (device.type != "cpu" or dtype not in (torch.bfloat16, torch.float32)):
        where = "on the CPU in bf16 or float32, and on CUDA with triton"
        raise ValueError(
            f"{'NVFP4' if nvfp4 else 'MXFP4'} weights run {where} (got {device.type}, {dtype}): use --device cpu"
        )
    if nvfp4 is not None:
        linears, rest = read_nvfp4(model_dir, nvfp4)
        return dict(linears), rest
    experts, rest = read_mxfp4_experts(
        model_dir
    )  # CUDA: stacked for the fused block MoE (quant/blocks/moe_stack.py)
    return dict(experts), rest


def read_checkpoint(
    path: Path, qc: dict[str, Any], device: torch.device, dtype: torch.dtype, cpu: bool
) -> tuple[Tensors, dict[str, FP4Weights | HeldExperts]] | None:
    """``read_fp4`` in the readers' shape (quant/formats.py ``reader``): (the float tensors, the kept)."""
    fp4 = read_fp4(path, qc, device, dtype)
    return None if fp4 is None else (fp4[1], fp4[0])
