"""Test helper: GGML blocks of float weights for the types the gguf package cannot quantize and
kquant_factory.py does not make: IQ4_NL (32 values), IQ4_XS, Q3_K and Q2_K (256-value super-blocks).

Plain rounding quantizers, not llama.cpp's (which searches scales): per (sub-)block a scale from its
range, sub-block scales in the format's integers under a float16 super-block scale, each value's code the
nearest the stored scales allow. The bytes follow GGML's block layouts (checked by decoding them with
gguf.quants.dequantize, as the tests do).
"""

from __future__ import annotations

import numpy as np
from gguf import GGMLQuantizationType as Q

IQ4_NL_VALUES = np.array(
    [-127, -104, -83, -65, -49, -35, -22, -10, 1, 13, 25, 38, 53, 69, 89, 113], np.float32
)
LOWBIT_QUANTIZABLE = (Q.IQ4_NL, Q.IQ4_XS, Q.Q3_K, Q.Q2_K)


def _safe_div(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    return np.divide(a, b, out=np.zeros(np.broadcast(a, b).shape, np.float32), where=b != 0)


def _nearest_nl(x: np.ndarray, scale: np.ndarray) -> np.ndarray:
    """Indices (uint8) of the table values nearest x / scale (scale broadcast over x's last axis)."""
    r = _safe_div(x, scale[..., None])
    return np.abs(r[..., None] - IQ4_NL_VALUES).argmin(-1).astype(np.uint8)


def _nibble_pairs(q: np.ndarray) -> np.ndarray:
    """(..., 32) 4-bit codes to (..., 16) bytes: low nibbles values 0..15, high 16..31."""
    return (q[..., :16] | (q[..., 16:] << 4)).astype(np.uint8)


def _iq4_nl(x: np.ndarray) -> np.ndarray:
    """IQ4_NL blocks of x (n, 32): float16 d, 16 bytes of indices."""
    at = np.abs(x).argmax(-1)
    d = (np.take_along_axis(x, at[:, None], -1)[:, 0] / -127.0).astype(np.float16)
    q = _nearest_nl(x, d.astype(np.float32))
    return np.concatenate([d[:, None].view(np.uint8), _nibble_pairs(q)], -1)


def _iq4_xs(x: np.ndarray) -> np.ndarray:
    """IQ4_XS blocks of x (n, 256): float16 d, uint16 of the scales' top 2 bits, 4 bytes of their low
    nibbles, 128 bytes of indices; sub-block s's scale d (ls_s - 32), ls_s 6 bits."""
    n = x.shape[0]
    sub = x.reshape(n, 8, 32)
    at = np.abs(sub).argmax(-1)
    want = np.take_along_axis(sub, at[..., None], -1)[..., 0] / -127.0  # each sub-block's ideal scale
    d = (np.abs(want).max(-1) / 31.0).astype(np.float16)
    ls = np.clip(np.round(_safe_div(want, d.astype(np.float32)[:, None])), -32, 31).astype(np.int32) + 32
    q = _nearest_nl(sub, d.astype(np.float32)[:, None] * (ls - 32).astype(np.float32))
    low = (ls & 15).astype(np.uint8)
    high = ((ls >> 4) << (2 * np.arange(8))).sum(-1).astype(np.uint16)
    return np.concatenate(
        [d[:, None].view(np.uint8), high[:, None].view(np.uint8), low[:, 0::2] | (low[:, 1::2] << 4),
         _nibble_pairs(q).reshape(n, 128)], -1,
    )  # fmt: skip


def _q3_k(x: np.ndarray) -> np.ndarray:
    """Q3_K blocks of x (n, 256): 32 bytes of high bits, 64 of 2-bit codes, 12 of 6-bit scales, float16 d;
    value i of sub-block s (16 values) is d (sc_s - 32) (u - 4), u 3 bits."""
    n = x.shape[0]
    sub = x.reshape(n, 16, 16)
    want = np.abs(sub).max(-1) / 4.0 * np.where(np.arange(16) % 3 == 0, -1.0, 1.0)  # scales of either sign
    d = (np.abs(want).max(-1) / 31.0).astype(np.float16)
    sc = np.clip(np.round(_safe_div(want, d.astype(np.float32)[:, None])), -32, 31).astype(np.int32)
    s = d.astype(np.float32)[:, None] * sc
    u = (np.clip(np.round(_safe_div(sub, s[..., None])), -4, 3) + 4).astype(np.uint8).reshape(n, 256)
    # codes: value 128 h + 32 j + l has its 2 bits at byte 32 h + l, shift 2 j; its high bit at hmask[l] bit 4h + j
    v = u.reshape(n, 2, 4, 32)
    qs = ((v & 3) << (2 * np.arange(4, dtype=np.uint8))[:, None]).sum(2).astype(np.uint8).reshape(n, 64)
    hm = ((v >> 2).reshape(n, 8, 32) << np.arange(8, dtype=np.uint8)[:, None]).sum(1).astype(np.uint8)
    us = (sc + 32).astype(np.uint8)  # 6 bits: low nibbles of 0..7 in bytes 0-7, of 8..15 their high nibbles
    packed_low = (us[:, :8] & 15) | ((us[:, 8:] & 15) << 4)
    top = (us >> 4).reshape(n, 4, 4)  # byte 8 + i: top bits of scales i, i + 4, i + 8, i + 12
    packed_high = (top << (2 * np.arange(4, dtype=np.uint8))[:, None]).sum(1).astype(np.uint8)
    return np.concatenate([hm, qs, packed_low, packed_high, d[:, None].view(np.uint8)], -1)


def _q2_k(x: np.ndarray) -> np.ndarray:
    """Q2_K blocks of x (n, 256): 16 bytes of 4-bit scales and mins, 64 of 2-bit codes, float16 d, dmin;
    value i of sub-block s is d sc_s q - dmin m_s."""
    n = x.shape[0]
    sub = x.reshape(n, 16, 16)
    lo = np.minimum(sub.min(-1), 0.0)
    scale = (sub.max(-1) - lo) / 3.0
    d = (scale.max(-1) / 15.0).astype(np.float16)
    dmin = (-lo.min(-1) / 15.0).astype(np.float16)
    sc = np.clip(np.round(_safe_div(scale, d.astype(np.float32)[:, None])), 0, 15).astype(np.uint8)
    mn = np.clip(np.round(_safe_div(-lo, dmin.astype(np.float32)[:, None])), 0, 15).astype(np.uint8)
    s = d.astype(np.float32)[:, None] * sc
    m = dmin.astype(np.float32)[:, None] * mn
    q = (
        np.clip(np.round(_safe_div(sub + m[..., None], s[..., None])), 0, 3)
        .astype(np.uint8)
        .reshape(n, 2, 4, 32)
    )
    qs = (q << (2 * np.arange(4, dtype=np.uint8))[:, None]).sum(2).astype(np.uint8).reshape(n, 64)
    return np.concatenate([sc | (mn << 4), qs, d[:, None].view(np.uint8), dmin[:, None].view(np.uint8)], -1)


def quantize_lowbit(values: np.ndarray, qtype: Q) -> np.ndarray:
    """(rows, K) float32 to GGML blocks (rows, row bytes) uint8: K a multiple of 32 (IQ4_NL) or 256."""
    rows = values.shape[0]
    size = 32 if qtype == Q.IQ4_NL else 256
    x = values.astype(np.float32).reshape(-1, size)
    fn = {Q.IQ4_NL: _iq4_nl, Q.IQ4_XS: _iq4_xs, Q.Q3_K: _q3_k, Q.Q2_K: _q2_k}.get(qtype)
    if fn is None:
        raise ValueError(f"not a type quantized here: {qtype.name}")
    return fn(x).reshape(rows, -1)
