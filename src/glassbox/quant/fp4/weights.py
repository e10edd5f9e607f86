"""Weights in 4-bit floating point (E2M1 values), kept packed: MXFP4 and NVFP4.

A code c (4 bits) is the E2M1 value ``E2M1[c]``: {0, 0.5, 1, 1.5, 2, 3, 4, 6} by its low 3 bits, negated
when bit 3 is set. The formats differ in their scales:

- MXFP4 (OCP microscaling; gpt-oss's experts): a byte e per 32 values, the E8M0 scale 2^(e - 127):
  W = value * 2^(e - 127). 4.25 bits per weight.
- NVFP4 (NVIDIA ModelOpt): an FP8 E4M3 scale s per 16 values and a float32 scale g per tensor
  (``weight_scale_2``): W = value * (s * g), the product s * g rounded to float32 first (ModelOpt's own
  dequantization). 4.5 bits per weight; g is kept per row (4 bytes a row) so that q/k/v or gate/up of
  different tensor scales fuse into one matrix.

``FP4Weights`` holds either in the layout kernels/cpu_fp4.c reads (codes interleaved in chunks of 16
32-value blocks, two per byte; the scales as stored, NVFP4's reordered per chunk; see that file). The
checkpoints' own layouts are converted here: gpt-oss's ``*_blocks`` (.., N, K/32, 16) / ``*_scales``
(.., N, K/32) (value 2i in the low nibble of byte i, as transformers' ``convert_moe_packed_tensors``
reads it) and ModelOpt's ``weight`` (N, K/2) uint8 (value 2i low nibble) / ``weight_scale`` (N, K/16)
float8_e4m3fn / ``weight_scale_2``. ``dequantize`` (exact in float32) is the kernels' dequantization,
``dequantize_reference`` the same in PyTorch ops (their reference and the fallback without them).
The quantizers that write those layouts from float weights are in quant/fp4/quantize.py.
"""

from __future__ import annotations

import ctypes
from dataclasses import dataclass

import numpy as np
import torch

BLOCK = 32  # values per block (MXFP4's scale; NVFP4 has one per half block)
CHUNK = 16  # blocks per interleaved chunk
E2M1 = torch.tensor([0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0, -0.0, -0.5, -1.0, -1.5, -2.0, -3.0, -4.0, -6.0])
KINDS = ("mxfp4", "nvfp4")
GROUP = {"mxfp4": 32, "nvfp4": 16}  # values per scale


def native_library() -> ctypes.CDLL | None:
    from glassbox.kernels.native import library

    return library()


