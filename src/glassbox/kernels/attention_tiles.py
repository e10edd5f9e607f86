"""Tile shapes of the triton attention kernels (kernels/triton_attention.py) per GPU architecture.

Chosen from the compiled cubins' figures (registers per thread, stack frame, shared memory), read with no
GPU by tests/triton_aot.py, which compiles each launch as Triton's JIT specializes it on the device; every
choice below compiles without a register spill and within the target's shared memory (an H100 lets a
block opt in to 227 KiB, a DGX Spark 99 KiB), and tests/test_triton_compile.py holds that for every launch
configuration. Measured with Triton 3.6 and 3.9, bf16 prefill, registers (stack bytes when it spilled):

| target | head dim | 128 x 64, 8 warps | 128 x 32, 8 warps | 64 x 32, 8 warps |
|---|---|---|---|---|
| sm_90 (H100, wgmma) | 64 | 124-126 | 92-100 | |
| sm_90 | 80, 128 | 198-231 | 156 | |
| sm_90 | 256 | 255 (+64) | 246-251 | 174-207 |
| sm_121 (DGX Spark, mma.sync) | 64 | 181 | 136 | |
| sm_121 | 80, 128 | 255 (+80..104) | 196 | |
| sm_121 | 256 | 255 (+144) | 255 (+112) | 194-196 |

float32 (the exact dot the GPU parity tests run, on the CUDA cores) spills far sooner: 64 x 64 tiles on 4
warps spill from 32 dims on (10 KiB of stack at 128), so 8 warps and 32 x 32 tiles up to 128 dims (198-200
registers), 16 x 32 beyond (104-108).

Without wgmma (sm_8x, sm_12x) the attention tile's accumulators and both dot operands live in registers:
128 query rows by 128 dims spill with 64-key tiles, so those targets take 32-key tiles. Architectures not
measured (sm_10x) take these conservative tiles too. The 16-bit decode kernel (16 query heads x 64 keys per
tile for head dims up to 128, 32 keys beyond, 4 warps) stays under 170 registers everywhere.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass

import torch

HOPPER = (9, 0)  # what the interpreter (a CPU device) takes: its arithmetic is the same for any tiles


@dataclass(frozen=True)
class Tiles:
    block_m: int  # query rows per program (decode: the GQA group, padded to 16)
    block_n: int  # keys per inner step
    num_warps: int
    num_stages: int


@functools.cache
def _cuda_capability(index: int) -> tuple[int, int]:
    major, minor = torch.cuda.get_device_capability(index)
    return int(major), int(minor)


def device_capability(device: torch.device) -> tuple[int, int]:
    """The device's compute capability; a CPU device (triton's interpreter) takes Hopper's tiles."""
    if device.type != "cuda":
        return HOPPER
    return _cuda_capability(device.index if device.index is not None else torch.cuda.current_device())


def prefill_tiles(head_dim: int, dtype: torch.dtype, capability: tuple[int, int]) -> Tiles:
    """The prefill kernel's tiles for ``head_dim`` and the KV cache's ``dtype`` on ``capability``."""
    wgmma = capability[0] == 9
    if dtype.itemsize > 2:  # float32: an exact (FMA) dot with both operands in registers, one stage
        if head_dim <= 32:
            return Tiles(64, 64, 8, 1)
        return Tiles(32, 32, 8, 1) if head_dim <= 128 else Tiles(16, 32, 8, 1)
    if head_dim <= 64:
        return Tiles(128, 64, 8, 2)
    if head_dim <= 128:
        return Tiles(128, 64, 8, 2) if wgmma else Tiles(128, 32, 8, 2)
    return Tiles(128, 32, 8, 2) if wgmma else Tiles(64, 32, 8, 2)


def decode_tiles(head_dim: int, dtype: torch.dtype) -> Tiles:
    """The decode kernel's tiles (``block_m``, the GQA group padded to 16, is the kernel's own). float32
    takes half the keys and 8 warps: 64 keys x 128 dims spill on 4 warps (560 bytes) and, without a
    window, on 8 (304); 32 keys on 8 warps take 56-66 registers."""
    if dtype.itemsize > 2:
        return Tiles(16, 32 if head_dim <= 128 else 16, 8, 2)
    return Tiles(16, 64 if head_dim <= 128 else 32, 4, 2)


def prefill_block_m(head_dim: int, dtype: torch.dtype, device: torch.device) -> int:
    """Query rows per prefill tile on ``device``: the tile layout the executor builds must use this."""
    return prefill_tiles(head_dim, dtype, device_capability(device)).block_m
