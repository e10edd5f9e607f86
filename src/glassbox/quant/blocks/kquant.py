"""GGUF K-quant weights (Q4_K, Q5_K, Q6_K; Q2_K, Q3_K and IQ4_XS: quant/blocks/kquant_low.py) kept as stored: 256-value super-blocks with integer sub-block
scales, repacked at load into the lane order kernels/cpu_kquant.c reads (its header has the layout).

Per super-block, ``codes`` holds the unsigned codes (4, 5 or 6 bits) and ``meta`` the scales as the file
has them: Q4_K/Q5_K float16 d and dmin, then 8 sub-block scales sc and 8 mins m in 6 bits each (12 bytes);
Q6_K 16 int8 sub-block scales and float16 d. W = d sc q - dmin m (Q4_K, Q5_K, per 32 values) or
d sc (q - 32) (Q6_K, per 16), with d sc and dmin m formed in float32 (exact), so ``dequantize`` equals
GGML's (gguf.quants.dequantize) bit for bit. The bytes per weight are the file's own (Q4_K 4.5 bits,
Q5_K 5.5, Q6_K 6.5625). ``dequantize_reference`` is the same in PyTorch ops: the kernels'
reference and fallback. The modules that run them are quant/blocks/linear.py's. The rows are stored in
tiles of 16 (quant/blocks/tiles.py), a segment being one GEMV step: two super-blocks (Q4_K, Q5_K) or one.
"""

from __future__ import annotations

import ctypes
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch

from glassbox.quant.blocks import kquant_low
from glassbox.quant.blocks.tiles import from_tiles, gather_rows, to_tiles

SUPER = 256  # values per super-block
_KIND = {"Q4_K": 4, "Q5_K": 5, "Q6_K": 6, **kquant_low.KINDS}
_FILE_BYTES = {"Q4_K": 144, "Q5_K": 176, "Q6_K": 210, **kquant_low.FILE_BYTES}  # per super-block in GGUF
KQUANT_TYPES = tuple(_FILE_BYTES)  # the GGML types this layout reads
CODE_BYTES = {4: 128, 5: 160, 6: 192, **kquant_low.CODE_BYTES}  # per super-block here (cpu_kquant.h)
META_BYTES = {4: 16, 5: 16, 6: 18, **kquant_low.META_BYTES}  # the GGML block's d, dmin and scales


def _library() -> ctypes.CDLL | None:
    from glassbox.kernels.native import library

    return library()


@dataclass
class KQuantParts:
    """A K-quant weight's codes and scales apart, rows in order: W = d sc q - dmin m per 32 values (Q4_K,
    Q5_K) or d sc (q - 32) per 16 (Q6_K), each product formed in float32 (exact)."""

    q: torch.Tensor  # (N, K) uint8 codes in value order (Q6_K: unsigned, the value is q - 32)
    d: torch.Tensor  # (N, K/256) float32: the super-blocks' scales
    dmin: torch.Tensor | None  # (N, K/256) float32: their min scales (Q4_K, Q5_K)
    sc: torch.Tensor  # (N, K/32) uint8 6-bit sub-block scales (Q4_K, Q5_K), (N, K/16) int8 (Q6_K)
    mins: torch.Tensor | None  # (N, K/32) uint8 6-bit sub-block mins (Q4_K, Q5_K)

    def unpacked(self) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """(q (N, K) int32, less 32 for Q6_K; S, O (N, K/16) float32 per 16-value lane): W = S q + O."""
        n, nsb = self.d.shape
        per = self.sc.shape[1] // nsb  # sub-blocks per super-block: 8 (32 values) or 16
        s = (self.d.unsqueeze(-1) * self.sc.float().view(n, nsb, per)).view(n, -1)
        if self.dmin is None or self.mins is None:
            return self.q.int() - 32, s, torch.zeros_like(s)
        o = -(self.dmin.unsqueeze(-1) * self.mins.float().view(n, nsb, per)).view(n, -1)
        return self.q.int(), s.repeat_interleave(2, dim=-1), o.repeat_interleave(2, dim=-1)


