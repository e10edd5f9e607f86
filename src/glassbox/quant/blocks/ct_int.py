"""compressed-tensors integer weights (llm-compressor's W4A16, W8A16 and W8A8 checkpoints) repacked at load
into block weights (quant/blocks/weights.py), read from the format's definition:

- ``pack-quantized`` (W4A16 / W8A16, GPTQ or round-to-nearest): per quantized linear ``weight_packed`` int32
  (N, K b / 32) holding 32 / b codes a word along K, lowest bits first, each the signed code plus 2^(b-1);
  ``weight_scale`` (N, G) in the model's dtype, G groups of ``group_size`` input channels (strategy "group"),
  or one per row ("channel") or per tensor ("tensor"); ``weight_shape`` (N, K); for asymmetric weights
  ``weight_zero_point`` int32 packed the same way along N, (N b / 32, G); with activation ordering by group
  (``actorder: group``, older checkpoints) ``weight_g_idx`` (K,), each input channel's group.
- ``int-quantized`` / ``naive-quantized`` (W8A8 and W8A16 int8): ``weight`` int8 (N, K), signed codes, and the
  same ``weight_scale`` (and int8 ``weight_zero_point`` (N, G) if asymmetric).

W[n, k] = scale[n, g] (q[n, k] - z[n, g]), g = g_idx[k] (k // group_size without it), q and z signed (z = 0
when symmetric). Held as unsigned codes q + 2^(b-1) with zero codes z + 2^(b-1), a group's scale (float16)
and zero repeated over its 32-value blocks (gptq_awq.to_blocks: W = d (q - z), exact where the scale is a
float16 value). Integer activation quantization (W8A8's ``input_activations``) is left aside: glassbox runs
the weights only, activations in the model's dtype, and says so in a log line. Layers in ``ignore`` are
stored in 16 bits and load as such. Anything else (other widths, block strategies, dynamic weights, output
quantization, transforms, sparsity) is refused with the key named.
"""

from __future__ import annotations

import logging
from pathlib import Path

import torch
from safetensors import safe_open

from glassbox.models.safetensors_files import weight_files
from glassbox.quant.blocks.ct_int_config import CtIntSpec
from glassbox.quant.blocks.gptq_awq import GroupCodes, Tensors, unpack_words, with_experts
from glassbox.quant.blocks.weights import BlockWeights
from glassbox.quant.held_experts import HeldExperts

logger = logging.getLogger(__name__)

PARTS = ("weight_packed", "weight_scale", "weight_zero_point", "weight_g_idx", "weight_shape")
ACTIVATION_PARTS = (
    "input_scale",
    "input_zero_point",
    "output_scale",
    "output_zero_point",
    "k_scale",
    "v_scale",
)


def _unsigned(t: torch.Tensor, offset: int) -> torch.Tensor:
    """Stored signed codes (int8, or any integer type) as unsigned int32 (code + ``offset``)."""
    return t.to(torch.int32) + offset


def _unpack_k(words: torch.Tensor, bits: int, k: int) -> torch.Tensor:
    """(R, W) int32 words packed along their rows' length to (R, k) unsigned codes."""
    return unpack_words(words, bits).reshape(words.shape[0], -1)[:, :k]


