"""Float weights quantized to 4-bit floating point, written in the checkpoints' own layouts (then
loaded by quant/fp4/weights.py as a checkpoint's are): ``--quantization mxfp4|nvfp4`` and the tests'
checkpoints.

Values round to the nearest E2M1 value, ties to the even one (as ModelOpt's cast and the OCP MX spec do),
saturating at +-6.
- MXFP4: per 32 values the power of two 2^ceil(log2(max|w| / 6)) (so the largest value is not clipped),
  stored as its E8M0 byte; gpt-oss's ``*_blocks`` (N, K/32, 16) / ``*_scales`` (N, K/32).
- NVFP4: ModelOpt's dynamic weight quantization: g = max|W| / (6 * 448) per tensor, per 16 values the
  FP8 E4M3 scale s = max|w| / (6 g) (1 for a block of zeros; clamped to [2^-9, 448]); ModelOpt's
  ``weight`` (N, K/2) / ``weight_scale`` (N, K/16) / ``weight_scale_2``.
K is padded with zeros to the group size.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from glassbox.quant.fp4.weights import FP4Weights, from_mxfp4, from_nvfp4

_GRID = torch.tensor([0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0])
_MIDPOINTS = (_GRID[1:] + _GRID[:-1]) / 2  # 0.25, 0.75, ..., 5


def e2m1_codes(x: torch.Tensor) -> torch.Tensor:
    """float32 values (already divided by their scale) to E2M1 codes (uint8): the nearest value, ties to
    the even code (code 2i over 2i + 1), |x| saturated at 6."""
    a = x.abs().clamp(max=6.0)
    idx = torch.searchsorted(_MIDPOINTS, a.contiguous())  # the midpoints below a: its nearest value
    # a on midpoint i (between values i and i + 1) got i: i + 1 where that one is even
    at_mid = (idx < 7) & (a == _MIDPOINTS[idx.clamp(max=6)])
    idx = torch.where(at_mid & (idx % 2 == 1), idx + 1, idx)
    return (idx | ((x < 0) & (idx > 0)).to(idx.dtype) * 8).to(torch.uint8)


def _pack_nibbles(codes: torch.Tensor) -> torch.Tensor:
    """(..., 2B) codes to (..., B) bytes, value 2i in the low nibble of byte i."""
    return codes[..., 0::2] | (codes[..., 1::2] << 4)


def _blocks(weight: torch.Tensor, group: int) -> torch.Tensor:
    w = weight.detach().float()
    k = w.shape[1]
    return F.pad(w, (0, -k % group)).view(w.shape[0], -1, group)


def quantize_mxfp4(weight: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """A float weight (N, K) as gpt-oss stores MXFP4: (blocks uint8 (N, K/32, 16), scales uint8 (N, K/32))."""
    blocks = _blocks(weight, 32)
    amax = blocks.abs().amax(-1)
    mant, exp = torch.frexp(amax / 6.0)  # amax / 6 = mant 2^exp, mant in [0.5, 1)
    e = torch.where(mant == 0.5, exp - 1, exp)  # ceil(log2(amax / 6))
    e = torch.where(amax > 0, e + 127, 127).clamp(0, 254)
    scale = torch.ldexp(torch.ones(e.shape), e - 127)
    codes = e2m1_codes(blocks / scale[..., None])
    return _pack_nibbles(codes).view(blocks.shape[0], -1, 16), e.to(torch.uint8)


def quantize_nvfp4(
    weight: torch.Tensor, amax: torch.Tensor | None = None
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """A float weight (N, K) as ModelOpt stores NVFP4: (weight uint8 (N, K/2), weight_scale float8_e4m3fn
    (N, K/16), weight_scale_2 float32 ()); ``amax``: the largest magnitude of the tensor this is part of (a
    tensor-parallel shard: the whole tensor's), else this one's."""
    blocks = _blocks(weight, 16)
    g = (blocks.abs().amax() if amax is None else amax.reshape(())) / (6.0 * 448.0)
    if float(g) == 0.0:
        g = torch.ones(())
    per_block = blocks.abs().amax(-1) / (6.0 * g)
    per_block = torch.where(per_block == 0, 1.0, per_block)
    s = per_block.clamp(2**-9, 448.0).to(torch.float8_e4m3fn)
    codes = e2m1_codes(blocks / (s.float() * g)[..., None]).view(blocks.shape[0], -1)
    return _pack_nibbles(codes), s, g.float()


def quantize(weight: torch.Tensor, kind: str, amax: torch.Tensor | None = None) -> FP4Weights:
    """A float weight (N, K) quantized to ``kind`` ("mxfp4" | "nvfp4") and packed; ``amax``: NVFP4's
    tensor scale from a whole tensor's largest magnitude (``quantize_nvfp4``)."""
    k = weight.shape[1]
    if kind == "mxfp4":
        return from_mxfp4(*quantize_mxfp4(weight), label="mxfp4", in_features=k)
    if kind == "nvfp4":
        return from_nvfp4(*quantize_nvfp4(weight, amax), label="nvfp4", in_features=k)
    raise ValueError(f"4-bit float formats are mxfp4 and nvfp4, got {kind!r}")