@dataclass
class KQuantWeights:
    """A weight matrix (N x K, K a multiple of 256) in K-quant super-blocks: ``codes`` uint8 (N, K/256 *
    CODE_BYTES), ``meta`` uint8 (N, K/256 * META_BYTES), both in 16-row tiles (``_segments``), ``kind`` 4,
    5 or 6 (Q4_K, Q5_K, Q6_K)."""

    codes: torch.Tensor
    meta: torch.Tensor
    kind: int
    in_features: int  # K
    label: str  # "Q4_K", "Q6_K", or fused parts' labels joined by "+"
    perm: torch.Tensor | None = None  # no input permutation (BlockWeights has one for GPTQ act-order)

    @property
    def out_features(self) -> int:
        return int(self.codes.shape[0])

    @property
    def nbytes(self) -> int:
        return sum(t.numel() * t.element_size() for t in (self.codes, self.meta))

    def kernel_call(self, bias: int | None) -> tuple[Any, tuple[Any, ...]]:
        """(gb_linear_kquant, the weight's arguments) for BlockQuantLinear: called as fn(x, M, K, *args,
        out, bf16, threads)."""
        lib = _library()
        assert lib is not None
        args = (self.codes.data_ptr(), self.meta.data_ptr(), self.kind, bias, self.out_features)
        return lib.gb_linear_kquant, args

    def parts(self) -> KQuantParts:
        """The codes and scales apart, rows in order (PyTorch ops, on the tensors' device)."""
        n, nsb = self.out_features, self.in_features // SUPER
        rec = from_tiles(self.codes, *_segments(self.kind, nsb, CODE_BYTES)).view(n, nsb, -1).int()
        nib = rec[..., :128].reshape(n, nsb, 2, 64)
        v = torch.stack([nib & 15, nib >> 4], dim=3).view(n, nsb, 4, 64)  # V_p, byte i
        bit = torch.arange(8, dtype=torch.int32, device=rec.device)
        if self.kind != 4:  # bit masks: byte i of V_p is bit i % 8 of mask byte i // 8
            masks = ((rec[..., 128:].reshape(n, nsb, -1, 8, 1) >> bit) & 1).reshape(n, nsb, -1, 64)
            if self.kind == 5:
                v = v | (masks << 4)
            else:
                v = v | (masks[:, :, 0::2] << 4) | (masks[:, :, 1::2] << 5)
        # byte i = 4 j + t of V_p holds value 16 j + 4 p + t
        q = v.view(n, nsb, 4, 16, 4).permute(0, 1, 3, 2, 4).reshape(n, -1).to(torch.uint8)
        meta = from_tiles(self.meta, *_segments(self.kind, nsb, META_BYTES)).view(
            n, nsb, META_BYTES[self.kind]
        )
        if self.kind == 6:
            d = meta[..., 16:18].contiguous().view(torch.float16).float().view(n, nsb)
            return KQuantParts(q, d, None, meta[..., :16].contiguous().view(torch.int8).view(n, -1), None)
        d = meta[..., 0:2].contiguous().view(torch.float16).float().view(n, nsb)
        dmin = meta[..., 2:4].contiguous().view(torch.float16).float().view(n, nsb)
        sc, mn = _scale_min(meta[..., 4:16].int())
        return KQuantParts(q, d, dmin, sc.to(torch.uint8).view(n, -1), mn.to(torch.uint8).view(n, -1))

    def unpacked(self) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """(codes (N, K) int32 in value order, less 32 for Q6_K (kquant_low: less Q3_K's 4, IQ4_XS's table
        values); per 16-value lane the scale S and offset O (N, K/16) float32): W = S q + O."""
        if self.kind not in kquant_low.CODE_BYTES:
            return self.parts().unpacked()
        n, nsb = self.out_features, self.in_features // SUPER
        rec = from_tiles(self.codes, *_segments(self.kind, nsb, CODE_BYTES)).view(n, nsb, -1).int()
        v = kquant_low.lane_codes(self.kind, rec)  # (n, nsb, 4, 64): V_p byte 4 j + t, value 16 j + 4 p + t
        q = v.view(n, nsb, 4, 16, 4).permute(0, 1, 3, 2, 4).reshape(n, -1)
        meta = from_tiles(self.meta, *_segments(self.kind, nsb, META_BYTES)).view(n, nsb, -1)
        return kquant_low.lane_values(self.kind, q, meta)

    def dequantize_reference(self, dtype: torch.dtype = torch.float32) -> torch.Tensor:
        """(N, K) in ``dtype``: S q + O in float32, rounded once (PyTorch ops)."""
        q, s, o = self.unpacked()
        n = self.out_features
        w = q.float().view(n, -1, 16) * s.unsqueeze(-1) + o.unsqueeze(-1)
        return w.view(n, self.in_features).to(dtype)

    def dequantize(self, dtype: torch.dtype = torch.float32) -> torch.Tensor:
        """(N, K) in ``dtype`` (float32 or bf16): the kernels' dequantization, else the reference."""
        lib = _library()
        if lib is None or dtype not in (torch.float32, torch.bfloat16):
            return self.dequantize_reference(dtype)
        out = torch.empty(self.out_features, self.in_features, dtype=dtype)
        lib.gb_dequant_kquant(
            self.codes.data_ptr(), self.meta.data_ptr(), self.kind, self.out_features, self.in_features,
            out.data_ptr(), int(dtype == torch.bfloat16), torch.get_num_threads(), 0,
        )  # fmt: skip
        return out

    def dense(self, dtype: torch.dtype = torch.float32) -> torch.Tensor:
        return self.dequantize(dtype)

    def rows(self, ids: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
        """The dequantized rows ``ids`` (an embedding lookup), (len(ids), K) in ``dtype``."""
        nsb, flat = self.in_features // SUPER, ids.reshape(-1)
        cseg, mseg = _segments(self.kind, nsb, CODE_BYTES), _segments(self.kind, nsb, META_BYTES)
        picked = KQuantWeights(
            to_tiles(gather_rows(self.codes, flat, *cseg), *cseg), to_tiles(gather_rows(self.meta, flat, *mseg), *mseg),
            self.kind, self.in_features, self.label,
        )  # fmt: skip
        return picked.dequantize(dtype).view(*ids.shape, self.in_features)


def _segments(kind: int, nsb: int, per: dict[int, int]) -> tuple[int, int]:
    """(segment, cut) of the tiles (quant/blocks/tiles.py) of a row of ``nsb`` super-blocks of ``per[kind]``
    bytes: a segment is a GEMV step, two super-blocks for Q4_K/Q5_K, one for the others (cpu_kquant.h kq_at)."""
    step = 2 if kind in (4, 5) else 1
    return step * per[kind], nsb // step * step * per[kind]


def _scale_min(packed: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Q4_K/Q5_K's 12 bytes of 6-bit scales and mins (..., 12) to (..., 8) each: sub-blocks 0-3 in the low
    6 bits of bytes 0-3 (scales) and 4-7 (mins); 4-7 in the nibbles of bytes 8-11 with their top 2 bits in
    the top bits of bytes 0-3 (scales) and 4-7 (mins)."""
    a, b, c = packed[..., 0:4], packed[..., 4:8], packed[..., 8:12]
    sc = torch.cat([a & 63, (c & 15) | ((a >> 6) << 4)], dim=-1)
    mn = torch.cat([b & 63, (c >> 4) | ((b >> 6) << 4)], dim=-1)
    return sc, mn


def _codes_in_order(ggml_type: str, blocks: np.ndarray) -> np.ndarray:
    """(rows, nsb, 256) uint8 codes of GGML super-blocks (rows, nsb, type size), in value order."""
    n, nsb, _ = blocks.shape
    if ggml_type == "Q6_K":
        ql = blocks[..., :128].reshape(n, nsb, 2, 1, 64)  # half h: low nibbles values 0-63, high 64-127
        low = ((ql >> np.array([0, 4], np.uint8).reshape(2, 1)) & 15).reshape(n, nsb, 2, 128)
        qh = blocks[..., 128:192].reshape(n, nsb, 2, 1, 32)  # half h: bits 2s..2s+1 for values 32s + i
        high = ((qh >> np.array([0, 2, 4, 6], np.uint8).reshape(4, 1)) & 3).reshape(n, nsb, 2, 128)
        return (low | (high << 4)).reshape(n, nsb, SUPER)
    # 32-byte chunk c: low nibbles values 64 c + i, high nibbles 64 c + 32 + i
    qs = blocks[..., -128:].reshape(n, nsb, 4, 1, 32)
    q = ((qs >> np.array([0, 4], np.uint8).reshape(2, 1)) & 15).reshape(n, nsb, SUPER)
    if ggml_type == "Q5_K":  # bit s of qh[i]: the fifth bit of value 32 s + i
        qh = blocks[..., 16:48].reshape(n, nsb, 1, 32)
        q = q | (((qh >> np.arange(8, dtype=np.uint8).reshape(8, 1)) & 1) << 4).reshape(n, nsb, SUPER)
    return q.astype(np.uint8)


def from_gguf(ggml_type: str, raw: np.ndarray, shape: tuple[int, ...]) -> KQuantWeights:
    """A GGUF K-quant tensor's block bytes (rows, row bytes), HF shape (N, K), repacked."""
    if ggml_type not in _KIND:
        raise ValueError(f"GGML type {ggml_type} is not a K-quant kept packed ({', '.join(KQUANT_TYPES)})")
    n, k = shape
    if k % SUPER:
        raise ValueError(f"{ggml_type} rows of {k} values are not whole super-blocks of {SUPER}")
    kind, nsb = _KIND[ggml_type], k // SUPER
    blocks = np.ascontiguousarray(raw).reshape(n, nsb, _FILE_BYTES[ggml_type])
    low_kind = kind in kquant_low.CODE_BYTES
    q = (kquant_low.codes_in_order if low_kind else _codes_in_order)(ggml_type, blocks)
    v = q.reshape(n, nsb, 16, 4, 4).transpose(0, 1, 3, 2, 4).reshape(n, nsb, 4, 64)  # V_p, byte 4 j + t
    low = v & 15
    parts: list[np.ndarray] = [low[:, :, 0] | (low[:, :, 1] << 4), low[:, :, 2] | (low[:, :, 3] << 4)]
    if low_kind:
        parts = [kquant_low.lane_record(kind, v)]
    elif kind == 5:
        parts += [np.packbits((v[:, :, p] >> 4) & 1, axis=-1, bitorder="little") for p in range(4)]
    elif kind == 6:
        for p in range(4):
            parts += [np.packbits((v[:, :, p] >> b) & 1, axis=-1, bitorder="little") for b in (4, 5)]
    codes = np.concatenate(parts, axis=-1).reshape(n, -1)
    if low_kind:
        meta = kquant_low.meta_of(ggml_type, blocks)
    else:
        meta = blocks[..., 192:210] if kind == 6 else blocks[..., 0:16]  # as stored
    return KQuantWeights(
        to_tiles(
            torch.from_numpy(np.ascontiguousarray(codes, dtype=np.uint8)), *_segments(kind, nsb, CODE_BYTES)
        ),
        to_tiles(
            torch.from_numpy(np.ascontiguousarray(meta.reshape(n, -1), dtype=np.uint8)),
            *_segments(kind, nsb, META_BYTES),
        ),
        kind,
        k,
        ggml_type,
    )


def concat(parts: list[KQuantWeights]) -> KQuantWeights | None:
    """The parts stacked by rows (a fused q/k/v or gate/up), or None when their kinds or widths differ."""
    first = parts[0]
    if any(p.kind != first.kind or p.in_features != first.in_features for p in parts):
        return None
    labels = "+".join(dict.fromkeys(p.label for p in parts))
    nsb = first.in_features // SUPER
    cseg, mseg = _segments(first.kind, nsb, CODE_BYTES), _segments(first.kind, nsb, META_BYTES)
    codes = to_tiles(torch.cat([from_tiles(p.codes, *cseg) for p in parts]), *cseg)  # rows re-tiled
    meta = to_tiles(torch.cat([from_tiles(p.meta, *mseg) for p in parts]), *mseg)
    return KQuantWeights(codes, meta, first.kind, first.in_features, labels)
