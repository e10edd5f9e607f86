"""GPTQ and AWQ checkpoints (Hugging Face directories) repacked at load into block weights
(quant/blocks/weights.py), read from their standard definitions:

- GPTQ (AutoGPTQ / GPTQModel / optimum): ``qweight`` int32 (K / p, N) holding p = 32 / bits codes along
  the input dim K, lowest bits first; ``qzeros`` int32 (G, N / p) along N the same way; ``scales`` float16
  (G, N); ``g_idx`` int32 (K,) each input channel's group (act-order makes it non-monotonic).
  W[n, k] = scales[g, n] (q[k, n] - z[g, n]), g = g_idx[k]; the classic format stores z - 1.
- AWQ (GEMM layout): ``qweight`` int32 (K, N / 8) along N in the order 0, 2, 4, 6, 1, 3, 5, 7 (nibble j of
  word c holds column 8 c + ORDER[j]); ``qzeros`` (G, N / 8) the same; ``scales`` (G, N); g = k // group.

Each layer becomes 32-value blocks of its codes with its group's scale and integer zero repeated over the
group's blocks (W = d (q - z), exact). Act-order layers keep their input channels sorted by group and the
permutation (the linear applies it to its input).
"""

from __future__ import annotations

import importlib.util
from collections.abc import Iterator
from dataclasses import dataclass, replace
from pathlib import Path

import torch
from safetensors import safe_open

from glassbox.models.safetensors_files import safetensors_tensors, weight_files
from glassbox.quant.blocks.weights import BLOCK, BlockWeights, from_zero_codes
from glassbox.quant.config import GroupQuant
from glassbox.quant.expert_parts import is_expert, sort_experts, widened_first
from glassbox.quant.held_experts import HeldExperts

PARTS = ("qweight", "qzeros", "scales", "g_idx")
AWQ_ORDER = (0, 2, 4, 6, 1, 3, 5, 7)
Tensors = Iterator[tuple[str, torch.Tensor]]


def unpack_words(words: torch.Tensor, bits: int) -> torch.Tensor:
    """int32 words (..., W) to their 32 / bits codes each, lowest bits first: (..., W, 32 / bits) int32."""
    shifts = torch.arange(0, 32, bits, dtype=torch.int32)
    return (words.to(torch.int32).unsqueeze(-1) >> shifts) & ((1 << bits) - 1)


def gptq_codes(
    qweight: torch.Tensor, qzeros: torch.Tensor, bits: int, zero_minus_one: bool
) -> tuple[torch.Tensor, torch.Tensor]:
    """GPTQ's codes q (K, N) and zeros z (G, N), int32."""
    q = unpack_words(qweight, bits)  # (K / p, N, p): code k = p * row + i
    q = q.permute(0, 2, 1).reshape(-1, qweight.shape[1])
    z = unpack_words(qzeros, bits).reshape(qzeros.shape[0], -1)
    return q, z + 1 if zero_minus_one else z


