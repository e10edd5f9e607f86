"""bf16 linears on the CPU in glassbox's own weight layout: tiles of 16 rows, K in pairs (kernels/cpu_bf16.c).

At batch 1 oneDNN's packed bf16 GEMV (quant/dense/onednn.py ``PackedLinear``, what torch offers) streams weights
at about half the machine's read bandwidth; the tiled kernel streams them ~1.5x faster (benchmarks/
bf16_gemv.py and bf16_decode.py measure them side by side). At prompt sizes oneDNN's GEMM (AMX where the
CPU has it) is several times faster than the tiles' AVX-512 dot products, so where those are what the tiles
multiply with, a step with prompt rows runs it past ``GEMM_ROWS`` rows on the matrix untiled into a temporary
(``TiledBf16Linear.forward``; benchmarks/bf16_prefill.py); where the tiles multiply on AMX (kernels/
cpu_bf16_amx.c) they are faster than that at every row count and run every product (``onednn_prompts``). It
needs AVX-512 BF16; elsewhere, or with ``GLASSBOX_BF16_LINEAR=onednn`` (or ``GLASSBOX_CPU_KERNELS=torch``),
bf16 linears stay oneDNN-packed, the reference path.
"""

from __future__ import annotations

import functools
import os

import torch
import torch.nn.functional as F
from torch import nn

from glassbox.kernels import native
from glassbox.quant.blocks.linear import prompt_step, step_kernel_choice

TILE = 16  # output rows per tile
GEMM_ROWS = 32  # past this many rows (outside decode steps) oneDNN's GEMM on the untiled matrix runs


def tiled_available() -> bool:
    """Whether bf16 linears run the tiled kernel here: the C kernels built with AVX-512 BF16, and not
    turned off (``GLASSBOX_BF16_LINEAR=onednn`` or ``GLASSBOX_CPU_KERNELS=torch``)."""
    choice = os.environ.get("GLASSBOX_BF16_LINEAR", "tiled")
    if choice not in ("tiled", "onednn"):
        raise ValueError(f"GLASSBOX_BF16_LINEAR must be 'tiled' or 'onednn', got {choice!r}")
    if choice == "onednn" or os.environ.get("GLASSBOX_CPU_KERNELS", "native") == "torch":
        return False
    lib = native.library()
    return lib is not None and bool(lib.gb_bf16_dot_native())


@functools.cache
def onednn_prompts() -> bool:
    """Whether prompt-sized products (``GEMM_ROWS`` rows and more) take oneDNN's GEMM on the untiled matrix:
    ``GLASSBOX_BF16_PROMPTS`` "onednn" or "tiles", else (auto) where the CPU has AMX but the tiles multiply
    with AVX-512 dot products (``GLASSBOX_BF16_AMX=off``): oneDNN's AMX GEMM runs several times faster than
    those (~400 vs ~65 GFLOP/s a thread on this Xeon). Where the tiles multiply on AMX themselves they beat
    the untiled GEMM at every row count, the copy included (1 thread, 3072 x 1024 and 1024 x 3072: 0.69 vs
    1.91 ms at 64 rows, 5.2 vs 6.0 and 4.3 vs 7.2 ms at 512; benchmarks/bf16_prefill.py), so prompts stay on
    them; on AVX-512 BF16 alone the tiles kept up with oneDNN (an EPYC, docs/performance.md's CPU table)."""
    choice = os.environ.get("GLASSBOX_BF16_PROMPTS", "auto")
    if choice not in ("auto", "onednn", "tiles"):
        raise ValueError(f"GLASSBOX_BF16_PROMPTS must be 'auto', 'onednn' or 'tiles', got {choice!r}")
    if choice != "auto":
        return choice == "onednn"
    return not native.bf16_tiles_on_amx() and native.cpu_has_amx()


