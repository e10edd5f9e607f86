"""Weights kept in 32-value blocks of 4, 5 or 8 bits: GGUF Q4_0, Q4_1 and Q8_0 files as stored (Q5_0, Q5_1
and IQ4_NL too: quant/blocks/gguf32.py), GPTQ and AWQ checkpoints (quant/blocks/gptq_awq.py), and
``--quantization int4|int8`` of a 16/32-bit checkpoint.

Every format is repacked at load into one layout (``BlockWeights``, read by kernels/cpu_quant.c):
unsigned codes q, and per block b of row n a float16 scale d and an offset o, W[n, k] = d[n, b] q[n, k] +
o[n, b], the offset stored (float16: Q4_1's min m), or -z d for an integer zero code z (uint8: GPTQ and
AWQ, W = d (q - z) exactly, a group's scale and zero repeated over its blocks), or c d for one constant c
(Q4_0 and int4: c = -8, Q8_0 and int8: c = -128). GPTQ's act-order (input channels grouped out of order)
keeps the channels sorted by group and a permutation ``perm`` that the linear applies to its input first.
The bytes per weight are the file's own (Q4_0 4.5 bits, Q4_1 5, Q8_0 8.5). The modules that run them are
in quant/blocks/linear.py. The rows are stored in tiles of 16 (quant/blocks/tiles.py), so that the
batch-1 GEMV reads each thread's weights as one sequential stream. ``dequantize`` (exact in float32) is the
kernels' dequantization;
``dequantize_reference`` is the same in PyTorch ops: the kernels' reference and fallback.
"""

from __future__ import annotations

import ctypes
import dataclasses
import functools
from dataclasses import dataclass
from typing import TYPE_CHECKING

import numpy as np
import torch

from glassbox.quant.blocks.codes5 import split_high_bits, with_high_bits
from glassbox.quant.blocks.tiles import from_tiles, gather_rows, to_tiles

if TYPE_CHECKING:
    from glassbox.kernels.triton_block_linear import BlockArgs

BLOCK = 32
GROUP = 64  # Kp (the padded row length) is a multiple of it
NL = 16  # in the kernels' ``bits``: 4-bit codes index IQ4_NL's table (kernels/cpu_quant.h GB_NL)
# IQ4_NL's 16 values (GGML's kvalues_iq4nl): a code c means IQ4_NL_VALUES[c] + 128, the offset -128 d
IQ4_NL_VALUES = torch.tensor([-127, -104, -83, -65, -49, -35, -22, -10, 1, 13, 25, 38, 53, 69, 89, 113])
_BYTES = {"Q4_0": 18, "Q4_1": 20, "Q8_0": 34}  # per 32-value block


def native_library() -> ctypes.CDLL | None:
    from glassbox.kernels.native import library

    return library()


