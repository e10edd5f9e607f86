"""A GGUF file's MoE experts kept in their GGML types: each layer's stacked ``ffn_*_exps`` tensors (models/
gguf_names.py) as one matrix per expert, held per MoE module (quant/held_experts.py) for the CPU's kernels.
engine/checkpoint.py reads a whole file's, models/gguf_shards.py a tensor-parallel rank's cut of each."""

from __future__ import annotations

import numpy as np

from glassbox.quant.blocks import gguf32, kquant
from glassbox.quant.formats import format_of_ggml
from glassbox.quant.fp4.weights import from_ggml_mxfp4
from glassbox.quant.held_experts import ExpertMatrix, HeldExperts


def gguf_matrix(ggml_type: str, raw: np.ndarray, shape: tuple[int, ...]) -> ExpertMatrix:
    """One matrix's raw blocks (rows, row bytes) of HF shape ``shape``, of a GGML type a format keeps
    (quant/formats.py ``kept_ggml_types``), in the layout its kernels read."""
    fmt = format_of_ggml(ggml_type)
    if fmt is None:
        raise ValueError(f"GGML type {ggml_type} is not kept in its blocks")
    if fmt.family == "fp4":
        return from_ggml_mxfp4(raw, shape)
    return (kquant.from_gguf if ggml_type in kquant.KQUANT_TYPES else gguf32.from_gguf)(ggml_type, raw, shape)


def held_gguf_experts(
    stacked: dict[str, dict[str, list[ExpertMatrix]]], whole: bool = False
) -> tuple[dict[str, HeldExperts], set[str]]:
    """Each MoE module's experts (by projection: gate_proj and up_proj or gate_up_proj, down_proj, a matrix per expert) as
    ``HeldExperts``, and the tensor names taken. The gate and up are held only together (each expert's
    pair then stacks into one matrix when the types match); a projection not held is dequantized into the
    float parameters. With ``whole`` (CUDA's fused block MoE stacks them: quant/blocks/moe_stack.py) a module's
    experts are held only all of them, the gate and up in one type and the down in one."""
    held: dict[str, HeldExperts] = {}
    taken: set[str] = set()
    for module, parts in stacked.items():
        if whole and not _stackable(parts):
            continue
        experts = HeldExperts()
        if "gate_proj" in parts and "up_proj" in parts:
            experts.gate_up = list(zip(parts["gate_proj"], parts["up_proj"], strict=True))
            taken |= {f"{module}.gate_proj.weight", f"{module}.up_proj.weight"}
        elif "gate_up_proj" in parts:  # stored fused (Gemma 4): one (2I, H) matrix per expert
            experts.gate_up = [(w,) for w in parts["gate_up_proj"]]
            taken.add(f"{module}.gate_up_proj.weight")
        if "down_proj" in parts:
            experts.down = parts["down_proj"]
            taken.add(f"{module}.down_proj.weight")
        if experts.gate_up is not None or experts.down is not None:
            held[module] = experts
    return held, taken


def _stackable(parts: dict[str, list[ExpertMatrix]]) -> bool:
    """Whether a module's experts stack for the fused block MoE: every projection held, the gate and up in
    one type, the down in one."""
    if any(p not in parts for p in ("gate_proj", "up_proj", "down_proj")):
        return False
    gate_up = {(type(w), w.label) for w in (*parts["gate_proj"], *parts["up_proj"])}
    return len(gate_up) == 1 and len({(type(w), w.label) for w in parts["down_proj"]}) == 1
