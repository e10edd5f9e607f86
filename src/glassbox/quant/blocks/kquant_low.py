"""GGUF Q2_K, Q3_K and IQ4_XS kept in the K-quant layout (quant/blocks/kquant.py, kernels/cpu_kquant.c): the
256-value super-blocks' codes in the lanes' order, their scales as the file has them.

Per super-block, the codes (value r in lane r / 16: the byte order of cpu_kquant.c) and the meta bytes:

- Q2_K (kind 2): 2-bit codes q, 64 bytes (byte i holds V0[i] in bits 0-1, V1[i] 2-3, V2[i] 4-5, V3[i] 6-7);
  meta the block's 16 scale bytes (low nibble sc, high nibble m per 16-value sub-block), float16 d, dmin:
  W = d sc q - dmin m per lane (2.625 bits a weight);
- Q3_K (kind 3): 3-bit codes u, their 2 low bits as Q2_K's, then 4 masks of 64 bits (mask p: bit 2 of V_p);
  meta the block's 12 bytes of 6-bit scales and float16 d: W = d (sc - 32) (u - 4) per lane (3.4375);
- IQ4_XS (kind 12): 4-bit indices i as Q4_K's nibbles; meta float16 d, the uint16 of the scales' top 2
  bits, their 4 bytes of low nibbles: W = d (ls - 32) T[i] per 32-value sub-block, GGML's IQ4_NL table T,
  which the kernels read as u = T[i] + 128 with the offset code 128 (4.25).

So every lane (16 values) is W = S (q - c) + O with S, O from the meta in float32 (each product exact: an
11-bit significand times integers below 2^13) and c the kind's offset code (Q3_K 4, IQ4_XS 128), as Q6_K's
(c = 32): the dequantization equals GGML's bit for bit.
"""

from __future__ import annotations

import numpy as np
import torch

KINDS = {"Q2_K": 2, "Q3_K": 3, "IQ4_XS": 12}
FILE_BYTES = {"Q2_K": 84, "Q3_K": 110, "IQ4_XS": 136}  # per super-block in GGUF
CODE_BYTES = {2: 64, 3: 96, 12: 128}  # per super-block here (cpu_kquant.h code_bytes)
META_BYTES = {2: 20, 3: 14, 12: 8}
OFFSET_CODE = {2: 0, 3: 4, 12: 128}  # c in W = S (q - c) + O
IQ4_NL_VALUES = np.array([-127, -104, -83, -65, -49, -35, -22, -10, 1, 13, 25, 38, 53, 69, 89, 113], np.int16)


def _two_bit_planes(x: np.ndarray) -> np.ndarray:
    """(..., 64) bytes of four 2-bit fields to (..., 4, 64): field p of byte i (bits 2p, 2p + 1)."""
    return (x[..., None, :] >> (2 * np.arange(4, dtype=np.uint8))[:, None]) & 3


def codes_in_order(ggml_type: str, blocks: np.ndarray) -> np.ndarray:
    """(rows, nsb, 256) uint8 codes of GGML super-blocks (rows, nsb, type size) in value order: Q2_K's q,
    Q3_K's u (0..7), IQ4_XS's table indices."""
    n, nsb, _ = blocks.shape
    if ggml_type == "IQ4_XS":  # sub-block s: 16 bytes, low nibbles values 0..15, high 16..31
        qs = blocks[..., 8:].reshape(n, nsb, 8, 1, 16)
        return ((qs >> np.array([0, 4], np.uint8)[:, None]) & 15).reshape(n, nsb, 256)
    head = 16 if ggml_type == "Q2_K" else 32
    # value 128 h + 32 j + l: field j (bits 2j) of byte 32 h + l of the 64 code bytes
    q = _two_bit_planes(blocks[..., head : head + 64].reshape(n, nsb, 2, 32)).reshape(n, nsb, 256)
    if ggml_type == "Q3_K":  # its third bit: bit 4 h + j of hmask[l]
        hm = blocks[..., :32].reshape(n, nsb, 1, 32)
        q = q | ((((hm >> np.arange(8, dtype=np.uint8)[:, None]) & 1) << 2).reshape(n, nsb, 256))
    return q.astype(np.uint8)


