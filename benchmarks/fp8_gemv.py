"""FP8 weights on the CPU: the decode GEMV of kernels/cpu_fp8.c against the int8 block kernel (Q8_0) and
bf16 GEMMs, on one layer, in turns.

One N x K layer (default 2048 x 2048) from one random float32 matrix, stored four ways: FP8 E4M3 with
128 x 128 block scales (HF "fp8") and with per-channel scales (compressed-tensors), Q8_0 blocks
(quant/blocks/weights.py), bf16. Each round times every candidate once (``--reps`` calls after a warm-up) at
each row count, so that this machine's drift hits all of them alike; the report gives, over rounds, the
median of each round's median call ("ms") and of each round's fastest call ("ms_min": on a machine shared
with other jobs, the cost of a call that was not preempted). Candidates:

- fp8-gemv-block / fp8-gemv-channel: ``Fp8Linear._gemv`` (bf16 in and out);
- fp8-tiled-block: ``Fp8Linear._tiled`` (tiles of rows dequantized to bf16, then a GEMM), the rule past
  layers/fp8_linear.KERNEL_ROWS rows;
- q8_0-gemv: ``gb_gemv_blocks`` on activations already in int8 blocks (the weight-streaming part alone);
- q8_0-linear: ``BlockQuantLinear`` (the activations quantized, then the GEMV: what a decode step runs);
- bf16-linear: ``F.linear`` on the bf16 weight; bf16-packed: oneDNN's packed layout (quant/dense/onednn.py), what
  a bf16 model runs on the CPU.

    GLASSBOX_NUM_THREADS=1 .venv/bin/python benchmarks/fp8_gemv.py [--n 2048 --k 2048 --rows 1,4,8,16]
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import time
from collections.abc import Callable
from pathlib import Path

import torch
import torch.nn.functional as F
from torch import nn

from glassbox.kernels.native import library
from glassbox.quant.blocks.linear import BlockQuantLinear
from glassbox.quant.blocks.quantize import quantize
from glassbox.quant.blocks.weights import BLOCK
from glassbox.quant.dense.onednn import PackedLinear, packing_available
from glassbox.quant.fp8.linear import Fp8Linear
from glassbox.quant.fp8.weights import Fp8Weights

RESULTS = Path(__file__).resolve().parent / "results"


def fp8(w: torch.Tensor, bn: int, bk: int, label: str) -> Fp8Weights:
    """Round-to-nearest E4M3 with the scale max|w| / 448 per bn x bk block."""
    n, k = w.shape
    rows, cols = -(-n // bn), -(-k // bk)
    padded = F.pad(w, (0, cols * bk - k, 0, rows * bn - n)).view(rows, bn, cols, bk)
    s = padded.abs().amax(dim=(1, 3)) / 448.0
    codes = (padded / s[:, None, :, None]).to(torch.float8_e4m3fn).view(torch.uint8)
    return Fp8Weights(codes.reshape(rows * bn, cols * bk)[:n, :k].contiguous(), s.float(), bn, bk, label)


def time_ms(fn: Callable[[], object], reps: int) -> tuple[float, float]:
    """(median, fastest) of ``reps`` calls after a warm-up, in ms."""
    fn()
    times = []
    for _ in range(reps):
        t0 = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t0)
    return statistics.median(times) * 1e3, min(times) * 1e3


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0] if __doc__ else None)
    ap.add_argument("--n", type=int, default=2048)
    ap.add_argument("--k", type=int, default=2048)
    ap.add_argument("--rows", default="1,4,8,16")
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--reps", type=int, default=50)
    ap.add_argument("--out", type=Path, default=None)
    args = ap.parse_args()
    if "GLASSBOX_NUM_THREADS" in os.environ:
        torch.set_num_threads(int(os.environ["GLASSBOX_NUM_THREADS"]))
    lib = library()
    assert lib is not None, "no C compiler: the kernels are not built"
    w = torch.randn(args.n, args.k, generator=torch.Generator().manual_seed(0)) * 0.02
    block, channel = Fp8Linear(fp8(w, 128, 128, "block")), Fp8Linear(fp8(w, 1, args.k, "channel"))
    q8 = BlockQuantLinear(quantize(w, 8))
    dense = nn.Linear(args.k, args.n, bias=False).to(torch.bfloat16)
    dense.weight.data.copy_(w)
    packed = PackedLinear(dense) if packing_available(torch.bfloat16) else None
    rows = [int(r) for r in args.rows.split(",")]
    cases: dict[str, Callable[[torch.Tensor], object]] = {
        "fp8-gemv-block": block._gemv,
        "fp8-gemv-channel": channel._gemv,
        "fp8-tiled-block": block._tiled,
        "q8_0-linear": q8,
        "bf16-linear": lambda x: F.linear(x, dense.weight),
    }
    if packed is not None:
        cases["bf16-packed"] = packed
    names = [*cases, "q8_0-gemv"]
    runs: dict[str, dict[int, list[tuple[float, float]]]] = {c: {m: [] for m in rows} for c in names}
    with torch.inference_mode():
        for _ in range(args.rounds):
            for m in rows:
                x = torch.randn(m, args.k, generator=torch.Generator().manual_seed(m)).bfloat16()
                for name, fn in cases.items():
                    runs[name][m].append(time_ms(lambda fn=fn, x=x: fn(x), args.reps))  # type: ignore[misc]
                runs["q8_0-gemv"][m].append(time_ms(q8_gemv(q8, x), args.reps))
    result = {
        "what": f"one {args.n} x {args.k} layer, bf16 activations, ms per call (median of rounds)",
        "threads": torch.get_num_threads(),
        "cpu": platform.processor() or platform.machine(),
        "bytes": {
            "fp8-block": block.nbytes,
            "fp8-channel": channel.nbytes,
            "q8_0": q8.nbytes,
            "bf16": 2 * args.n * args.k,
        },  # fmt: skip
        "ms": {
            n: {m: round(statistics.median(t[0] for t in v), 4) for m, v in per.items()}
            for n, per in runs.items()
        },
        "ms_min": {
            n: {m: round(statistics.median(t[1] for t in v), 4) for m, v in per.items()}
            for n, per in runs.items()
        },
        "rounds": args.rounds,
        "loadavg_1min": os.getloadavg()[0],
        "date": time.strftime("%Y-%m-%d %H:%M"),
    }
    print(json.dumps(result, indent=1))
    if args.out is not None:
        args.out.write_text(json.dumps(result, indent=1) + "\n")
    return 0


def q8_gemv(q8: BlockQuantLinear, x: torch.Tensor) -> Callable[[], object]:
    """gb_gemv_blocks alone: a call on activations quantized to int8 blocks beforehand (not timed)."""
    lib = library()
    assert lib is not None
    w = q8.w
    m, kp = x.shape[0], w.padded
    qx = torch.empty(m, kp, dtype=torch.int8)
    dx = torch.empty(m, kp // BLOCK)
    cx = torch.empty(m, kp // BLOCK)
    lib.gb_quantize_rows_q8(x.data_ptr(), m, w.in_features, kp, qx.data_ptr(), dx.data_ptr(), cx.data_ptr(), 1,
                            torch.get_num_threads())  # fmt: skip
    out = torch.empty(m, w.out_features, dtype=x.dtype)

    def call() -> None:
        lib.gb_gemv_blocks(*w.pointers(), None, w.out_features, kp, w.bits, qx.data_ptr(), dx.data_ptr(),
                           cx.data_ptr(), m, out.data_ptr(), w.out_features, 1, torch.get_num_threads())  # fmt: skip

    return call


if __name__ == "__main__":
    raise SystemExit(main())
