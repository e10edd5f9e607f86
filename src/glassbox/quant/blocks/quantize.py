"""``--quantization int4|int8|int4-asym`` at load: a float weight rounded into 32-value blocks
(quant/blocks/weights.py ``BlockWeights``), by the C kernel on the CPU (kernels/cpu_quantize.c) or the same
arithmetic in PyTorch ops (``quantize_reference``: any device, and the C kernel's reference)."""

from __future__ import annotations

import torch
import torch.nn.functional as F

from glassbox.quant.blocks.weights import BLOCK, BlockWeights, _pack, native_library


def quantize(weight: torch.Tensor, bits: int, asymmetric: bool = False) -> BlockWeights:
    """32-value blocks of a float weight (N, K), rounded as llama.cpp's reference quantization: symmetric,
    int4 as Q4_0 (d = the block's extreme value / -8), int8 as Q8_0 (d = max|w| / 127); ``asymmetric``
    4-bit as Q4_1 (d = (max - min) / 15 and the min m stored, w = d q + m: 5 bits a weight, a block's range
    used whole); codes from the float32 scale, the scale (and min) stored in float16. On the CPU the C
    kernel (kernels/cpu_quantize.c, the same bytes: ~10x faster), else ``quantize_reference``'s ops."""
    if bits not in (4, 8) or (asymmetric and bits != 4):
        what = "asymmetric blocks are 4 bits" if asymmetric else "block weights are 4 or 8 bits"
        raise ValueError(f"--quantization: {what}, got {bits}")
    lib = native_library()
    w = weight.detach()
    if lib is None or w.device.type != "cpu" or w.dtype not in (torch.float32, torch.bfloat16):
        return quantize_reference(weight, bits, asymmetric)
    w = w.contiguous()
    n, k = w.shape
    nb = -(-k // BLOCK)
    q = torch.empty(n, nb, BLOCK, dtype=torch.uint8)
    d = torch.empty(n, nb, dtype=torch.float16)
    m = torch.empty(n, nb, dtype=torch.float16) if asymmetric else None
    mode = 2 if asymmetric else 1 if bits == 8 else 0
    lib.gb_quantize_blocks(
        w.data_ptr(), int(w.dtype == torch.bfloat16), n, k, mode, q.data_ptr(), d.data_ptr(),
        None if m is None else m.data_ptr(), torch.get_num_threads(),
    )  # fmt: skip
    return _packed(q, d, m, bits, k)


def quantize_reference(weight: torch.Tensor, bits: int, asymmetric: bool = False) -> BlockWeights:
    """``quantize`` in PyTorch ops (any device: the blocks are made there)."""
    w = weight.detach().float()
    n, k = w.shape
    kp = -(-k // BLOCK) * BLOCK
    blocks = F.pad(w, (0, kp - k)).view(n, -1, BLOCK)
    if asymmetric:
        lo, hi = blocks.amin(-1), blocks.amax(-1)
        d = (hi - lo) / 15.0
        inv = torch.where(d != 0, 1.0 / d, 0.0)
        q = torch.trunc((blocks - lo[..., None]) * inv[..., None] + 0.5).clamp(0, 15).to(torch.uint8)
        return _packed(q, d.half(), lo.half(), 4, k)
    if bits == 8:
        d = blocks.abs().amax(-1) / 127.0
        s = torch.where(d[..., None] > 0, blocks / d[..., None], 0.0).round().clamp(-127, 127)
        q = (s + 128).to(torch.uint8)  # the scale is stored in float16, as GGUF does
        return _packed(q, d.half(), None, 8, k)
    idx = blocks.abs().argmax(-1, keepdim=True)
    extreme = blocks.gather(-1, idx).squeeze(-1)  # the signed value of largest magnitude
    d = extreme / -8.0
    inv = torch.where(d != 0, 1.0 / d, 0.0)
    q = (blocks * inv[..., None] + 8.5).floor().clamp(0, 15).to(torch.uint8)
    return _packed(q, d.half(), None, 4, k)


def _packed(q: torch.Tensor, d: torch.Tensor, m: torch.Tensor | None, bits: int, k: int) -> BlockWeights:
    """``quantize``'s codes (N, nb, 32) and float16 scales (and mins) packed, labelled."""
    if m is not None:
        return _pack(q, d, m, 0.0, 4, k, "int4-asym")
    return _pack(q, d, None, -8.0 if bits == 4 else -128.0, bits, k, f"int{bits}")
