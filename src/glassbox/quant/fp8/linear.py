"""The linear layer that runs ``Fp8Weights`` (quant/fp8/weights.py): FP8 checkpoints kept 8-bit.

On the CPU (float32 or bf16 activations, C kernels built): decode rows run kernels/cpu_fp8.c's GEMV
(E4M3 widened in registers, float32 sums per scale block); more rows multiply the weight dequantized a tile
of rows at a time (to the activations' dtype, exact in float32) in a GEMM, so no full-size copy of the
weight is ever held. On CUDA with triton (``triton`` set by layers/block_linear.to_triton) the codes are
read by kernels/triton_fp8_linear.py (a GEMV for one decode row, dots of the dequantized steps for more),
except that steps of ``W8A8_MIN_ROWS`` or more bf16 rows with per-channel or per-tensor scales run W8A8,
``torch._scaled_mm`` on FP8 tensor cores (quant/fp8/quantize.py), where the device has them. Elsewhere
(float16 on the CPU, no C compiler, CUDA without triton) the weight is dequantized by PyTorch ops
(``w.to(float32) * scale``) for each call. Activations are quantized only on the W8A8 path.
"""

from __future__ import annotations

import ctypes
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

from glassbox.quant.blocks.linear import kernel_chosen, step_kernel_choice
from glassbox.quant.blocks.weights import native_library
from glassbox.quant.fp8.w8a8 import W8A8_MIN_ROWS, row_scales, scaled_mm_rows, w8a8_available
from glassbox.quant.fp8.weights import Fp8Weights, concat

# Up to this many rows run the GEMV, more the tiled dequantize + GEMM (benchmarks/fp8_gemv.py, a 2048 x
# 2048 layer with 128 x 128 blocks, one thread, bf16, fastest calls: GEMV 0.80 / 1.74 / 2.38 ms at 8 / 16 /
# 24 rows, tiles 1.33 / 1.63 / 1.92 ms; per-channel scales: GEMV 1.17 ms at 16 rows). Level at about 16,
# the engine's decode-step rule for block weights too.
KERNEL_ROWS = 16
# Weight rows dequantized per GEMM tile: 256 x 4096 bf16 is 2 MiB, about one core's L2.
TILE_ROWS = 256


