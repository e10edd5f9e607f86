"""Test helper: GGML K-quant blocks (Q4_K, Q5_K, Q6_K) of float weights, which the gguf package cannot
quantize (it only dequantizes them).

A plain rounding quantizer, not llama.cpp's (which searches each sub-block's scale and min): per sub-block a
scale (and for Q4_K/Q5_K a min) from its range, the sub-block scales in 6 bits (Q6_K: int8) under a
float16 super-block scale, the codes rounded with the stored scales. The bytes follow GGML's block layouts
(checked by decoding them with gguf.quants.dequantize, which the tests do).
"""

from __future__ import annotations

import numpy as np
from gguf import GGMLQuantizationType as Q

K_QUANTIZABLE = (Q.Q4_K, Q.Q5_K, Q.Q6_K)


def _round(x: np.ndarray) -> np.ndarray:
    return np.floor(x + 0.5)


def _six_bit(values: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(float16 super-block scale, 6-bit integers) with values ~ scale * integers (values >= 0)."""
    d = (values.max(axis=-1, keepdims=True) / 63).astype(np.float16)
    df = d.astype(np.float32)
    q = np.clip(_round(np.divide(values, df, out=np.zeros_like(values), where=df > 0)), 0, 63)
    return d, q.astype(np.uint8)


def _q4k_like(x: np.ndarray, bits: int) -> np.ndarray:
    """Q4_K (bits 4) or Q5_K (bits 5) blocks of x (n, 256)."""
    n = x.shape[0]
    top = (1 << bits) - 1
    sub = x.reshape(n, 8, 32)
    lo = np.minimum(sub.min(axis=-1), 0.0)
    scale = (sub.max(axis=-1) - lo) / top
    d, sc = _six_bit(scale)
    dmin, mn = _six_bit(-lo)
    s = d.astype(np.float32) * sc  # the stored scale and min, as the format dequantizes them
    m = dmin.astype(np.float32) * mn
    q = _round(np.divide(sub + m[..., None], s[..., None], out=np.zeros_like(sub), where=s[..., None] > 0))
    q = np.clip(q, 0, top).astype(np.uint8).reshape(n, 256)
    packed = np.concatenate(
        [
            sc[:, :4] | ((sc[:, 4:] >> 4) << 6),
            mn[:, :4] | ((mn[:, 4:] >> 4) << 6),
            (sc[:, 4:] & 15) | ((mn[:, 4:] & 15) << 4),
        ],
        axis=-1,
    )
    chunks = (q & 15).reshape(n, 4, 2, 32)  # chunk c: values 64c + i low, 64c + 32 + i high
    qs = (chunks[:, :, 0] | (chunks[:, :, 1] << 4)).reshape(n, 128)
    head = [d.view(np.uint8), dmin.view(np.uint8), packed]
    if bits == 5:  # bit s of qh[i]: the fifth bit of value 32 s + i
        high = ((q >> 4) & 1).reshape(n, 8, 32)
        head.append((high << np.arange(8, dtype=np.uint8)[:, None]).sum(axis=1).astype(np.uint8))
    return np.concatenate([*head, qs], axis=-1)


def _q6k(x: np.ndarray) -> np.ndarray:
    """Q6_K blocks of x (n, 256)."""
    n = x.shape[0]
    sub = x.reshape(n, 16, 16)
    scale = np.abs(sub).max(axis=-1) / 31  # signed int8 sub-block scales: use both signs
    scale = scale * np.where(np.arange(16) % 3 == 0, -1.0, 1.0)
    d = (np.abs(scale).max(axis=-1, keepdims=True) / 127).astype(np.float16)
    df = d.astype(np.float32)
    sc = np.clip(_round(np.divide(scale, df, out=np.zeros_like(scale), where=df > 0)), -128, 127)
    s = (df * sc)[..., None]
    q = np.clip(_round(np.divide(sub, s, out=np.zeros_like(sub), where=s != 0)) + 32, 0, 63)
    q = q.astype(np.uint8).reshape(n, 2, 128)  # half h
    low = (q & 15).reshape(n, 2, 2, 64)  # values 128h + i low nibble, 128h + 64 + i high
    ql = (low[:, :, 0] | (low[:, :, 1] << 4)).reshape(n, 128)
    high = (q >> 4).reshape(n, 2, 4, 32)  # bits 2s..2s+1 of qh[32h + i]: value 128h + 32s + i
    qh = (high << (2 * np.arange(4, dtype=np.uint8))[:, None]).sum(axis=2).astype(np.uint8).reshape(n, 64)
    return np.concatenate([ql, qh, sc.astype(np.int8).view(np.uint8), d.view(np.uint8)], axis=-1)


def quantize_k(values: np.ndarray, qtype: Q) -> np.ndarray:
    """(rows, K) float32, K a multiple of 256, to GGML blocks (rows, K / 256 * type size) uint8."""
    rows, k = values.shape
    x = values.astype(np.float32).reshape(-1, 256)
    if qtype == Q.Q6_K:
        blocks = _q6k(x)
    elif qtype in (Q.Q4_K, Q.Q5_K):
        blocks = _q4k_like(x, 4 if qtype == Q.Q4_K else 5)
    else:
        raise ValueError(f"not a K-quant: {qtype.name}")
    return blocks.reshape(rows, -1)