@dataclass
class BlockWeights:
    """A weight matrix (N x K) in blocks, each array (N, L) in 16-row tiles (quant/blocks/tiles.py):
    ``codes`` uint8 (N, Kp/2) for 4 bits or (N, Kp) for 8, ``tiled_scales`` float16 (N, Kp/32),
    ``tiled_offsets`` float16 (N, Kp/32) or None, then ``tiled_zeros`` uint8 (N, Kp/32) (o = -zeros * d) or
    None (o = offset_factor * d); columns past K are zero. ``scales``, ``offsets`` and ``zeros`` are the
    rows in order (copies). ``perm`` (K,) int64 or None: column j of the blocks is input channel perm[j]
    (y = x[:, perm] W_blocks^T)."""

    codes: torch.Tensor
    tiled_scales: torch.Tensor
    tiled_offsets: torch.Tensor | None
    offset_factor: float
    bits: int
    in_features: int  # K
    label: str  # the format, for logs and the trace ("Q4_1", "int4", "GPTQ int4 g128", ...)
    tiled_zeros: torch.Tensor | None = None
    perm: torch.Tensor | None = None
    nonlinear: bool = False  # 4-bit codes index IQ4_NL's table (the values + 128: ``unpacked_codes``)

    @property
    def kernel_bits(self) -> int:
        """``bits`` as the C kernels take it: 4, 5 or 8, plus NL for IQ4_NL's table (cpu_quant.h)."""
        return self.bits | (NL if self.nonlinear else 0)

    @property
    def out_features(self) -> int:
        return int(self.codes.shape[0])

    @property
    def padded(self) -> int:  # Kp
        return int(self.tiled_scales.shape[1]) * BLOCK

    @property
    def nbytes(self) -> int:
        return sum(t.numel() * t.element_size() for t in self.stored().values())

    def stored(self) -> dict[str, torch.Tensor]:
        """The tensors that hold the weight (tiled), by name."""
        parts = {
            "codes": self.codes, "scales": self.tiled_scales, "offsets": self.tiled_offsets,
            "zeros": self.tiled_zeros, "perm": self.perm,
        }  # fmt: skip
        return {name: t for name, t in parts.items() if t is not None}

    def _segments(self, codes: bool) -> tuple[int, int]:
        """(segment, cut) of the codes' or the per-block arrays' tiles."""
        chunks = self.padded // BLOCK // CHUNK
        seg = 64 * self.bits if codes else CHUNK  # a chunk's code bytes: 256, 320 or 512
        return seg, chunks * seg

    def _rows(self, t: torch.Tensor | None, ids: torch.Tensor | None = None) -> torch.Tensor | None:
        """A per-block array's rows in order (all, or ``ids``)."""
        if t is None:
            return None
        seg, cut = self._segments(False)
        return from_tiles(t, seg, cut) if ids is None else gather_rows(t, ids, seg, cut)

    @property
    def scales(self) -> torch.Tensor:  # (N, Kp/32) float16, rows in order
        s = self._rows(self.tiled_scales)
        assert s is not None
        return s

    @property
    def offsets(self) -> torch.Tensor | None:
        return self._rows(self.tiled_offsets)

    @property
    def zeros(self) -> torch.Tensor | None:
        return self._rows(self.tiled_zeros)

    def offset_values(self, ids: torch.Tensor | None = None) -> torch.Tensor:
        """(N, Kp/32) float32 offsets o (of rows ``ids`` only if given), rows in order."""
        d = self._rows(self.tiled_scales, ids)
        offsets, zeros = self._rows(self.tiled_offsets, ids), self._rows(self.tiled_zeros, ids)
        assert d is not None
        if offsets is not None:
            return offsets.float()
        return self.offset_factor * d.float() if zeros is None else -zeros.float() * d.float()

    def pointers(self) -> tuple[int, int, int | None, int | None, float]:
        """(codes, scales, offsets or None, zero codes or None, offset factor), all tiled: the kernels'
        weight arguments."""
        offsets = None if self.tiled_offsets is None else self.tiled_offsets.data_ptr()
        zeros = None if self.tiled_zeros is None else self.tiled_zeros.data_ptr()
        return self.codes.data_ptr(), self.tiled_scales.data_ptr(), offsets, zeros, self.offset_factor

    def unpacked_codes(self, ids: torch.Tensor | None = None) -> torch.Tensor:
        """(N, Kp) uint8 codes in value order (of rows ``ids`` only if given); IQ4_NL's are its table's
        values + 128 (1..241)."""
        seg, cut = self._segments(True)
        rows = from_tiles(self.codes, seg, cut) if ids is None else gather_rows(self.codes, ids, seg, cut)
        codes = _deinterleave(rows, self.padded, self.bits)
        return (IQ4_NL_VALUES + 128).to(torch.uint8)[codes.long()] if self.nonlinear else codes

    def dequantize_reference(
        self, dtype: torch.dtype = torch.float32, ids: torch.Tensor | None = None
    ) -> torch.Tensor:
        """(N, K) in ``dtype`` (rows ``ids`` only if given): d q + o in float32, rounded once (PyTorch
        ops)."""
        d = self._rows(self.tiled_scales, ids)
        assert d is not None
        q = self.unpacked_codes(ids).float().view(d.shape[0], -1, BLOCK)
        w = q * d.float().unsqueeze(-1) + self.offset_values(ids).unsqueeze(-1)
        return w.reshape(d.shape[0], self.padded)[:, : self.in_features].to(dtype)

    def dequantize(self, dtype: torch.dtype = torch.float32) -> torch.Tensor:
        """(N, K) in ``dtype`` (float32 or bf16): the kernels' dequantization, else the reference."""
        lib = native_library()
        if lib is None or dtype not in (torch.float32, torch.bfloat16) or self.codes.device.type != "cpu":
            return self.dequantize_reference(dtype)
        out = torch.empty(self.out_features, self.in_features, dtype=dtype)
        lib.gb_dequant_blocks(
            *self.pointers(), self.out_features, self.padded, self.in_features, self.kernel_bits, out.data_ptr(),
            int(dtype == torch.bfloat16), torch.get_num_threads(),
        )  # fmt: skip
        return out

    @functools.cached_property
    def triton_args(self) -> BlockArgs:
        """The Triton kernels' arguments (kernels/triton_block_linear.py; the tensors where they are): OFFSETS 0
        a constant factor, 1 stored offsets, 2 zero codes. Act-order's ``perm`` is the caller's to apply."""
        from glassbox.kernels.triton_block_linear import BlockArgs

        if self.bits not in (4, 8) or self.nonlinear:
            raise ValueError(f"{self.label} blocks have no Triton kernels")
        offs, zeros, d = self.tiled_offsets, self.tiled_zeros, self.tiled_scales
        kind = 1 if offs is not None else 2 if zeros is not None else 0
        held = offs if offs is not None else zeros if zeros is not None else d
        return BlockArgs(
            self.codes, d, held, d, d, self.bits, kind, self.offset_factor, self.in_features, False
        )

    def to(self, device: torch.device) -> BlockWeights:
        """The same weights with their tensors on ``device``."""
        moved = {name: t.to(device) for name, t in self.stored().items()}
        return dataclasses.replace(
            self, codes=moved["codes"], tiled_scales=moved["scales"], tiled_offsets=moved.get("offsets"),
            tiled_zeros=moved.get("zeros"), perm=moved.get("perm"),
        )  # fmt: skip

    def dense(self, dtype: torch.dtype = torch.float32) -> torch.Tensor:
        """(N, K) in ``dtype`` with the columns in input-channel order (``perm`` undone)."""
        w = self.dequantize(dtype)
        if self.perm is None:
            return w
        out = torch.empty_like(w)
        out[:, self.perm] = w
        return out

    def rows(self, ids: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
        """The dequantized rows ``ids`` (an embedding lookup), (len(ids), K) in ``dtype``."""
        w = self.dequantize_reference(dtype, ids.reshape(-1)).view(*ids.shape, self.in_features)
        return w if self.perm is None else w[..., torch.argsort(self.perm)]


def _padded(k: int) -> int:
    return -(-k // GROUP) * GROUP


CHUNK = 16  # blocks per interleaved chunk (kernels/cpu_quant.c): 512 codes


def _interleave(codes: torch.Tensor, bits: int) -> torch.Tensor:
    """(N, Kp) codes in value order to the kernels' bytes: whole chunks of 16 blocks with vector p, lane j
    holding block j's codes 4p..4p+3 (4 bits: vectors 0-3 in the low nibbles, 4-7 in the high), then the
    remaining blocks in order (4 bits: 64 codes per 32 bytes, codes 0..31 low, 32..63 high)."""
    n, kp = codes.shape
    chunks = kp // BLOCK // CHUNK
    cut = chunks * CHUNK * BLOCK
    c = codes[:, :cut].reshape(n, chunks, CHUNK, 8, 4).permute(0, 1, 3, 2, 4)  # (n, chunk, p, j, t)
    tail = codes[:, cut:]
    if bits == 5:  # the low nibbles as 4 bits, the fifth bits in masks beside them (quant/blocks/codes5.py)
        return with_high_bits(_interleave(codes & 15, 4), codes)
    if bits == 8:
        return torch.cat([c.reshape(n, cut), tail], dim=1)
    head = (c[:, :, :4] | (c[:, :, 4:] << 4)).reshape(n, cut // 2)
    t = tail.reshape(n, -1, 2, BLOCK)
    return torch.cat([head, (t[:, :, 0] | (t[:, :, 1] << 4)).reshape(n, -1)], dim=1)


def _deinterleave(packed: torch.Tensor, kp: int, bits: int) -> torch.Tensor:
    """The inverse of _interleave: the kernels' bytes to (N, Kp) codes in value order."""
    n = packed.shape[0]
    chunks = kp // BLOCK // CHUNK
    cut = chunks * CHUNK * BLOCK
    if bits == 5:
        nibbles, high = split_high_bits(packed, kp)
        return _deinterleave(nibbles, kp, 4) | (high << 4)
    if bits == 8:
        c, tail = packed[:, :cut].reshape(n, chunks, 8, CHUNK, 4), packed[:, cut:]
    else:
        h = packed[:, : cut // 2].reshape(n, chunks, 4, CHUNK, 4)
        c = torch.cat([h & 15, h >> 4], dim=2)  # (n, chunk, p, j, t)
        t = packed[:, cut // 2 :].reshape(n, -1, BLOCK)
        tail = torch.stack([t & 15, t >> 4], dim=2).reshape(n, -1)
    return torch.cat([c.permute(0, 1, 3, 2, 4).reshape(n, cut), tail], dim=1)


Array = np.ndarray | torch.Tensor


def _tensor(a: Array, dtype: torch.dtype) -> torch.Tensor:
    t = torch.from_numpy(np.ascontiguousarray(a)) if isinstance(a, np.ndarray) else a
    return t.to(dtype)


def _pack(
    q: Array,
    scales: Array,
    offsets: Array | None,
    factor: float,
    bits: int,
    k: int,
    label: str,
    zeros: Array | None = None,
) -> BlockWeights:
    """From codes (N, nb, 32) uint8 and per-block float16 scales (and offsets, or uint8 zero codes)
    (N, nb), NumPy arrays or tensors (on any device: the blocks are made there): pad to Kp, pack nibbles."""
    codes, (d, off, z) = tile_blocks(
        q, [(scales, torch.float16), (offsets, torch.float16), (zeros, torch.uint8)], bits, k
    )
    assert d is not None
    return BlockWeights(codes, d, off, factor, bits, k, label, z)


def tile_blocks(
    q: Array, per_block: list[tuple[Array | None, torch.dtype]], bits: int, k: int
) -> tuple[torch.Tensor, list[torch.Tensor | None]]:
    """Codes (N, nb, 32) uint8 in value order and per-block arrays (N, nb) (each with its dtype; None stays
    None) in the kernels' layout: rows padded to Kp (zero codes, zero per-block values), the codes'
    chunks interleaved (nibbles packed at 4 bits), all in 16-row tiles. Also the Triton kernels' layout for
    4-bit floats (quant/fp4/triton.py)."""
    n, nb = q.shape[:2]
    kp = _padded(k)
    pad = kp // BLOCK - nb
    codes_t = _tensor(q, torch.uint8)

    def padded(a: Array | None, dtype: torch.dtype) -> torch.Tensor | None:
        """A per-block array padded with zero blocks: scale and offset 0, so any code gives 0."""
        if a is None:
            return None
        t = _tensor(a, dtype)
        return torch.cat([t, t.new_zeros(n, pad)], dim=1) if pad else t

    if pad:
        codes_t = torch.cat([codes_t, codes_t.new_zeros(n, pad, BLOCK)], dim=1)
    codes = _interleave(codes_t.reshape(n, kp), bits)
    chunks = kp // BLOCK // CHUNK
    seg = 64 * bits  # a chunk's code bytes

    def tiled(a: Array | None, dtype: torch.dtype) -> torch.Tensor | None:  # per-block arrays
        t = padded(a, dtype)
        return None if t is None else to_tiles(t, CHUNK, chunks * CHUNK)

    return to_tiles(codes, seg, chunks * seg), [tiled(a, dtype) for a, dtype in per_block]


def from_zero_codes(
    q: np.ndarray,
    scales: np.ndarray,
    zeros: np.ndarray,
    bits: int,
    k: int,
    label: str,
    perm: torch.Tensor | None,
) -> BlockWeights:
    """From codes (N, nb, 32) uint8, per-block float16 scales and uint8 zero codes (N, nb) (GPTQ, AWQ,
    compressed-tensors). Symmetric weights (every zero the middle code 2^(bits-1)) are stored as Q4_0 and
    Q8_0 are, W = d q - 2^(bits-1) d, without the zero codes (the same values; a byte less per block and
    the kernels' faster constant-offset path)."""
    middle = 1 << (bits - 1)
    if bool((torch.as_tensor(zeros) == middle).all()):
        w = _pack(q, scales, None, -float(middle), bits, k, label)
    else:
        w = _pack(q, scales, None, 0.0, bits, k, label, zeros)
    w.perm = perm
    return w


def from_gguf(ggml_type: str, raw: np.ndarray, shape: tuple[int, ...]) -> BlockWeights:
    """A GGUF tensor's block bytes (rows, row bytes), HF shape (N, K), repacked."""
    if ggml_type not in _BYTES:
        raise ValueError(f"GGML type {ggml_type} is not a 32-value block type ({', '.join(_BYTES)})")
    n, k = shape
    nb = k // BLOCK
    blocks = np.ascontiguousarray(raw).reshape(n, nb, _BYTES[ggml_type])
    d = blocks[:, :, 0:2].copy().view(np.float16).reshape(n, nb)
    if ggml_type == "Q8_0":
        s = blocks[:, :, 2:].copy().view(np.int8).astype(np.int16)
        return _pack((s + 128).astype(np.uint8), d, None, -128.0, 8, k, ggml_type)
    head = 4 if ggml_type == "Q4_1" else 2
    qs = blocks[:, :, head:]  # (n, nb, 16): low nibbles values 0..15, high nibbles 16..31
    q = np.concatenate([qs & 15, qs >> 4], axis=-1).astype(np.uint8)
    if ggml_type == "Q4_1":
        m = blocks[:, :, 2:4].copy().view(np.float16).reshape(n, nb)
        return _pack(q, d, m, 0.0, 4, k, ggml_type)
    return _pack(q, d, None, -8.0, 4, k, ggml_type)


def concat(parts: list[BlockWeights]) -> BlockWeights | None:
    """The parts stacked by rows (a fused q/k/v or gate/up), or None when their bits, widths, kinds of
    offset or input permutations differ."""
    first = parts[0]
    same_offsets = all(
        p.nonlinear == first.nonlinear
        and (p.offsets is None) == (first.offsets is None)
        and (p.zeros is None) == (first.zeros is None)
        and p.offset_factor == first.offset_factor
        for p in parts
    )
    same_perm = all(
        (p.perm is None and first.perm is None)
        or (p.perm is not None and first.perm is not None and torch.equal(p.perm, first.perm))
        for p in parts
    )
    if not same_offsets or not same_perm:
        return None
    if any(p.bits != first.bits or p.in_features != first.in_features for p in parts):
        return None
    labels = "+".join(dict.fromkeys(p.label for p in parts))
    # rows in order, stacked, tiled again (a part's last tile may be short)
    (seg, cut), (mseg, mcut) = first._segments(True), first._segments(False)
    codes = torch.cat([from_tiles(p.codes, seg, cut) for p in parts])

    def stack(arrays: list[torch.Tensor | None]) -> torch.Tensor | None:
        if arrays[0] is None:
            return None
        return to_tiles(torch.cat([from_tiles(a, mseg, mcut) for a in arrays if a is not None]), mseg, mcut)

    scales = stack([p.tiled_scales for p in parts])
    assert scales is not None
    offsets, zeros = stack([p.tiled_offsets for p in parts]), stack([p.tiled_zeros for p in parts])
    return BlockWeights(
        to_tiles(codes, seg, cut),
        scales,
        offsets,
        first.offset_factor,
        first.bits,
        first.in_features,
        labels,
        zeros,
        first.perm,
        first.nonlinear,
    )
