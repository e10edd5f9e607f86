"""GGUF's 32-value block types kept in ``BlockWeights`` (quant/blocks/weights.py), repacked at load: Q4_0, Q4_1
and Q8_0 (weights.from_gguf), and the types llama.cpp's quantizer falls back to where a row is not whole
256-value super-blocks (a Qwen2.5-0.5B's 896-wide rows in a Q4_K_M file: Q5_0; Q5_K_M: Q5_1; IQ files:
IQ4_NL):

- Q5_0 (22 bytes: float16 d, 4 bytes of fifth bits, 16 of nibbles): W = d (q - 16), q 5 bits, stored as
  5-bit codes with the constant offset -16 d (5.5 bits a weight);
- Q5_1 (24 bytes: d, float16 min m, then as Q5_0): W = d q + m, the min stored as Q4_1's (6 bits);
- IQ4_NL (18 bytes: d, 16 of nibbles): W = d T[q] for GGML's table T of 16 int8 values, stored as 4-bit
  indices (``nonlinear``: the kernels look the codes up) with the constant offset -128 d on T + 128 (4.5).

Every product d q is exact in float32 (an 11-bit significand times an integer below 2^8), so the
dequantization equals GGML's (gguf.quants.dequantize) bit for bit.
"""

from __future__ import annotations

import numpy as np

from glassbox.quant.blocks.weights import BLOCK, BlockWeights, _pack
from glassbox.quant.blocks.weights import from_gguf as from_gguf_4_8

FILE_BYTES = {"Q5_0": 22, "Q5_1": 24, "IQ4_NL": 18}  # per 32-value block
TYPES = ("Q4_0", "Q4_1", "Q8_0", *FILE_BYTES)  # the GGML types this layout reads


def _nibbles(qs: np.ndarray) -> np.ndarray:
    """(n, nb, 16) bytes to (n, nb, 32) codes: low nibbles values 0..15, high nibbles 16..31."""
    return np.concatenate([qs & 15, qs >> 4], axis=-1).astype(np.uint8)


def from_gguf(ggml_type: str, raw: np.ndarray, shape: tuple[int, ...]) -> BlockWeights:
    """A GGUF tensor's block bytes (rows, row bytes) of a 32-value block type, HF shape (N, K), repacked."""
    if ggml_type not in FILE_BYTES:
        return from_gguf_4_8(ggml_type, raw, shape)
    n, k = shape
    nb = k // BLOCK
    blocks = np.ascontiguousarray(raw).reshape(n, nb, FILE_BYTES[ggml_type])
    d = blocks[:, :, 0:2].copy().view(np.float16).reshape(n, nb)
    if ggml_type == "IQ4_NL":
        w = _pack(_nibbles(blocks[:, :, 2:]), d, None, -128.0, 4, k, ggml_type)
        w.nonlinear = True
        return w
    head = 2 if ggml_type == "Q5_0" else 4
    high = blocks[:, :, head : head + 4]  # bit i (little-endian over the 4 bytes): the fifth bit of value i
    fifth = np.unpackbits(high, axis=-1, bitorder="little")  # (n, nb, 32)
    q = _nibbles(blocks[:, :, head + 4 :]) | (fifth << 4)
    if ggml_type == "Q5_0":
        return _pack(q, d, None, -16.0, 5, k, ggml_type)
    m = blocks[:, :, 2:4].copy().view(np.float16).reshape(n, nb)
    return _pack(q, d, m, 0.0, 5, k, ggml_type)