def tile_weight(w: torch.Tensor) -> torch.Tensor:
    """W (N, K) bf16, K even -> (ceil(N / 16), K / 2, 16, 2): rows past N are zeros."""
    n, k = w.shape
    if k % 2:
        raise ValueError(f"the tiled bf16 layout needs an even in-dimension, got {k}")
    pad = -n % TILE
    wp = F.pad(w.detach().to(torch.bfloat16), (0, 0, 0, pad)) if pad else w.detach().to(torch.bfloat16)
    return wp.reshape((n + pad) // TILE, TILE, k // 2, 2).permute(0, 2, 1, 3).contiguous()


def untile_weight(wp: torch.Tensor, n: int) -> torch.Tensor:
    """The (N, K) matrix back from its tiles (tile_weight's inverse)."""
    tiles, k2 = wp.shape[:2]
    return wp.permute(0, 2, 1, 3).reshape(tiles * TILE, 2 * k2)[:n]


def untiled(wp: torch.Tensor, n: int) -> torch.Tensor:
    """``untile_weight`` as a new contiguous matrix, fast: a tile's (K/2, 16) pairs of bf16 are one int32
    each, so untiling is a transpose of int32s (~7x faster than the bf16 permute's copy)."""
    tiles, k2 = wp.shape[:2]
    pairs = wp.view(tiles, k2, 2 * TILE).view(torch.int32)  # (tiles, K/2, 16)
    out = torch.empty(tiles, TILE, k2, dtype=torch.int32)
    out.copy_(pairs.transpose(1, 2))
    return out.view(torch.bfloat16).view(tiles * TILE, 2 * k2)[:n]


def linear_tiled(
    x: torch.Tensor,
    wp: torch.Tensor,
    n: int,
    bias: torch.Tensor | None,
    out_dtype: torch.dtype = torch.bfloat16,
    generic: bool = False,
) -> torch.Tensor:
    """y = x W^T + bias for bf16 x (..., K), W as tiles (``tile_weight``), bias float32 or None; the sums
    rounded once to ``out_dtype`` (bf16 or float32). ``generic``: the kernel's plain-C loop (its reference)."""
    lib = native.library()
    assert lib is not None
    k = 2 * wp.shape[1]
    if x.dtype != torch.bfloat16 or x.shape[-1] != k or x.device.type != "cpu":
        raise ValueError(f"expected bf16 (..., {k}) on the CPU, got {x.dtype} {tuple(x.shape)} {x.device}")
    lead = x.shape[:-1]
    x2 = x.reshape(-1, k)
    if x2.stride(-1) != 1:
        x2 = x2.contiguous()
    rows = x2.shape[0]
    if bias is not None and (bias.dtype != torch.float32 or bias.shape != (n,) or not bias.is_contiguous()):
        raise ValueError(f"expected a contiguous float32 bias of {n}, got {bias.dtype} {tuple(bias.shape)}")
    out = torch.empty(rows, n, dtype=out_dtype)
    fn = lib.gb_linear_bf16t_generic if generic else lib.gb_linear_bf16t
    fn(
        x2.data_ptr(), rows, k, x2.stride(0), wp.data_ptr(), None if bias is None else bias.data_ptr(), n,
        out.data_ptr(), n, native.DTYPE_CODES[out_dtype], torch.get_num_threads(),
    )  # fmt: skip
    return out.view(*lead, n)


class TiledBf16Linear(nn.Module):
    """y = x W^T + b with W held in tiles of 16 rows (bf16, CPU)."""

    tiles: torch.Tensor

    def __init__(self, weight: torch.Tensor, bias: torch.Tensor | None = None) -> None:
        super().__init__()
        self.out_features, self.in_features = weight.shape
        self.register_buffer("tiles", tile_weight(weight), persistent=False)
        self.bias_f32 = None if bias is None else bias.detach().float().contiguous()
        self.nbytes = weight.numel() * 2

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        rows = x.numel() // max(1, x.shape[-1])
        step = step_kernel_choice()
        decode = step is not None and not prompt_step()
        if rows <= GEMM_ROWS or decode or not onednn_prompts():  # few rows, decode steps: the tiles
            return linear_tiled(x, self.tiles, self.out_features, self.bias_f32)
        # many rows of a step with prompt rows (or outside a step): oneDNN's GEMM on the matrix untiled into
        # a temporary (the copy ~1-1.5 ms per 6 MB on one thread), 1.6-2.4x faster than the tiles at 64
        # rows, 3.4-7x at 256 on this AVX-512 / AMX Xeon (benchmarks/bf16_prefill.py); even at 32. Decode
        # steps (a batch, a speculative step's verification rows) stay on the tiles, whose bits do not
        # depend on the rows run together.
        bias = None if self.bias_f32 is None else self.bias_f32.to(torch.bfloat16)
        return F.linear(x, untiled(self.tiles, self.out_features), bias)

    def pointers(self) -> tuple[int, int | None]:
        """The tiles' and the float32 bias's addresses (models/llama_step.py)."""
        return self.tiles.data_ptr(), None if self.bias_f32 is None else self.bias_f32.data_ptr()
