"""FP8 (E4M3) weights kept as a checkpoint stores them: one byte per weight and a float32 scale per block.

``Fp8Weights``: codes uint8 (N, K), the E4M3 ("e4m3fn") bytes as stored; scales float32 (Sn, Sk), one per
block of ``block_rows`` x ``block_cols`` weights, W[n, k] = e4m3(codes[n, k]) * scales[n // bn, k // bk]
(the last blocks of a row or column may be short: Sn = ceil(N / bn), Sk = ceil(K / bk)). A per-tensor
scale is one block of N x K, per-channel scales N blocks of 1 x K, the HF "fp8" layout 128 x 128 blocks.
So 8 bits per weight plus 32 per block (128 x 128: 8.002 bits). quant/fp8/checkpoint.py builds them,
quant/fp8/linear.py runs them; kernels/cpu_fp8.c holds the CPU kernels. ``dequantize_reference`` (PyTorch
ops: ``codes.to(float32) * scale``) is the format's definition, the kernels' reference and the fallback on
any device.
"""

from __future__ import annotations

import ctypes
from dataclasses import dataclass

import torch

from glassbox.quant.blocks.weights import native_library

# The kernels read a block of columns in whole 16-value vectors (the last one of a row may be short).
COLUMN_STEP = 16


@dataclass
class Fp8Weights:
    codes: torch.Tensor  # uint8 (N, K)
    scales: torch.Tensor  # float32 (ceil(N / block_rows), ceil(K / block_cols))
    block_rows: int
    block_cols: int
    label: str  # for logs and the trace: "FP8 block 128x128", "FP8 per-channel", "FP8 per-tensor"

    def __post_init__(self) -> None:
        n, k = self.codes.shape
        rows, cols = -(-n // self.block_rows), -(-k // self.block_cols)
        if self.codes.dtype != torch.uint8 or self.scales.dtype != torch.float32:
            raise ValueError(f"FP8 weights are uint8 codes and float32 scales, got {self.codes.dtype}, "
                             f"{self.scales.dtype}")  # fmt: skip
        if tuple(self.scales.shape) != (rows, cols):
            raise ValueError(
                f"scales {tuple(self.scales.shape)} do not cover a {n}x{k} weight in {self.block_rows}x"
                f"{self.block_cols} blocks ({rows}x{cols})"
            )
        if self.block_cols < k and self.block_cols % COLUMN_STEP:
            raise ValueError(
                f"column blocks of {self.block_cols}: the kernels need a multiple of {COLUMN_STEP}"
            )

    @property
    def out_features(self) -> int:
        return int(self.codes.shape[0])

    @property
    def in_features(self) -> int:
        return int(self.codes.shape[1])

    @property
    def nbytes(self) -> int:
        return self.codes.numel() + 4 * self.scales.numel()

    def scale_per_weight(self) -> torch.Tensor:
        """(N, K) float32: each weight's scale."""
        n, k = self.codes.shape
        s = self.scales.repeat_interleave(self.block_rows, 0)[:n]
        return s.repeat_interleave(self.block_cols, 1)[:, :k]

    def dequantize_reference(self, dtype: torch.dtype = torch.float32) -> torch.Tensor:
        """(N, K) in ``dtype``: e4m3 times the scale in float32, rounded once (PyTorch ops, any device)."""
        w = self.codes.view(torch.float8_e4m3fn).to(torch.float32)
        return (w * self.scale_per_weight().to(w.device)).to(dtype)

    def kernel_args(self) -> tuple[int, int, int, int, int]:
        """(codes, scales, block rows, block cols, scale columns): the kernels' weight arguments."""
        return (self.codes.data_ptr(), self.scales.data_ptr(), self.block_rows, self.block_cols,
                int(self.scales.shape[1]))  # fmt: skip

    def dequantize(
        self,
        dtype: torch.dtype = torch.float32,
        rows: tuple[int, int] | None = None,
        out: torch.Tensor | None = None,
    ) -> torch.Tensor:
        """Rows [n0, n1) (all by default) as (n1 - n0, K) in ``dtype``: the C kernel for float32/bf16 on
        the CPU (bit-equal to the reference), else the reference. ``out``: a buffer to write them to."""
        n0, n1 = rows or (0, self.out_features)
        lib = native_library()
        if lib is None or dtype not in (torch.float32, torch.bfloat16) or self.codes.device.type != "cpu":
            ref = (
                self.dequantize_reference(dtype)
                if rows is None
                else self._rows(n0, n1).dequantize_reference(dtype)
            )
            return ref if out is None else out.copy_(ref)
        if out is None:
            out = torch.empty(n1 - n0, self.in_features, dtype=dtype)
        lib.gb_fp8_dequant(*self.kernel_args(), self.in_features, n0, n1, out.data_ptr(),
                           int(dtype == torch.bfloat16), torch.get_num_threads())  # fmt: skip
        return out

    def _rows(self, n0: int, n1: int) -> Fp8Weights:
        """Rows [n0, n1) as weights of their own (each row with its own scales)."""
        per_row = self.per_row()
        return Fp8Weights(self.codes[n0:n1], per_row.scales[n0:n1], 1, self.block_cols, self.label)

    def per_row(self) -> Fp8Weights:
        """The same weights with each row's scales stored apart (block rows of 1)."""
        if self.block_rows == 1:
            return self
        n = self.out_features
        scales = self.scales.repeat_interleave(self.block_rows, 0)[:n].contiguous()
        return Fp8Weights(self.codes, scales, 1, self.block_cols, self.label)


def concat(parts: list[Fp8Weights]) -> Fp8Weights | None:
    """The parts stacked by rows (a fused q/k/v or gate/up), or None when their widths or column blocks
    differ. Parts whose row blocks line up keep their scale grid; parts with one scale per row or tensor
    (per-tensor scales) are stacked with a scale per row (4 bytes a row); block scales that do not line up
    (a part's height not a multiple of its blocks) are not stacked (None)."""
    first = parts[0]
    if any(p.in_features != first.in_features or p.block_cols != first.block_cols for p in parts):
        return None
    label = "+".join(dict.fromkeys(p.label for p in parts))
    aligned = all(p.block_rows == first.block_rows for p in parts) and all(
        p.out_features % p.block_rows == 0 for p in parts[:-1]
    )
    if not aligned and first.block_cols < first.in_features:
        return None  # a scale per row and column block would cost 32 bits per block_cols weights
    rows = parts if aligned else [p.per_row() for p in parts]
    return Fp8Weights(
        torch.cat([p.codes for p in rows]),
        torch.cat([p.scales for p in rows]),
        rows[0].block_rows,
        first.block_cols,
        label,
    )


def gemv(w: Fp8Weights, x: torch.Tensor, bias: torch.Tensor | None, generic: bool = False) -> torch.Tensor:
    """x (M, K) float32 or bf16, contiguous, on the CPU, times W^T (+ bias, float32) by the C kernel
    (``generic``: its plain-C path); (M, N) in x's dtype."""
    lib = native_library()
    assert lib is not None, "the C kernels are not built"
    out = torch.empty(x.shape[0], w.out_features, dtype=x.dtype)
    fn = lib.gb_fp8_gemv_generic if generic else lib.gb_fp8_gemv
    bias_ptr = None if bias is None else ctypes.c_void_p(bias.data_ptr())
    fn(x.data_ptr(), x.shape[0], w.in_features, *w.kernel_args(), bias_ptr, w.out_features, out.data_ptr(),
       int(x.dtype == torch.bfloat16), torch.get_num_threads())  # fmt: skip
    return out
