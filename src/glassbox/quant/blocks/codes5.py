"""5-bit codes (GGUF Q5_0, Q5_1) in the 32-value block layout (quant/blocks/weights.py, kernels/cpu_quant.c):
the low 4 bits of each code stored as 4-bit codes are, the fifth bits in 64-bit masks beside them.

A chunk of 16 blocks (512 codes) is its 256 nibble bytes (as at 4 bits), then 8 masks of 8 bytes: bit i of
mask p is bit 4 of byte i of the chunk's code vector p (the 8-bit arrangement: byte 4 j + t of vector p is
block j's code 4 p + t). A pair of blocks past the last whole chunk is its 32 nibble bytes (as at 4 bits),
then one mask whose bit i is bit 4 of the pair's code i (the first block's 32, then the second's). So a row
holds Kp * 5 / 8 bytes: Q5_0's 5.5 bits a weight with the block scale, Q5_1's 6 with the min.
"""

from __future__ import annotations

import torch

BLOCK = 32
CHUNK = 16
_NIBBLES, _MASKS = 256, 64  # bytes of a chunk's nibbles and of its masks
_WEIGHTS = 1 << torch.arange(8, dtype=torch.int32)


def _pack_bits(bits: torch.Tensor) -> torch.Tensor:
    """(..., 8 m) of 0/1 to (..., m) bytes, little-endian bit order."""
    grouped = bits.int().reshape(*bits.shape[:-1], bits.shape[-1] // 8, 8)
    return (grouped * _WEIGHTS.to(bits.device)).sum(-1).to(torch.uint8)


def _unpack_bits(packed: torch.Tensor) -> torch.Tensor:
    """(..., m) bytes to (..., 8 m) of 0/1 (uint8), little-endian bit order."""
    bits = (packed.int().unsqueeze(-1) >> torch.arange(8, device=packed.device)) & 1
    return bits.reshape(*packed.shape[:-1], packed.shape[-1] * 8).to(torch.uint8)


def with_high_bits(nibbles: torch.Tensor, codes: torch.Tensor) -> torch.Tensor:
    """The kernels' bytes (N, Kp * 5 / 8) from the 4-bit layout's bytes of the codes' low nibbles (N, Kp / 2)
    and the codes (N, Kp) in value order."""
    n, kp = codes.shape
    chunks = kp // BLOCK // CHUNK
    cut = chunks * CHUNK * BLOCK
    high = (codes >> 4) & 1
    c = high[:, :cut].reshape(n, chunks, CHUNK, 8, 4).permute(0, 1, 3, 2, 4)  # (n, chunk, p, j, t)
    head = torch.cat(
        [nibbles[:, : cut // 2].reshape(n, chunks, _NIBBLES), _pack_bits(c.reshape(n, chunks, 512))], -1
    )
    pairs = (kp - cut) // (2 * BLOCK)
    tail_masks = _pack_bits(high[:, cut:].reshape(n, pairs, 2 * BLOCK))
    tail = torch.cat([nibbles[:, cut // 2 :].reshape(n, pairs, BLOCK), tail_masks], -1)
    return torch.cat([head.reshape(n, -1), tail.reshape(n, -1)], dim=1)


def split_high_bits(packed: torch.Tensor, kp: int) -> tuple[torch.Tensor, torch.Tensor]:
    """The inverse of ``with_high_bits``: (the 4-bit layout's bytes (N, Kp / 2), bit 4 of each code (N, Kp)
    uint8 in value order)."""
    n = packed.shape[0]
    chunks = kp // BLOCK // CHUNK
    cut = chunks * CHUNK * BLOCK
    head = packed[:, : chunks * (_NIBBLES + _MASKS)].reshape(n, chunks, _NIBBLES + _MASKS)
    tail = packed[:, chunks * (_NIBBLES + _MASKS) :].reshape(n, -1, BLOCK + 8)
    nibbles = torch.cat([head[..., :_NIBBLES].reshape(n, -1), tail[..., :BLOCK].reshape(n, -1)], dim=1)
    c = (
        _unpack_bits(head[..., _NIBBLES:]).view(n, chunks, 8, CHUNK, 4).permute(0, 1, 3, 2, 4)
    )  # (n, ch, j, p, t)
    high = torch.cat([c.reshape(n, cut), _unpack_bits(tail[..., BLOCK:]).reshape(n, -1)], dim=1)
    return nibbles, high