def meta_of(ggml_type: str, blocks: np.ndarray) -> np.ndarray:
    """(rows, nsb, META_BYTES) the scale bytes of GGML super-blocks, as stored."""
    if ggml_type == "Q2_K":
        return np.concatenate([blocks[..., :16], blocks[..., 80:84]], axis=-1)
    if ggml_type == "Q3_K":
        return blocks[..., 96:110]
    return blocks[..., :8]


def lane_record(kind: int, v: np.ndarray) -> np.ndarray:
    """(rows, nsb, 4, 64) codes as byte vectors V0..V3 (lane order) to (rows, nsb, CODE_BYTES) records."""
    if kind == 12:
        return np.concatenate([v[:, :, 0] | (v[:, :, 1] << 4), v[:, :, 2] | (v[:, :, 3] << 4)], axis=-1)
    low = (v & 3) << (2 * np.arange(4, dtype=np.uint8))[:, None]
    parts = [low.sum(axis=2, dtype=np.uint8)]
    if kind == 3:
        parts += [np.packbits((v[:, :, p] >> 2) & 1, axis=-1, bitorder="little") for p in range(4)]
    return np.concatenate(parts, axis=-1)


def lane_codes(kind: int, rec: torch.Tensor) -> torch.Tensor:
    """The inverse of ``lane_record``: (rows, nsb, CODE_BYTES) int32 records to (rows, nsb, 4, 64) codes."""
    n, nsb = rec.shape[:2]
    if kind == 12:
        nib = rec.reshape(n, nsb, 2, 64)
        return torch.stack([nib & 15, nib >> 4], dim=3).reshape(n, nsb, 4, 64)
    shifts = 2 * torch.arange(4, dtype=torch.int32, device=rec.device)
    v = (rec[..., None, :64] >> shifts[:, None]) & 3
    if kind == 3:
        bit = torch.arange(8, dtype=torch.int32, device=rec.device)
        masks = (rec[..., 64:].reshape(n, nsb, 4, 8, 1) >> bit) & 1
        v = v | (masks.reshape(n, nsb, 4, 64) << 2)
    return v


def _q3_scales(packed: torch.Tensor) -> torch.Tensor:
    """Q3_K's 12 bytes (..., 12) to its 16 6-bit scales (..., 16): scale s's low nibble in byte s % 8 (the
    high nibble for s >= 8), its top 2 bits at bits 2 (s / 4) of byte 8 + s % 4."""
    low = torch.cat([packed[..., :8] & 15, packed[..., :8] >> 4], dim=-1)
    top = (packed[..., 8:12].unsqueeze(-2) >> (2 * torch.arange(4, device=packed.device))[:, None]) & 3
    return low | (top.reshape(*packed.shape[:-1], 16) << 4)


def lane_values(
    kind: int, q: torch.Tensor, meta: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """(q - c (N, K) int32 (IQ4_XS: the table's values), S, O (N, K/16) float32 per 16-value lane) from the
    codes in value order (N, K) and the meta records (N, nsb, META_BYTES) uint8: W = S (q - c) + O."""
    n, nsb, _ = meta.shape

    def half(at: int) -> torch.Tensor:  # (n, nsb, 1) float32 of the float16 at byte ``at``
        return meta[..., at : at + 2].contiguous().view(torch.float16).float()

    m = meta.int()
    if kind == 2:
        s, o = half(16) * (m[..., :16] & 15).float(), -(half(18) * (m[..., :16] >> 4).float())
        return q.int(), s.reshape(n, -1), o.reshape(n, -1)
    if kind == 3:
        s = half(12) * (_q3_scales(m[..., :12]) - 32).float()
        return q.int() - 4, s.reshape(n, -1), torch.zeros(n, nsb * 16, device=q.device)
    high = (m[..., 2] | (m[..., 3] << 8)).unsqueeze(-1) >> (2 * torch.arange(8, device=q.device))
    low = torch.stack([m[..., 4:8] & 15, m[..., 4:8] >> 4], dim=-1).reshape(n, nsb, 8)
    s = half(0) * ((low | ((high & 3) << 4)) - 32).float()  # (n, nsb, 8) per 32-value sub-block
    table = torch.from_numpy(IQ4_NL_VALUES).to(q.device).int()
    return (
        table[q.long()],
        s.repeat_interleave(2, dim=-1).reshape(n, -1),
        torch.zeros(n, nsb * 16, device=q.device),
    )
