"""GGUF K-quants (quant/blocks/kquant.py ``KQuantWeights``: Q4_K, Q5_K, Q6_K) laid out for CUDA's Triton kernels.

The block weights' kernels (kernels/triton_block_linear.py) run them, OFFSETS 5 (Q4_K, Q5_K) and 6 (Q6_K):
the codes in the block weights' tiled layout (layers/block_quant.tile_blocks: 16-row tiles, each 16-block
chunk interleaved), 4 bits for Q4_K and a byte each for Q5_K's 5-bit and Q6_K's 6-bit codes; the integer
sub-block scales as the file has them, a byte each, tiled as the blocks' scales are (Q4_K/Q5_K: a 32-value
block's 6-bit scale sc in ``sub`` and its 6-bit min m in ``mins``; Q6_K: two int8 scales a block, one per
16 values, in ``sub``); and each 256-value super-block's float16 d (and dmin) in ``sup``, tiled alike (a
pair or one per super-block), so that a kernel finds a block's super-block at its position >> 3. The
kernels form d sc and dmin m in float32 as GGML does (exact), so the dequantized weight is the file's to
the bit (``dequantize_reference``: PyTorch ops, on the tensors' device; the embedding lookup's path). Bits
per weight: Q4_K 4.625 (the file's 4.5: its scales take 6 bits, here a byte), Q5_K 8.625 and Q6_K 8.5625
(files: 5.5, 6.5625: the codes take a byte each here).
Made once at load, on the CPU, then moved (``to``).
"""

from __future__ import annotations

import functools
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING

import torch

from glassbox.quant.blocks.kquant import SUPER, KQuantParts, KQuantWeights
from glassbox.quant.blocks.tiles import from_tiles, gather_rows, to_tiles
from glassbox.quant.blocks.weights import BLOCK, CHUNK, _deinterleave, tile_blocks

if TYPE_CHECKING:
    from glassbox.kernels.triton_block_linear import BlockArgs


