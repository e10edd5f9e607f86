"""Triton linears for FP8 weights (quant/fp8/weights.py ``Fp8Weights``) on CUDA: y = x W^T + b with W read
as the checkpoint stores it, one E4M3 byte a weight, and activations in the model's dtype (weight-only, as
the CPU runs it: W = e4m3(w) s, each weight times its block's float32 scale, rounded once).

The codes are (N, K) row-major, the scales (ceil(N / bn), ceil(K / bk)) for blocks of bn x bk weights (HF
``fp8`` 128 x 128; per-channel scales are blocks of 1 x K, a per-tensor scale one block of N x K). A
program's step loads BLOCK_N rows x BLOCK_K codes (each row's BLOCK_K bytes contiguous) and each weight's
scale by its block indices (from L1: a step touches at most BLOCK_N x 2 scales). The E4M3 byte becomes
float32 by Triton's conversion (hardware on sm_89 and later). As for block weights
(kernels/triton_block_linear.py): one activation row runs a GEMV (float32 products, summed per lane), more
rows a tensor-core dot of the dequantized step; K splits over programs when there are few rows, their
partial sums added in order by ``_split_sum_kernel``. No host value is read (CUDA graphs capture it).

Beside ``torch._scaled_mm`` (W8A8, quant/fp8/quantize.py): these kernels keep the weight-only arithmetic the
CPU runs, for decode rows (where both read the same bytes and no activation is rounded), for block scales
(which row-wise ``_scaled_mm`` cannot carry), float32/float16 activations and devices without FP8 tensor
cores (compute capability below 8.9); quant/fp8/linear.py picks per call. They are checked under Triton's
interpreter (tests/kernels/test_triton_fp8_linear.py) and compiled for sm_90 and sm_121 (tests/kernels/test_triton_compile.py).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import triton
import triton.language as tl

from glassbox.kernels.triton_block_gemv import _finish_row
from glassbox.kernels.triton_block_linear import DECODE_ROWS, _dot, _finish, _split_sum_kernel, _splits


@triton.jit
def _weights(codes_ptr, row_ptrs, srow_ptrs, k, K, block_cols):  # type: ignore[no-untyped-def]
    """A step's (BLOCK_N, BLOCK_K) weights in float32: E4M3 codes times their blocks' scales (0 past K)."""
    kmask = (k < K)[None, :]
    c = tl.load(codes_ptr + row_ptrs[:, None] + k[None, :], mask=kmask, other=0)
    s = tl.load(srow_ptrs[:, None] + (k // block_cols)[None, :], mask=kmask, other=0.0)
    return c.to(tl.float8e4nv, bitcast=True).to(tl.float32) * s


@triton.jit
def _fp8_mm_kernel(  # type: ignore[no-untyped-def]
    x_ptr,
    codes_ptr,
    scales_ptr,
    bias_ptr,
    out_ptr,
    ws_ptr,
    M,
    N,
    K,
    stride_xm,
    stride_om,
    stride_sn,
    block_rows,
    block_cols,
    HAS_BIAS: tl.constexpr,
    BLOCK_M: tl.constexpr,
    BLOCK_N: tl.constexpr,
    BLOCK_K: tl.constexpr,
    IEEE: tl.constexpr,
) -> None:
    # grid (M / BLOCK_M, N / BLOCK_N, splits)
    pid_m = tl.program_id(0)
    pid_n = tl.program_id(1)
    pid_k = tl.program_id(2)
    splits = tl.num_programs(2)
    m = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
    x_row = x_ptr + m.to(tl.int64)[:, None] * stride_xm
    n = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    nc = tl.minimum(n, N - 1).to(tl.int64)  # rows past N read the last one (their outputs are masked)
    srow = scales_ptr + (nc // block_rows) * stride_sn
    steps = tl.cdiv(K, BLOCK_K)
    per = tl.cdiv(steps, splits)
    acc = tl.zeros([BLOCK_M, BLOCK_N], dtype=tl.float32)
    for step in range(pid_k * per, tl.minimum(steps, pid_k * per + per)):
        k = step * BLOCK_K + tl.arange(0, BLOCK_K)
        x = tl.load(x_row + k[None, :], mask=(m < M)[:, None] & (k < K)[None, :], other=0.0)
        w = _weights(codes_ptr, nc * K, srow, k, K, block_cols)
        acc = _dot(x, w.to(x.dtype), acc, IEEE)
    _finish(acc, m, n, M, N, bias_ptr, out_ptr, ws_ptr, stride_om, pid_k, splits, HAS_BIAS)


@triton.jit
def _fp8_gemv_kernel(  # type: ignore[no-untyped-def]
    x_ptr,
    codes_ptr,
    scales_ptr,
    bias_ptr,
    out_ptr,
    ws_ptr,
    N,
    K,
    stride_sn,
    block_rows,
    block_cols,
    HAS_BIAS: tl.constexpr,
    BLOCK_N: tl.constexpr,
    BLOCK_K: tl.constexpr,
) -> None:
    # grid (N / BLOCK_N, splits): one activation row
    pid_n = tl.program_id(0)
    pid_k = tl.program_id(1)
    splits = tl.num_programs(1)
    n = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    nc = tl.minimum(n, N - 1).to(tl.int64)
    srow = scales_ptr + (nc // block_rows) * stride_sn
    steps = tl.cdiv(K, BLOCK_K)
    per = tl.cdiv(steps, splits)
    acc = tl.zeros([BLOCK_N, BLOCK_K], dtype=tl.float32)
    for step in range(pid_k * per, tl.minimum(steps, pid_k * per + per)):
        k = step * BLOCK_K + tl.arange(0, BLOCK_K)
        x = tl.load(x_ptr + k, mask=k < K, other=0.0).to(tl.float32)
        acc += _weights(codes_ptr, nc * K, srow, k, K, block_cols) * x[None, :]
    _finish_row(tl.sum(acc, 1), n, N, bias_ptr, out_ptr, ws_ptr, pid_k, splits, HAS_BIAS)


@dataclass(frozen=True)
class Fp8Tiles:
    block_m: int  # 1: the GEMV
    block_n: int
    block_k: int
    num_warps: int
    num_stages: int


def fp8_tiles(rows: int, dtype: torch.dtype, decode: bool) -> Fp8Tiles:
    """One row of a decode step: the GEMV (16 rows x 256 codes a step); float32 (the exact FMA dot):
    small tiles; 16-bit decode rows: 16-row dots; prompt rows: 64 or 128 x 128 tiles."""
    if decode and rows == 1:
        return Fp8Tiles(1, 16, 256, 4, 3)
    if dtype.itemsize > 2:
        return Fp8Tiles(16 if rows <= 16 else 32, 32, 64, 4, 1)
    if rows <= DECODE_ROWS:
        return Fp8Tiles(16, 64, 128, 4, 3)
    # 2 stages: 3 take 112 KiB of shared memory at 128 rows, past a DGX Spark's 99 KiB
    return Fp8Tiles(64 if rows <= 64 else 128, 128, 64, 8, 2)


def fp8_matmul(
    x: torch.Tensor,  # (M, K), contiguous rows
    codes: torch.Tensor,  # (N, K) uint8, E4M3 bytes
    scales: torch.Tensor,  # (Sn, Sk) float32
    block_rows: int,
    block_cols: int,
    bias: torch.Tensor | None,  # (N,) float32
    decode: bool,  # a decode step: one row takes the GEMV, up to DECODE_ROWS split K
    splits: int | None = None,  # K splits (None: from the SMs; tests force them)
) -> torch.Tensor:
    """x W^T + bias, (M, N) in x's dtype."""
    m, k = x.shape
    n = codes.shape[0]
    assert x.stride(1) == 1 and codes.is_contiguous() and scales.stride(1) == 1 and codes.shape[1] == k
    out = torch.empty(m, n, dtype=x.dtype, device=x.device)
    bias_arg = bias if bias is not None else scales
    t = fp8_tiles(m, x.dtype, decode)
    grid_mn = triton.cdiv(m, max(1, t.block_m)) * triton.cdiv(n, t.block_n)
    split_k = decode and m <= DECODE_ROWS
    s = (splits or _splits(grid_mn, triton.cdiv(k, t.block_k), x.device)) if split_k else 1
    ws = torch.empty(s, m, n, dtype=torch.float32, device=x.device) if s > 1 else out
    if t.block_m == 1:
        _fp8_gemv_kernel[(triton.cdiv(n, t.block_n), s)](
            x, codes, scales, bias_arg, out, ws, n, k, scales.stride(0), block_rows, block_cols,
            HAS_BIAS=bias is not None, BLOCK_N=t.block_n, BLOCK_K=t.block_k, num_warps=t.num_warps,
            num_stages=t.num_stages,
        )  # fmt: skip
    else:
        _fp8_mm_kernel[(triton.cdiv(m, t.block_m), triton.cdiv(n, t.block_n), s)](
            x, codes, scales, bias_arg, out, ws, m, n, k, x.stride(0), out.stride(0), scales.stride(0),
            block_rows, block_cols, HAS_BIAS=bias is not None, BLOCK_M=t.block_m, BLOCK_N=t.block_n,
            BLOCK_K=t.block_k, IEEE=x.dtype == torch.float32, num_warps=t.num_warps, num_stages=t.num_stages,
        )  # fmt: skip
    if s > 1:
        _split_sum_kernel[(m, triton.cdiv(n, 1024))](
            ws, bias_arg, out, m, n, out.stride(0), s, HAS_BIAS=bias is not None, BLOCK=1024, num_warps=4
        )
    return out
