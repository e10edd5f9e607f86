"""Tile shapes of the triton attention kernels (kernels/triton_attention.py) per GPU architecture.

Chosen from the compiled cubins' figures (registers per thread, stack frame, shared memory), read with no
GPU by tests/helpers/triton_aot.py, which compiles each launch as Triton's JIT specializes it on the device; every
choice below compiles without a register spill and within the target's shared memory (an H100 lets a
block opt in to 227 KiB, a DGX Spark 99 KiB), and tests/kernels/test_triton_compile.py holds that for every launch
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

An 8-bit cache under a 16-bit model (its codes loaded and converted to the model's dtype in registers,
each key's scale applied to its scores, V dequantized through float32) spills with those tiles on both
targets (255 registers, 8-120 bytes of stack from 80 dims on); 64 x 64 tiles on 8 warps take 123-238
registers up to 128 dims (sm_121 at 64 dims the most), 32 x 32 on 8 warps 170-179 at 256 dims.

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


def attention_dtype(kv_dtype: torch.dtype, model_dtype: torch.dtype) -> torch.dtype:
    """The dtype the kernels' dots take: a 16/32-bit cache's own (the queries are cast to it), the model's
    for an 8-bit cache (its codes are converted to the queries' dtype)."""
    return model_dtype if kv_dtype.itemsize == 1 else kv_dtype


def prefill_tiles(head_dim: int, dtype: torch.dtype, capability: tuple[int, int], kv8: bool = False) -> Tiles:
    """The prefill kernel's tiles for ``head_dim``, the dots' ``dtype`` (attention_dtype) and a cache of
    8-bit rows or not, on ``capability``."""
    wgmma = capability[0] == 9
    if dtype.itemsize > 2:  # float32: an exact (FMA) dot with both operands in registers, one stage
        if head_dim <= 32:
            return Tiles(64, 64, 8, 1)
        return Tiles(32, 32, 8, 1) if head_dim <= 128 else Tiles(16, 32, 8, 1)
    if kv8:  # codes converted in registers before each dot: the 16-bit tiles below spill on both targets
        return Tiles(64, 64, 8, 2) if head_dim <= 128 else Tiles(32, 32, 8, 2)
    if head_dim <= 64:
        return Tiles(128, 64, 8, 2)
    if head_dim <= 128:
        return Tiles(128, 64, 8, 2) if wgmma else Tiles(128, 32, 8, 2)
    return Tiles(128, 32, 8, 2) if wgmma else Tiles(64, 32, 8, 2)


def decode_tiles(head_dim: int, dtype: torch.dtype, kv8: bool = False) -> Tiles:
    """The decode kernel's tiles (``block_m``, the GQA group padded to 16, is the kernel's own) for the
    dots' ``dtype`` and a cache of 8-bit rows or not. float32 takes half the keys and 8 warps: 64 keys x
    128 dims spill on 4 warps (560 bytes) and, without a window, on 8 (304); 32 keys on 8 warps take 56-66
    registers. 8-bit rows under a 16-bit model (the codes converted, V dequantized through float32) spill
    with the 16-bit tiles (255 registers, 8-456 bytes of stack at 128 and 256 dims, 32 keys x 4 warps
    too at 128 on sm_90); 32 keys x 8 warps take 124-163 registers at 128 dims, 16 keys x 8 warps
    102-110 at 256."""
    if dtype.itemsize > 2:
        return Tiles(16, 32 if head_dim <= 128 else 16, 8, 2)
    if kv8:
        return Tiles(16, 32 if head_dim <= 128 else 16, 8, 2)
    return Tiles(16, 64 if head_dim <= 128 else 32, 4, 2)


def prefill_block_m(
    head_dim: int, kv_dtype: torch.dtype, model_dtype: torch.dtype, device: torch.device
) -> int:
    """Query rows per prefill tile on ``device`` for a cache of ``kv_dtype`` and a model of ``model_dtype``:
    the tile layout the executor builds must use this."""
    dtype = attention_dtype(kv_dtype, model_dtype)
    return prefill_tiles(head_dim, dtype, device_capability(device), kv_dtype.itemsize == 1).block_m
