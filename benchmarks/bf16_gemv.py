"""How fast a batch-1 bf16 GEMV streams its weight on this CPU: glassbox's tiles (quant/dense/bf16_tiles.py, what
glassbox runs where AVX-512 BF16 is), oneDNN's packed layout (its reference path), ``F.linear``, and a plain
C loop (one row at a time, AVX-512 ``vdpbf16ps``: the way llama.cpp's bf16 dot products walk a matrix),
against the read-bandwidth probe (perf/hardware.py).

The shapes are the MoE benchmark's (benchmarks/moe_compare.py): Qwen3-30B-A3B's expert gate_up (1536 x
2048) and down (2048 x 768), gpt-oss-20b's (5760 x 2880, 2880 x 2880), and an eighth of Qwen3's LM head.
Enough distinct matrices that they do not fit in the caches, called in random order, as decode does; each
figure is the weight bytes over the wall time. The C loop is a measurement probe compiled here with
``cc -O3 -march=native`` (it needs AVX-512 BF16), not a glassbox kernel; it runs on one thread.

    PYTHONPATH=src .venv/bin/python benchmarks/bf16_gemv.py [--threads 1] [--rounds 3]
"""

from __future__ import annotations

import argparse
import ctypes
import json
import random
import subprocess
import tempfile
import time
from collections.abc import Callable
from functools import partial
from pathlib import Path

import torch

from glassbox.perf.probe import measure_read_bandwidth
from glassbox.quant.dense.bf16_tiles import TiledBf16Linear, tiled_available
from glassbox.quant.dense.onednn import packed_matrix

C_SOURCE = r"""
#include <immintrin.h>
#include <stdint.h>
/* y (N, fp32) = W (N x K, bf16, row-major) x (K, bf16); K a multiple of 32. One row at a time: a single
   sequential stream through W, four accumulators over 128 values. */
void gemv_rows_bf16(const uint16_t *W, const uint16_t *x, float *y, long N, long K) {
    for (long n = 0; n < N; n++) {
        const uint16_t *w = W + n * K;
        __m512 a0 = _mm512_setzero_ps(), a1 = _mm512_setzero_ps(), a2 = _mm512_setzero_ps(), a3 = _mm512_setzero_ps();
        long k = 0;
        for (; k + 128 <= K; k += 128) {
            a0 = _mm512_dpbf16_ps(a0, (__m512bh)_mm512_loadu_si512(w + k), (__m512bh)_mm512_loadu_si512(x + k));
            a1 = _mm512_dpbf16_ps(a1, (__m512bh)_mm512_loadu_si512(w + k + 32), (__m512bh)_mm512_loadu_si512(x + k + 32));
            a2 = _mm512_dpbf16_ps(a2, (__m512bh)_mm512_loadu_si512(w + k + 64), (__m512bh)_mm512_loadu_si512(x + k + 64));
            a3 = _mm512_dpbf16_ps(a3, (__m512bh)_mm512_loadu_si512(w + k + 96), (__m512bh)_mm512_loadu_si512(x + k + 96));
        }
        for (; k < K; k += 32)
            a0 = _mm512_dpbf16_ps(a0, (__m512bh)_mm512_loadu_si512(w + k), (__m512bh)_mm512_loadu_si512(x + k));
        y[n] = _mm512_reduce_add_ps(_mm512_add_ps(_mm512_add_ps(a0, a1), _mm512_add_ps(a2, a3)));
    }
}
"""
SHAPES = {
    "qwen3 expert gate_up": (1536, 2048),
    "qwen3 expert down": (2048, 768),
    "gpt-oss expert gate_up": (5760, 2880),
    "gpt-oss expert down": (2880, 2880),
    "qwen3 lm_head / 8": (151936 // 8, 2048),
}


def _c_loop(tmp: Path) -> ctypes.CDLL | None:
    src, lib = tmp / "gemv.c", tmp / "gemv.so"
    src.write_text(C_SOURCE)
    p = subprocess.run(["cc", "-O3", "-march=native", "-shared", "-fPIC", "-o", str(lib), str(src)],
                       capture_output=True, text=True)  # fmt: skip
    return ctypes.CDLL(str(lib)) if p.returncode == 0 else None


def _rate(fns: list[Callable[[], object]], nbytes: int, budget_s: float = 1.0) -> float:
    """GB/s over calls in random order until the budget is spent (at least 2 calls per matrix)."""
    calls, t0 = 0, time.perf_counter()
    while calls < 2 * len(fns) or time.perf_counter() - t0 < budget_s:
        random.choice(fns)()
        calls += 1
    return nbytes * calls / (time.perf_counter() - t0) / 1e9


def measure(n: int, k: int, lib: ctypes.CDLL | None, c_loop: bool) -> dict[str, float]:
    """GB/s of each GEMV way over enough distinct (n, k) matrices to hold >= 256 MB."""
    ws = [torch.randn(n, k).mul_(0.02).to(torch.bfloat16) for _ in range(max(4, (256 << 20) // (n * k * 2)))]
    x = torch.randn(1, k).to(torch.bfloat16)
    y = torch.empty(n)
    packs = [packed_matrix(w) for w in ws]
    rates = {
        "oneDNN packed": _rate([partial(p, x) for p in packs], n * k * 2),
        **(
            {"glassbox tiles": _rate([partial(t, x) for t in (TiledBf16Linear(w) for w in ws)], n * k * 2)}
            if tiled_available()
            else {}
        ),
        "F.linear": _rate([partial(torch.nn.functional.linear, x, w) for w in ws], n * k * 2),
    }
    if lib is not None and c_loop:
        ptr = ctypes.c_void_p

        def rows(w: torch.Tensor) -> None:
            lib.gemv_rows_bf16(ptr(w.data_ptr()), ptr(x.data_ptr()), ptr(y.data_ptr()), n, k)

        rows(ws[0])
        ref = torch.nn.functional.linear(x.float(), ws[0].float())[0]
        assert torch.allclose(y, ref, rtol=1e-3, atol=1e-3), float((y - ref).abs().max())
        rates["C rows, vdpbf16ps"] = _rate([partial(rows, w) for w in ws], n * k * 2)
    return {key: round(v, 2) for key, v in rates.items()}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0] if __doc__ else None)
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--out", type=Path, default=None)
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    res: dict[str, object] = {"threads": args.threads, "rounds": []}
    with tempfile.TemporaryDirectory() as tmp:
        lib = _c_loop(Path(tmp))
        for _ in range(args.rounds):
            row: dict[str, object] = {"read_probe_gbs": round(measure_read_bandwidth("cpu"), 2)}
            for name, (n, k) in SHAPES.items():
                row[name] = measure(n, k, lib, args.threads == 1)
            print(json.dumps(row), flush=True)
            res["rounds"].append(row)  # type: ignore[attr-defined]
    if args.out:
        args.out.write_text(json.dumps(res, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
