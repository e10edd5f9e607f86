"""4-bit floats (quant/fp4/weights.py ``FP4Weights``: MXFP4, NVFP4) laid out for CUDA's Triton kernels.

The block weights' kernels (kernels/triton_block_linear.py) run them, OFFSETS 3 (MXFP4) and 4 (NVFP4): the
codes in the block weights' tiled layout (layers/block_quant.tile_blocks: 16-row tiles, rows padded to 64
values, each 16-block chunk interleaved as ``FP4Weights`` already interleaves its whole chunks: byte (p, j,
t) holds value 4p + t of block j in the low nibble and 16 + 4p + t in the high one), and the scales as
stored, a byte per block (MXFP4's E8M0) or per half block (NVFP4's E4M3: ``lo`` the blocks' first halves,
the low nibbles; ``hi`` their second halves), tiled alike; NVFP4's tensor scale stays per row (float32, in
row order) and multiplies each row's sum. Made once at load, on the CPU, then moved (``to``).
"""

from __future__ import annotations

import functools
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING

import torch

from glassbox.quant.blocks.weights import BLOCK, tile_blocks
from glassbox.quant.fp4.weights import FP4Weights, half_order

if TYPE_CHECKING:
    from glassbox.kernels.triton_block_linear import BlockArgs


@dataclass
class TritonFP4:
    codes: torch.Tensor  # uint8 (N, Kp/2), tiled
    lo: torch.Tensor  # uint8 (N, Kp/32), tiled: MXFP4's E8M0 bytes, NVFP4's first-half E4M3 bytes
    hi: torch.Tensor | None  # NVFP4's second-half E4M3 bytes, tiled
    row_scale: torch.Tensor | None  # float32 (N,): NVFP4's tensor scale, rows in order
    kind: str  # "mxfp4" | "nvfp4"
    in_features: int
    label: str

    @property
    def out_features(self) -> int:
        return int(self.codes.shape[0])

    @property
    def nbytes(self) -> int:
        return sum(t.numel() * t.element_size() for t in self.stored().values())

    def stored(self) -> dict[str, torch.Tensor]:
        parts = {"codes": self.codes, "lo": self.lo, "hi": self.hi, "row_scale": self.row_scale}
        return {name: t for name, t in parts.items() if t is not None}

    @functools.cached_property
    def triton_args(self) -> BlockArgs:
        """The Triton kernels' arguments: OFFSETS 3 (MXFP4: E8M0 bytes) or 4 (NVFP4: E4M3 bytes per half
        block, ``lo`` the first halves', ``hi`` the second's; the tensor scale per row)."""
        from glassbox.kernels.triton_block_linear import BlockArgs

        hi = self.lo if self.hi is None else self.hi
        rs = self.lo if self.row_scale is None else self.row_scale
        return BlockArgs(self.codes, self.lo, hi, self.lo, rs, 4, 3 if self.kind == "mxfp4" else 4, 0.0,
                         self.in_features, self.row_scale is not None)  # fmt: skip

    def to(self, device: torch.device) -> TritonFP4:
        def moved(t: torch.Tensor | None) -> torch.Tensor | None:
            return None if t is None else t.to(device)

        codes, lo = self.codes.to(device), self.lo.to(device)
        return replace(self, codes=codes, lo=lo, hi=moved(self.hi), row_scale=moved(self.row_scale))


def for_triton(w: FP4Weights) -> TritonFP4:
    """``w`` in the Triton kernels' layout (on the CPU; ``to`` moves it)."""
    n = w.out_features
    q = w.unpacked_codes().view(n, -1, BLOCK)  # value order, (N, Kp/32, 32)
    nb = q.shape[1]
    if w.kind == "mxfp4":
        lo, hi = w.scales, None
    else:  # stored per chunk as its first halves then its second halves: back to block order
        halves = w.scales[:, half_order(nb, inverse=True)].view(n, nb, 2)
        lo, hi = halves[..., 0].contiguous(), halves[..., 1].contiguous()
    codes, (lo_t, hi_t) = tile_blocks(q, [(lo, torch.uint8), (hi, torch.uint8)], 4, w.in_features)
    assert lo_t is not None
    return TritonFP4(codes, lo_t, hi_t, w.row_scale, w.kind, w.in_features, w.label)