class Fp8Linear(nn.Module):
    """y = x W^T + b with W in ``Fp8Weights``; the codes and scales are (non-persistent) buffers, so that
    ``.to(device)`` moves them and ``model.buffers()`` counts their bytes."""

    kernel_rows = KERNEL_ROWS
    tile_rows = TILE_ROWS
    codes: torch.Tensor
    scales: torch.Tensor
    w8a8_scales: torch.Tensor | None

    def __init__(self, weights: Fp8Weights, bias: torch.Tensor | None = None) -> None:
        super().__init__()
        self.register_buffer("codes", weights.codes, persistent=False)
        self.register_buffer("scales", weights.scales, persistent=False)
        self.block_rows, self.block_cols, self.label = weights.block_rows, weights.block_cols, weights.label
        self.out_features, self.in_features = weights.out_features, weights.in_features
        # float32 whatever the model's dtype (the kernel adds it in float); a parameter, so that a
        # checkpoint's bias loads into it by name
        self.bias = (
            None if bias is None else nn.Parameter(bias.detach().float().contiguous(), requires_grad=False)
        )
        self._args: tuple[Any, ...] | None = None  # the GEMV's weight arguments, taken at the first call
        rs = row_scales(weights)  # (1, N) per-channel scales for W8A8 (None: block scales)
        self.register_buffer("w8a8_scales", rs, persistent=False)
        self.triton = False  # run the Triton kernels (CUDA; block_linear.to_triton sets it)

    @property
    def w(self) -> Fp8Weights:
        return Fp8Weights(self.codes, self.scales, self.block_rows, self.block_cols, self.label)

    @property
    def kept_weights(self) -> Fp8Weights:  # what the engine counts (layers/block_linear.block_weights)
        return self.w

    @property
    def nbytes(self) -> int:
        return self.codes.numel() + 4 * self.scales.numel()

    def extra_repr(self) -> str:
        return f"in_features={self.in_features}, out_features={self.out_features}, {self.label}"

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        lead = x.shape[:-1]
        x2 = x.reshape(-1, self.in_features)
        if self.triton:
            if self._w8a8(x2):  # prompt rows on FP8 tensor cores
                y = scaled_mm_rows(x2, self.codes, self.w8a8_scales, self.bias)  # type: ignore[arg-type]
            else:
                y = _triton_fp8(x2, self, kernel_chosen(x2.shape[0]))
            return y.view(*lead, self.out_features)
        on_kernels = x.device.type == "cpu" and x.dtype in (torch.float32, torch.bfloat16)
        if not on_kernels or native_library() is None:
            bias = None if self.bias is None else self.bias.to(x.dtype)
            return F.linear(x, self.w.dequantize_reference(x.dtype), bias)
        rows = x2.shape[0]
        step = step_kernel_choice()  # the engine's step: decode-only (True) or with prompt rows (False)
        use_gemv = rows <= self.kernel_rows and step is not False
        y = self._gemv(x2.contiguous()) if use_gemv else self._tiled(x2)
        return y.view(*lead, self.out_features)

    def _w8a8(self, x: torch.Tensor) -> bool:
        """Whether these rows run W8A8 (``scaled_mm_rows``): more than a decode step's rows, bf16, scales
        per channel, widths that cuBLAS's FP8 GEMM takes (multiples of 16), FP8 tensor cores here."""
        return (
            x.shape[0] >= W8A8_MIN_ROWS
            and x.dtype == torch.bfloat16
            and self.w8a8_scales is not None
            and self.in_features % 16 == 0
            and self.out_features % 16 == 0
            and w8a8_available(x.device)
        )

    def _gemv(self, x: torch.Tensor) -> torch.Tensor:
        lib = native_library()
        assert lib is not None
        if self._args is None:
            bias = None if self.bias is None else ctypes.c_void_p(self.bias.data_ptr())
            self._args = (*self.w.kernel_args(), bias, self.out_features)
        out = torch.empty(x.shape[0], self.out_features, dtype=x.dtype)
        lib.gb_fp8_gemv(x.data_ptr(), x.shape[0], self.in_features, *self._args, out.data_ptr(),
                        int(x.dtype == torch.bfloat16), torch.get_num_threads())  # fmt: skip
        return out

    def _tiled(self, x: torch.Tensor) -> torch.Tensor:
        """Rows of W dequantized ``tile_rows`` at a time into one buffer, each tile's GEMM written into its
        columns of the output."""
        w, n, t = self.w, self.out_features, self.tile_rows
        bias = None if self.bias is None else self.bias.to(x.dtype)
        if n <= t:
            return F.linear(x, w.dequantize(x.dtype), bias)
        out = torch.empty(x.shape[0], n, dtype=x.dtype)
        buf = torch.empty(t, self.in_features, dtype=x.dtype)
        for n0 in range(0, n, t):
            n1 = min(n, n0 + t)
            tile = w.dequantize(x.dtype, (n0, n1), buf[: n1 - n0])
            torch.mm(x, tile.t(), out=out[:, n0:n1])
        if bias is not None:
            out += bias
        return out


@torch.compiler.disable  # a launch, not a graph: torch.compile of the MLP around it breaks here
def _triton_fp8(x: torch.Tensor, lin: Fp8Linear, decode: bool) -> torch.Tensor:
    from glassbox.kernels.triton_fp8_linear import fp8_matmul

    return fp8_matmul(x.contiguous(), lin.codes, lin.scales, lin.block_rows, lin.block_cols, lin.bias, decode)


def concat_fp8(linears: list[Fp8Linear]) -> Fp8Linear | None:
    """One Fp8Linear for linears side by side (a fused q/k/v or gate/up), or None when their weights do
    not stack (layers/fp8_weights.concat) or only some carry a bias."""
    weights = concat([lin.w for lin in linears])
    biases = [lin.bias for lin in linears]
    if weights is None or (any(b is None for b in biases) and any(b is not None for b in biases)):
        return None
    bias = None if biases[0] is None else torch.cat([b for b in biases if b is not None])
    return Fp8Linear(weights, bias)
