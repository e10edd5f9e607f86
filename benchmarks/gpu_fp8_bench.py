"""FP8 linears on one CUDA GPU: which path to take at how many rows (``--quantization fp8``, FP8 checkpoints).

On Llama-3.1-8B's linear shapes (N, K), per-channel E4M3 weights (quant/fp8/quantize.py), at 1 to 8,192
rows of bf16 activations, each graph-timed (gpu_bench.graph_ms, weights rotated over 4x the L2 where one
call reads less than that):
  bf16        cuBLAS ``F.linear`` on the 16-bit weight (the baseline)
  fp8_triton  the weight-only Triton kernels (kernels/triton_fp8_linear.py: GEMV / split-K / dequantizing
              dots), what the engine runs up to 16 rows
  w8a8        ``scaled_mm_rows``: the rows quantized to E4M3 per token, then ``torch._scaled_mm`` (what the
              engine runs from 17 rows on devices of compute capability 8.9+)
  w8a8_mm     the ``_scaled_mm`` alone (activations quantized beforehand): what a fused quantization would
              leave
with TFLOP/s, weight GB/s, and the relative error against the float32 product of the dequantized weights.
Writes <out>/gpu-fp8-<date>.json.

    PYTHONPATH=src:benchmarks python3 benchmarks/gpu_fp8_bench.py [--out DIR] [--rows 1,16,256,2048,8192]
"""

from __future__ import annotations

import argparse
import datetime
import itertools
import json
from pathlib import Path
from typing import Any

import torch
import torch.nn.functional as F
from gpu_bench import graph_ms, l2_copies

from glassbox.kernels.triton_fp8_linear import fp8_matmul
from glassbox.quant.fp8.quantize import quantize_fp8  # noqa: E402
from glassbox.quant.fp8.w8a8 import quantize_rows_fp8, row_scales, scaled_mm_rows

SHAPES = ((6144, 4096), (4096, 4096), (28672, 4096), (4096, 14336))  # q/k/v, o, gate/up, down


def _time(fn: Any, weights: list[Any], rows: int) -> float:
    """Milliseconds of one call, over the weight copies in turn."""
    turn = itertools.cycle(weights)
    return graph_ms(lambda: fn(next(turn)), max(4, len(weights) * 2) if rows <= 256 else 4)


def row_case(x: torch.Tensor, w: Any, copies: list[Any], dense_copies: list[Any], ref: Any) -> dict[str, Any]:
    """The four variants at x's rows: microseconds, TFLOP/s, weight GB/s, error against ``ref``."""
    m, k = x.shape
    n = w.out_features
    q, sx = quantize_rows_fp8(x)

    def mm(c: Any) -> torch.Tensor:
        return torch._scaled_mm(
            q, c[0].view(torch.float8_e4m3fn).t(), scale_a=sx, scale_b=c[2], out_dtype=torch.bfloat16
        )

    variants = {
        "bf16": (lambda d: F.linear(x, d), dense_copies, dense_copies[0].nbytes),
        "fp8_triton": (lambda c: fp8_matmul(x, c[0], c[1], 1, k, None, m <= 16), copies, w.nbytes),
        "w8a8": (lambda c: scaled_mm_rows(x, c[0], c[2], None), copies, w.nbytes),
        "w8a8_mm": (mm, copies, w.nbytes),
    }
    res: dict[str, Any] = {}
    for name, (fn, ws, nbytes) in variants.items():
        try:
            out = fn(ws[0])
            ms = _time(fn, ws, m)
            row: dict[str, Any] = {"us": 1e3 * ms, "TFLOPs": 2 * m * n * k / ms / 1e9}
            row["weight_GBps"] = nbytes / ms / 1e6
            if ref is not None:
                row["rel_err"] = ((out.float() - ref).norm() / ref.norm()).item()
            res[f"{name}_m{m}"] = row
        except Exception as e:  # not on this device or build: say so
            res[f"{name}_m{m}"] = {"error": f"{type(e).__name__}: {str(e)[:300]}"}
    timed = [v for v in variants if v != "w8a8_mm" and "us" in res[f"{v}_m{m}"]]
    res[f"fastest_m{m}"] = min(timed, key=lambda v: res[f"{v}_m{m}"]["us"], default=None)
    return res


def shape_case(n: int, k: int, rows: list[int]) -> dict[str, Any]:
    dense = torch.randn(n, k, device="cuda", dtype=torch.bfloat16) * 0.02
    w = quantize_fp8(dense)
    codes, scales, rs = w.codes, w.scales, row_scales(w)
    assert rs is not None
    ref_w = w.dequantize_reference(torch.float32)
    copies = l2_copies(
        (codes, scales, rs), codes.numel(), lambda: (codes.clone(), scales.clone(), rs.clone())
    )
    dense_copies = l2_copies(dense, dense.nbytes, dense.clone)
    res: dict[str, Any] = {}
    for m in rows:
        x = torch.randn(m, k, device="cuda", dtype=torch.bfloat16)
        res |= row_case(x, w, copies, dense_copies, F.linear(x.float(), ref_w) if m <= 2048 else None)
    del copies, dense_copies
    torch.cuda.empty_cache()
    return res


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", default="benchmarks/results")
    ap.add_argument("--rows", default="1,16,17,64,256,2048,8192")
    args = ap.parse_args()
    rows = [int(r) for r in args.rows.split(",")]
    out: dict[str, Any] = {
        "device": torch.cuda.get_device_name(0),
        "capability": list(torch.cuda.get_device_capability()),
        "torch": torch.__version__,
        "date": datetime.date.today().isoformat(),
        "shapes": {},
    }
    path = Path(args.out) / f"gpu-fp8-{out['date']}.json"
    path.parent.mkdir(parents=True, exist_ok=True)
    for n, k in SHAPES:  # written after each shape: a run cut short keeps what it measured
        out["shapes"][f"{n}x{k}"] = shape_case(n, k, rows)
        path.write_text(json.dumps(out, indent=2) + "\n")
        print(f"== {n}x{k}", json.dumps({kk: v for kk, v in out["shapes"][f"{n}x{k}"].items()
                                         if kk.startswith("fastest")}))  # fmt: skip
    print(f"wrote {path}")


if __name__ == "__main__":
    main()