@dataclass
class TritonKQuant:
    codes: torch.Tensor  # uint8 (N, K/2) at 4 bits (Q4_K) or (N, K) (Q5_K, Q6_K), tiled
    sub: torch.Tensor  # uint8 (N, K/32) 6-bit scales (Q4_K, Q5_K) or int8 (N, K/16) (Q6_K), tiled
    mins: torch.Tensor | None  # uint8 (N, K/32) 6-bit mins (Q4_K, Q5_K), tiled
    sup: torch.Tensor  # float16 (N, K/256 x 2) d, dmin pairs (Q4_K, Q5_K) or (N, K/256) d (Q6_K), tiled
    kind: int  # 4, 5, 6: Q4_K, Q5_K, Q6_K
    in_features: int
    label: str
    perm: torch.Tensor | None = None  # no input permutation (the linear reads it)

    @property
    def out_features(self) -> int:
        return int(self.codes.shape[0])

    @property
    def bits(self) -> int:
        return 4 if self.kind == 4 else 8

    @property
    def nbytes(self) -> int:
        return sum(t.numel() * t.element_size() for t in self.stored().values())

    def stored(self) -> dict[str, torch.Tensor]:
        parts = {"codes": self.codes, "sub": self.sub, "mins": self.mins, "sup": self.sup}
        return {name: t for name, t in parts.items() if t is not None}

    @functools.cached_property
    def triton_args(self) -> BlockArgs:
        """The Triton kernels' arguments: OFFSETS 5 (the sub-block scales and mins) or 6 (Q6_K's half-block
        scales; codes less 32)."""
        from glassbox.kernels.triton_block_linear import BlockArgs

        six = self.mins is None
        mins = self.sub if self.mins is None else self.mins
        return BlockArgs(self.codes, self.sub, mins, self.sup, self.sub, self.bits, 6 if six else 5,
                         -32.0 if six else 0.0, self.in_features, False)  # fmt: skip

    def to(self, device: torch.device) -> TritonKQuant:
        mins = None if self.mins is None else self.mins.to(device)
        return replace(
            self, codes=self.codes.to(device), sub=self.sub.to(device), mins=mins, sup=self.sup.to(device)
        )

    def _rows(self, t: torch.Tensor, per_block: float, ids: torch.Tensor | None) -> torch.Tensor:
        """A tiled array of ``per_block`` elements a block, rows in order (all, or ``ids``)."""
        seg = int(CHUNK * per_block)  # elements per 16-block chunk
        cut = self.in_features // BLOCK // CHUNK * seg
        return from_tiles(t, seg, cut) if ids is None else gather_rows(t, ids, seg, cut)

    def parts(self, ids: torch.Tensor | None = None) -> KQuantParts:
        """The codes and scales apart, rows in order (all, or ``ids``)."""
        q = _deinterleave(self._rows(self.codes, BLOCK * self.bits / 8, ids), self.in_features, self.bits)
        if self.kind == 6:
            d = self._rows(self.sup, 1 / 8, ids).float()
            return KQuantParts(q, d, None, self._rows(self.sub, 2, ids), None)
        assert self.mins is not None
        sup = self._rows(self.sup, 2 / 8, ids).float()
        return KQuantParts(
            q, sup[:, 0::2], sup[:, 1::2], self._rows(self.sub, 1, ids), self._rows(self.mins, 1, ids)
        )

    def dequantize_reference(
        self, dtype: torch.dtype = torch.float32, ids: torch.Tensor | None = None
    ) -> torch.Tensor:
        """(N, K) in ``dtype`` (rows ``ids`` only if given): S q + O in float32, rounded once."""
        q, s, o = self.parts(ids).unpacked()
        w = q.float().view(q.shape[0], -1, 16) * s.unsqueeze(-1) + o.unsqueeze(-1)
        return w.view(q.shape[0], self.in_features).to(dtype)

    def dequantize(self, dtype: torch.dtype = torch.float32) -> torch.Tensor:
        return self.dequantize_reference(dtype)

    def dense(self, dtype: torch.dtype = torch.float32) -> torch.Tensor:
        return self.dequantize_reference(dtype)

    def rows(self, ids: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
        """The dequantized rows ``ids`` (an embedding lookup), (*ids.shape, K) in ``dtype``."""
        return self.dequantize_reference(dtype, ids.reshape(-1)).view(*ids.shape, self.in_features)


def for_triton(w: KQuantWeights) -> TritonKQuant:
    """``w`` in the Triton kernels' layout (on the CPU; ``to`` moves it)."""
    p = w.parts()
    n, k = w.out_features, w.in_features
    nb = k // BLOCK
    bits = 4 if w.kind == 4 else 8
    chunk_cut = nb // CHUNK  # whole chunks: the arrays' tiles segment them

    def tiled(a: torch.Tensor, per_chunk: int) -> torch.Tensor:
        return to_tiles(a.contiguous(), per_chunk, chunk_cut * per_chunk)

    d = p.d.half()  # the file's float16 (exact)

    if w.kind == 6:
        codes, _ = tile_blocks(p.q.view(n, nb, BLOCK), [], bits, k)
        return TritonKQuant(
            codes, tiled(p.sc, 2 * CHUNK), None, tiled(d, CHUNK * BLOCK // SUPER), 6, k, w.label
        )
    assert p.dmin is not None and p.mins is not None
    sc = p.sc.view(n, nb)
    codes, (sub, mins) = tile_blocks(
        p.q.view(n, nb, BLOCK), [(sc, torch.uint8), (p.mins, torch.uint8)], bits, k
    )
    assert sub is not None and mins is not None
    sup = torch.stack([d, p.dmin.half()], dim=-1).view(n, -1)
    return TritonKQuant(codes, sub, mins, tiled(sup, 2 * CHUNK * BLOCK // SUPER), w.kind, k, w.label)