@dataclass
class FP4Weights:
    """A weight matrix (N x K) of E2M1 codes: ``codes`` uint8 (N, Kp/2) (Kp: K rounded up to 32),
    ``scales`` uint8 (N, Kp/32) E8M0 (mxfp4) or (N, Kp/16) E4M3 bytes (nvfp4, per chunk the first halves'
    then the second halves'), ``row_scale`` float32 (N,) (nvfp4) or None. Columns past K are zero."""

    codes: torch.Tensor
    scales: torch.Tensor
    row_scale: torch.Tensor | None
    kind: str  # "mxfp4" | "nvfp4"
    in_features: int  # K
    label: str  # for logs and the trace

    @property
    def out_features(self) -> int:
        return int(self.codes.shape[0])

    @property
    def padded(self) -> int:  # Kp
        return int(self.codes.shape[1]) * 2

    @property
    def kind_code(self) -> int:  # the kernels' kind argument
        return KINDS.index(self.kind)

    @property
    def nbytes(self) -> int:
        parts = [self.codes, self.scales, self.row_scale]
        return sum(t.numel() * t.element_size() for t in parts if t is not None)

    def pointers(self) -> tuple[int, int, int | None, int]:
        """(codes, scales, row scales or None, kind): the kernels' weight arguments."""
        g = None if self.row_scale is None else self.row_scale.data_ptr()
        return self.codes.data_ptr(), self.scales.data_ptr(), g, self.kind_code

    def unpacked_codes(self) -> torch.Tensor:
        """(N, Kp) uint8 codes in value order."""
        return deinterleave(self.codes)

    def group_scales(self) -> torch.Tensor:
        """(N, Kp / group) float32: each group's scale in value order (nvfp4: s * g, rounded as ModelOpt)."""
        s = self.scales
        if self.kind == "mxfp4":
            return torch.ldexp(torch.ones(s.shape), s.to(torch.int32) - 127)
        halves = half_order(s.shape[1] // 2, inverse=True)
        s = s[:, halves].view(torch.float8_e4m3fn).float()
        assert self.row_scale is not None
        return s * self.row_scale[:, None]

    def dequantize_reference(self, dtype: torch.dtype = torch.float32) -> torch.Tensor:
        """(N, K) in ``dtype``: value * scale in float32, rounded once (PyTorch ops)."""
        n, kp = self.out_features, self.padded
        values = E2M1[self.unpacked_codes().long()].view(n, -1, GROUP[self.kind])
        w = (values * self.group_scales()[..., None]).view(n, kp)
        return w[:, : self.in_features].to(dtype)

    def dequantize(self, dtype: torch.dtype = torch.float32) -> torch.Tensor:
        """(N, K) in ``dtype`` (float32 or bf16): the kernels' dequantization, else the reference."""
        lib = native_library()
        if lib is None or dtype not in (torch.float32, torch.bfloat16):
            return self.dequantize_reference(dtype)
        out = torch.empty(self.out_features, self.in_features, dtype=dtype)
        codes, scales, g, kind = self.pointers()
        lib.gb_fp4_dequant(
            codes, scales, g, kind, self.out_features, self.padded, self.in_features, out.data_ptr(),
            int(dtype == torch.bfloat16), torch.get_num_threads(),
        )  # fmt: skip
        return out

    def dense(self, dtype: torch.dtype = torch.float32) -> torch.Tensor:
        return self.dequantize(dtype)


def _chunks(nb: int) -> list[tuple[int, int]]:
    """(first block, blocks) of each chunk of a row of ``nb`` blocks."""
    return [(b, min(CHUNK, nb - b)) for b in range(0, nb, CHUNK)]


def interleave(codes: torch.Tensor) -> torch.Tensor:
    """(N, Kp) codes in value order to the kernels' bytes (N, Kp/2): per chunk of r blocks, byte (q, j, t)
    holds code 4q + t of block j in the low nibble and code 16 + 4q + t in the high one (the definition;
    ``repack`` makes the same bytes from a checkpoint's)."""
    n, kp = codes.shape
    parts = []
    for b, r in _chunks(kp // BLOCK):
        c = codes[:, b * BLOCK : (b + r) * BLOCK].reshape(n, r, 8, 4).permute(0, 2, 1, 3)  # (n, p, j, t)
        parts.append((c[:, :4] | (c[:, 4:] << 4)).reshape(n, -1))
    return torch.cat(parts, dim=1).to(torch.uint8)


def deinterleave(packed: torch.Tensor) -> torch.Tensor:
    """The inverse of ``interleave``: (N, Kp/2) bytes to (N, Kp) codes in value order."""
    n = packed.shape[0]
    parts = []
    for b, r in _chunks(packed.shape[1] * 2 // BLOCK):
        h = packed[:, b * BLOCK // 2 : (b + r) * BLOCK // 2].reshape(n, 4, r, 4)
        c = torch.cat([h & 15, h >> 4], dim=1)  # (n, p, j, t)
        parts.append(c.permute(0, 2, 1, 3).reshape(n, -1))
    return torch.cat(parts, dim=1)


def half_order(nb: int, inverse: bool = False) -> torch.Tensor:
    """Per row of ``nb`` blocks: the stored position's half-block index (NVFP4's scales: per chunk the r
    first halves, then the r second halves), or with ``inverse`` the stored position of each half block."""
    order = []
    for b, r in _chunks(nb):
        order += [2 * (b + j) for j in range(r)] + [2 * (b + j) + 1 for j in range(r)]
    stored = torch.tensor(order, dtype=torch.int64)
    return torch.argsort(stored) if inverse else stored


def unpack_nibbles(packed: torch.Tensor) -> torch.Tensor:
    """(..., B) bytes holding value 2i in the low nibble of byte i to (..., 2B) codes."""
    p = packed.to(torch.uint8)
    return torch.stack([p & 15, p >> 4], dim=-1).flatten(-2)


# Byte (q, t) of a block in the kernels' chunks holds codes 4q + t and 16 + 4q + t, which a checkpoint's
# bytes (value 2i in the low nibble of byte i) hold in byte 2q + t // 2 (and 8 more), nibble t % 2.
_SOURCE = np.array([[2 * q + t // 2 for t in range(4)] for q in range(4)])
_SHIFT = np.array([4 * (t % 2) for t in range(4)], dtype=np.uint8)


def repack(packed: torch.Tensor) -> torch.Tensor:
    """A checkpoint's (N, K/2) bytes (value 2i in the low nibble of byte i) to the kernels' (N, Kp/2):
    ``interleave(unpack_nibbles(packed))`` (zero codes past K), done on the bytes (in numpy: several
    times faster than torch's uint8 gathers and shifts, which a large MoE checkpoint pays per expert)."""
    n, half = packed.shape
    src = np.pad(packed.to(torch.uint8).numpy(), ((0, 0), (0, -half % (BLOCK // 2)))).reshape(
        n, -1, BLOCK // 2
    )
    lo = (src[:, :, _SOURCE] >> _SHIFT) & 15  # (n, nb, q, t)
    hi = (src[:, :, _SOURCE + 8] >> _SHIFT) & 15
    both = lo | (hi << 4)
    parts = [both[:, b : b + r].transpose(0, 2, 1, 3).reshape(n, -1) for b, r in _chunks(src.shape[1])]
    return torch.from_numpy(np.ascontiguousarray(np.concatenate(parts, axis=1)))


def from_mxfp4(
    blocks: torch.Tensor, scales: torch.Tensor, label: str = "MXFP4", in_features: int | None = None
) -> FP4Weights:
    """One matrix from gpt-oss's layout: ``blocks`` uint8 (N, K/32, 16) (value 2i of a block in the low
    nibble of its byte i), ``scales`` uint8 (N, K/32) E8M0. ValueError on a scale of 255 (E8M0's NaN).
    ``in_features``: K when the last block is zero padding past it."""
    n, nb, width = blocks.shape
    if width != BLOCK // 2 or tuple(scales.shape) != (n, nb):
        raise ValueError(f"MXFP4 blocks {tuple(blocks.shape)} and scales {tuple(scales.shape)} do not fit")
    e = scales.to(torch.uint8)
    if bool((e == 255).any()):
        raise ValueError("MXFP4 scale 255 (E8M0's NaN) in a checkpoint tensor")
    codes = repack(blocks.reshape(n, nb * BLOCK // 2))
    return FP4Weights(codes, e.contiguous(), None, "mxfp4", in_features or nb * BLOCK, label)


def from_ggml_mxfp4(raw: np.ndarray, shape: tuple[int, ...]) -> FP4Weights:
    """A GGUF MXFP4 tensor's blocks (N, K/32 * 17 bytes: per block the E8M0 byte, then 16 bytes whose low
    nibbles hold values 0-15 and high nibbles 16-31, ggml's block_mxfp4), HF shape (N, K)."""
    n, k = shape
    blocks = torch.from_numpy(np.array(raw, dtype=np.uint8).reshape(n, k // BLOCK, 1 + BLOCK // 2))  # a copy
    e, qs = blocks[..., 0].contiguous(), blocks[..., 1:]
    if bool((e == 255).any()):
        raise ValueError("MXFP4 scale 255 (E8M0's NaN) in a GGUF tensor")
    codes = torch.cat([qs & 15, qs >> 4], dim=-1).reshape(n, k)  # value order
    return FP4Weights(interleave(codes), e, None, "mxfp4", k, "MXFP4")


def mxfp4_experts(blocks: torch.Tensor, scales: torch.Tensor) -> list[FP4Weights]:
    """gpt-oss's expert tensors (E, N, K/32, 16) / (E, N, K/32), one matrix (N x K: y = x W^T) per expert
    (transformers' dequantization returns each one transposed, (K, N))."""
    return [from_mxfp4(blocks[e], scales[e]) for e in range(blocks.shape[0])]


def from_nvfp4(
    weight: torch.Tensor,
    weight_scale: torch.Tensor,
    weight_scale_2: torch.Tensor,
    label: str = "NVFP4",
    in_features: int | None = None,
) -> FP4Weights:
    """One linear from ModelOpt's tensors: ``weight`` uint8 (N, K/2) (value 2i in the low nibble of byte
    i), ``weight_scale`` float8_e4m3fn (N, K/16), ``weight_scale_2`` float32 (one value, any shape).
    ``in_features``: K when the last 16 values are partly zero padding past it."""
    n, half = weight.shape
    k = 2 * half
    if weight.dtype != torch.uint8 or weight_scale.dtype != torch.float8_e4m3fn:
        raise ValueError(f"NVFP4 weight {weight.dtype} / weight_scale {weight_scale.dtype}: expected uint8 / "
                         "float8_e4m3fn")  # fmt: skip
    if k % 16 or tuple(weight_scale.shape) != (n, k // 16) or weight_scale_2.numel() != 1:
        raise ValueError(
            f"NVFP4 weight {tuple(weight.shape)}, weight_scale {tuple(weight_scale.shape)}, weight_scale_2 "
            f"{tuple(weight_scale_2.shape)}: expected (N, K/2), (N, K/16) and one value"
        )
    s = weight_scale.view(torch.uint8)
    if bool(((s & 0x7F) == 0x7F).any()):
        raise ValueError("NVFP4 weight_scale holds NaN")
    codes = repack(weight)
    kp = codes.shape[1] * 2
    s = torch.nn.functional.pad(s, (0, kp // 16 - s.shape[1]))  # zero scales past K
    stored = s[:, half_order(kp // BLOCK)].contiguous()
    g = torch.full((n,), float(weight_scale_2.float().reshape(())), dtype=torch.float32)
    return FP4Weights(codes, stored, g, "nvfp4", in_features or k, label)


def concat(parts: list[FP4Weights]) -> FP4Weights | None:
    """The parts stacked by rows (a fused q/k/v or gate/up), or None when their kinds or widths differ."""
    first = parts[0]
    if any(p.kind != first.kind or p.in_features != first.in_features for p in parts):
        return None
    row = None
    if first.row_scale is not None:
        row = torch.cat([p.row_scale for p in parts if p.row_scale is not None])
    labels = "+".join(dict.fromkeys(p.label for p in parts))
    codes, scales = torch.cat([p.codes for p in parts]), torch.cat([p.scales for p in parts])
    return FP4Weights(codes, scales, row, first.kind, first.in_features, labels)