def _groups(
    spec: CtIntSpec, k: int, ngroups: int, g_idx: torch.Tensor | None, name: str
) -> tuple[torch.Tensor, str]:
    """Each input channel's group (K,), and the grouping for the label ("g128", "channel")."""
    if ngroups == 1:
        return torch.zeros(k, dtype=torch.int64), "channel"
    for size in spec.group_sizes:
        if -(-k // size) == ngroups:
            return (torch.arange(k) // size if g_idx is None else g_idx.to(torch.int64)), f"g{size}"
    raise ValueError(f"{name}: {ngroups} scale groups over {k} input channels fit no group_size of the "
                     f"config ({', '.join(map(str, spec.group_sizes)) or 'none'})")  # fmt: skip


def layer_blocks(spec: CtIntSpec, parts: dict[str, torch.Tensor], name: str) -> BlockWeights:
    """One linear's stored tensors as block weights; ``name`` (the module) for errors."""
    return layer_codes(spec, parts, name).blocks(name)


def layer_codes(spec: CtIntSpec, parts: dict[str, torch.Tensor], name: str) -> GroupCodes:
    """One linear's stored tensors (``PARTS``, or an int8 ``weight`` and its ``weight_scale``) as codes
    (gptq_awq.GroupCodes); ``name`` (the module) for errors."""
    scale = parts.get("weight_scale")
    if scale is None:
        raise ValueError(f"{name}: an integer weight without its weight_scale")
    if "weight_packed" in parts:
        words = parts["weight_packed"]
        n = int(words.shape[0])
        shape = parts.get("weight_shape")
        k = int(shape[1]) if shape is not None else words.shape[1] * 32 // spec.bits[0]
        fits = [b for b in spec.bits if -(-k * b // 32) == words.shape[1]]
        if not fits:
            raise ValueError(f"{name}: weight_packed {tuple(words.shape)} holds no {spec.bits}-bit codes of "
                             f"{k} input channels")  # fmt: skip
        bits = fits[0]
        q = _unpack_k(words, bits, k)  # (N, K), already unsigned (code + 2^(bits-1))
    else:
        w = parts.get("weight")
        if w is None or w.dtype != torch.int8:
            got = "no weight" if w is None else f"a {w.dtype} weight"
            raise ValueError(f"{name}: weight_scale beside {got} (int8 codes or weight_packed expected)")
        n, k = (int(s) for s in w.shape)
        bits = 8
        q = _unsigned(w, 128)
    offset = 1 << (bits - 1)
    scale = scale.reshape(n, -1) if scale.numel() != 1 else scale.reshape(1, 1).expand(n, 1)
    ngroups = int(scale.shape[1])
    zp = parts.get("weight_zero_point")
    if zp is None:
        z = torch.full((n, ngroups), offset, dtype=torch.int32)
    elif zp.dtype == torch.int32 and "weight_packed" in parts:  # packed along N
        z = _unpack_k(zp.t().contiguous(), bits, n).t()
    else:
        z = _unsigned(zp.reshape(n, -1) if zp.numel() != 1 else zp.reshape(1, 1).expand(n, 1), offset)
    if z.shape != scale.shape:
        raise ValueError(f"{name}: weight_zero_point {tuple(z.shape)} does not fit weight_scale "
                         f"{tuple(scale.shape)}")  # fmt: skip
    d = scale.to(torch.float16)
    if not torch.equal(d.to(scale.dtype), scale):
        logger.warning("%s: weight_scale rounded to float16 (%s values outside its exact range)", name,
                       int((d.to(scale.dtype) != scale).sum()))  # fmt: skip
    groups, grouping = _groups(spec, k, ngroups, parts.get("weight_g_idx"), name)
    return GroupCodes(q.t(), z.t(), d.t(), groups, bits, f"CT int{bits} {grouping}")


def read_ct_int(
    model_dir: Path, spec: CtIntSpec, cpu: bool = True
) -> tuple[dict[str, BlockWeights | HeldExperts], Tensors]:
    """(the quantized layers as block weights by HF weight name and, with ``cpu``, each MoE layer's routed
    experts as ``HeldExperts`` by module name; the other tensors one at a time; off the CPU the experts
    widened to float32: gptq_awq.with_experts)."""
    layers: dict[str, dict[str, torch.Tensor]] = {}
    int8: dict[str, torch.Tensor] = {}  # int-quantized: the signed weights, by module
    dropped: set[str] = set()
    for path in weight_files(model_dir):
        with safe_open(str(path), framework="pt") as f:
            for key in f.keys():  # noqa: SIM118 (safe_open is not a dict)
                prefix, _, part = key.rpartition(".")
                if part in PARTS:
                    layers.setdefault(prefix, {})[part] = f.get_tensor(key)
                elif part in ACTIVATION_PARTS:
                    dropped.add(key)
                elif part == "weight" and f.get_slice(key).get_dtype() == "I8":
                    int8[prefix] = f.get_tensor(key)
    for prefix, w in int8.items():
        layers.setdefault(prefix, {})["weight"] = w
    blocks = {p: layer_blocks(spec, parts, p) for p, parts in layers.items()}
    skip = dropped | {f"{p}.{part}" for p, parts in layers.items() for part in parts}
    labels = sorted({w.label for w in blocks.values()})
    logger.info("compressed-tensors integer weights kept in blocks: %d linear layers (%s), %.1f MiB",
                len(blocks), ", ".join(labels), sum(w.nbytes for w in blocks.values()) / 2**20)  # fmt: skip
    if spec.left_aside:
        logger.info("weight-only integer weights: not applied (activations stay in the model's dtype): %s",
                    "; ".join(spec.left_aside))  # fmt: skip
    return with_experts(blocks, cpu, "compressed-tensors integer", model_dir, skip)