def awq_codes(qweight: torch.Tensor, qzeros: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """AWQ's codes q (K, N) and zeros z (G, N), int32 (its nibbles back in column order)."""

    def columns(words: torch.Tensor) -> torch.Tensor:
        nibbles = unpack_words(words, 4)  # (rows, N / 8, 8): nibble j holds column ORDER[j]
        out = torch.empty_like(nibbles)
        out[..., list(AWQ_ORDER)] = nibbles
        return out.reshape(words.shape[0], -1)

    return columns(qweight), columns(qzeros)


def to_blocks(
    q: torch.Tensor, z: torch.Tensor, scales: torch.Tensor, groups: torch.Tensor, bits: int, label: str
) -> BlockWeights:
    """Codes q (K, N), zeros z (G, N), float16 scales (G, N) and each input channel's group (K,) as block
    weights (N x K): channels sorted by group (stably; a permutation kept when that moves any), each
    32-block within one group. ValueError when a group's channels do not fill whole blocks."""
    k, n = q.shape
    if scales.shape != z.shape or scales.shape[1] != n or groups.shape != (k,):
        raise ValueError(f"shapes do not fit: codes {tuple(q.shape)}, zeros {tuple(z.shape)}, "
                         f"scales {tuple(scales.shape)}, groups {tuple(groups.shape)}")  # fmt: skip
    groups = groups.to(torch.int64)
    if int(groups.min()) < 0 or int(groups.max()) >= scales.shape[0]:
        raise ValueError(f"group index out of range (0..{scales.shape[0] - 1})")
    if int(z.max()) > 255 or int(z.min()) < 0:
        raise ValueError(f"zero point {int(z.max())} does not fit 8 bits")
    perm = torch.sort(groups, stable=True).indices
    moved = not torch.equal(perm, torch.arange(k))
    sorted_groups = groups[perm]
    nb = -(-k // BLOCK)
    padded = torch.cat([sorted_groups, sorted_groups[-1:].expand(nb * BLOCK - k)]).view(nb, BLOCK)
    if not bool((padded == padded[:, :1]).all()):
        bad = int(padded[(padded != padded[:, :1]).any(-1)][0, 0])
        raise ValueError(
            f"group {bad} holds {int((groups == bad).sum())} input channels: block weights need groups of "
            f"whole {BLOCK}-channel blocks"
        )
    block_group = padded[:, 0]  # (nb,)
    codes = q[perm].t() if moved else q.t()  # (N, K)
    codes = torch.nn.functional.pad(codes, (0, nb * BLOCK - k)).to(torch.uint8).view(n, nb, BLOCK)
    d = scales.t()[:, block_group].to(torch.float16)
    zeros = z.t()[:, block_group].to(torch.uint8)
    return from_zero_codes(codes.numpy(), d.numpy(), zeros.numpy(), bits, k, label, perm if moved else None)


@dataclass
class GroupCodes:
    """One layer as the integer formats define it, input channels first: codes q (K, N), zero codes z
    (G, N), float16 scales (G, N) and each input channel's group (K,). ``blocks`` repacks it; ``rows`` and
    ``cols`` cut a tensor-parallel shard (quant/shards.py)."""

    q: torch.Tensor
    z: torch.Tensor
    scales: torch.Tensor
    groups: torch.Tensor
    bits: int
    label: str

    def blocks(self, name: str) -> BlockWeights:
        """The block weights; ValueError naming ``name`` where a group does not fill whole blocks."""
        try:
            return to_blocks(self.q, self.z, self.scales, self.groups, self.bits, self.label)
        except ValueError as e:
            raise ValueError(f"{name}: {e}") from None

    def rows(self, a: int, b: int) -> GroupCodes:
        """Output rows a..b."""
        return replace(self, q=self.q[:, a:b], z=self.z[:, a:b], scales=self.scales[:, a:b])

    def cols(self, a: int, b: int) -> GroupCodes:
        """Input channels a..b (with their groups' scales and zeros: the others go unused)."""
        return replace(self, q=self.q[a:b], groups=self.groups[a:b])


def layer_codes(spec: GroupQuant, parts: dict[str, torch.Tensor], name: str) -> GroupCodes:
    """One layer's stored tensors (``PARTS``, g_idx optional) as codes; ``name`` for errors."""
    missing = [p for p in PARTS[:3] if p not in parts]
    if missing:
        raise ValueError(f"{name}: {spec.method.upper()} layer without {', '.join(missing)}")
    scales = parts["scales"]
    if spec.method == "awq":
        q, z = awq_codes(parts["qweight"], parts["qzeros"])
    else:
        q, z = gptq_codes(parts["qweight"], parts["qzeros"], spec.bits, spec.zero_minus_one)
    k = q.shape[0]
    groups = parts.get("g_idx")
    if groups is None:
        size = k if spec.group_size == -1 else spec.group_size
        groups = torch.arange(k) // size
    return GroupCodes(q, z[:, : q.shape[1]], scales, groups, spec.bits, spec.label)


def layer_blocks(spec: GroupQuant, parts: dict[str, torch.Tensor], name: str) -> BlockWeights:
    """One layer's stored tensors as block weights; ``name`` for errors."""
    return layer_codes(spec, parts, name).blocks(name)


def read_group_quant(
    model_dir: Path, spec: GroupQuant, cpu: bool = True
) -> tuple[dict[str, BlockWeights | HeldExperts], Tensors]:
    """(the quantized layers as block weights by HF weight name and, with ``cpu``, each MoE layer's routed
    experts as ``HeldExperts`` by module name; the other tensors one at a time). Off the CPU the experts
    are handed on dequantized (float32, the formula's values) for the fused MoE's float parameters."""
    files = weight_files(model_dir)
    layers: dict[str, dict[str, torch.Tensor]] = {}
    for path in files:
        with safe_open(str(path), framework="pt") as f:
            for key in f.keys():  # noqa: SIM118 (safe_open is not a dict)
                prefix, _, part = key.rpartition(".")
                if part in PARTS:
                    layers.setdefault(prefix, {})[part] = f.get_tensor(key)
    quantized = {p: parts for p, parts in layers.items() if "qweight" in parts}
    blocks = {p: layer_blocks(spec, parts, p) for p, parts in quantized.items()}
    skip = {f"{p}.{part}" for p, parts in quantized.items() for part in parts}
    return with_experts(blocks, cpu, spec.label, model_dir, skip)


def with_experts(
    blocks: dict[str, BlockWeights], cpu: bool, what: str, model_dir: Path, skip: set[str]
) -> tuple[dict[str, BlockWeights | HeldExperts], Tensors]:
    """Block weights by module name sorted into dense layers and routed experts (quant/expert_parts.py),
    and the checkpoint's other tensors (all but ``skip``) after any experts widened: the experts are held on
    the CPU, and off it for CUDA's fused block MoE unless one is act-order (its permuted input channels: the
    block MoE has none; widened to float32 then)."""
    act_order = any(w.perm is not None for p, w in blocks.items() if is_expert(p))
    dense, held, widened = sort_experts(blocks, cpu or not act_order, what)
    rest = safetensors_tensors(model_dir, skip)
    return {**dense, **held}, widened_first(widened, lambda w: w.dense(torch.float32), rest, what)


def check_runs(method: str, device: torch.device, dtype: torch.dtype) -> None:
    """ValueError unless the block kernels run here: the CPU in bf16 or float32, CUDA with triton (the
    Triton kernels, kernels/triton_block_linear.py) in bf16, float16 or float32. ``method`` names the
    checkpoint's format in the messages ("GPTQ", "AWQ", "compressed-tensors int")."""
    if device.type == "cuda":
        if importlib.util.find_spec("triton") is None:
            raise ValueError(f"{method} weights on CUDA need triton (pip install triton)")
        if dtype not in (torch.bfloat16, torch.float16, torch.float32):
            raise ValueError(f"{method} weights run in bf16, float16 or float32, got {dtype}")
        return
    if device.type != "cpu" or dtype not in (torch.bfloat16, torch.float32):
        raise ValueError(
            f"{method} weights run on the CPU in bf16 or float32 and on CUDA (got {device.type}, {dtype})"
        )
