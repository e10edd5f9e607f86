"""One block linear's prompt rows, kernel against kernel: the int8 GEMM (kernels/cpu_quant_gemm.c), the decode
GEMV taking the rows 64 at a time (gb_linear_blocks) and the reference path (dequantize to bf16, then oneDNN's
GEMM: what ``BlockQuantLinear`` ran for prompt rows before), with oneDNN allowed AMX and with it denied
(ONEDNN_MAX_CPU_ISA=AVX512_CORE_BF16 plus moe_compare's shim), each setting in its own child process, in turns.
Random weights quantized by the gguf package to the file format; Phi-4-mini's shapes by default (qkv 5120 x
3072, gate/up 16384 x 3072, down 3072 x 8192). Its results set prompt_gemm.py's choice (AMX_INT8_ROWS).

    .venv/bin/python benchmarks/vnni_gemm.py [--rows 16 64 128 512] [--qtype Q4_0] [--threads 1] [--rounds 2]
        # writes results/vnni-gemm-<date>.json
"""

from __future__ import annotations

import argparse
import functools
import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))

RESULTS = Path(__file__).resolve().parent / "results"
SHAPES = {"qkv": (5120, 3072), "gate_up": (16384, 3072), "down": (3072, 8192)}  # (N, K)
SETTINGS = {"amx": {}, "no_amx": {"ONEDNN_MAX_CPU_ISA": "AVX512_CORE_BF16"}}
PATHS = ("int8_gemm", "gemv_rows", "dequant_gemm")


def gemv_rows(lib: Any, w: Any, x: Any, threads: int) -> Any:
    """The decode GEMV on all rows, 64 at a time (gb_linear_blocks)."""
    import torch

    y = torch.empty(x.shape[0], w.out_features, dtype=x.dtype)
    lib.gb_linear_blocks(x.data_ptr(), x.shape[0], w.in_features, *w.pointers(), None, w.out_features, w.padded,
                         w.kernel_bits, y.data_ptr(), 1, threads)  # fmt: skip
    return y


def dequant_gemm(w: Any, x: Any) -> Any:
    """The reference path: the weight dequantized to bf16, then oneDNN's GEMM."""
    import torch
    import torch.nn.functional as F

    return F.linear(x, w.dequantize(torch.bfloat16))


def child(qtype: str, rows: list[int], threads: int) -> dict[str, Any]:
    import numpy as np
    import torch
    from gguf import GGMLQuantizationType
    from gguf.quants import quantize

    from glassbox.quant.blocks.gguf32 import from_gguf
    from glassbox.quant.blocks.prompt_gemm import int8_gemm
    from glassbox.quant.blocks.weights import native_library

    torch.set_num_threads(threads)
    lib = native_library()
    assert lib is not None and lib.gb_gemm_blocks_native(), "the C kernels lack AVX-512 VNNI here"
    out: dict[str, Any] = {}
    for name, (n, k) in SHAPES.items():
        wf = np.random.default_rng(n + k).standard_normal((n, k)).astype(np.float32)
        w = from_gguf(qtype, quantize(wf, GGMLQuantizationType[qtype]), (n, k))

        for m in rows:
            x = torch.randn(m, k).bfloat16()
            fns = {
                "int8_gemm": functools.partial(int8_gemm, x, w, None),
                "gemv_rows": functools.partial(gemv_rows, lib, w, x, threads),
                "dequant_gemm": functools.partial(dequant_gemm, w, x),
            }
            for path, fn in fns.items():
                fn()
                times = []
                for _ in range(3):
                    t0 = time.perf_counter()
                    fn()
                    times.append(time.perf_counter() - t0)
                best = min(times)
                out[f"{name}/{m}/{path}"] = {"ms": best * 1e3, "gops": 2 * n * k * m / best / 1e9}
    out["load_avg_1m"] = os.getloadavg()[0]
    return out


def run(setting: str, args: argparse.Namespace) -> dict[str, Any]:
    from moe_compare import no_amx_preload

    env = {**os.environ, **SETTINGS[setting], "OMP_NUM_THREADS": str(args.threads)}
    if setting == "no_amx":
        env["LD_PRELOAD"] = no_amx_preload()
    work = json.dumps([args.qtype, args.rows, args.threads])
    p = subprocess.run(
        [sys.executable, __file__, "--child"], input=work, capture_output=True, text=True, env=env
    )
    if p.returncode != 0:
        raise RuntimeError(p.stderr[-800:])
    return dict(json.loads(p.stdout.strip().splitlines()[-1]))


def main() -> int:
    if sys.argv[1:] == ["--child"]:
        qtype, rows, threads = json.loads(sys.stdin.read())
        print(json.dumps(child(qtype, rows, threads)))
        return 0
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0] if __doc__ else None)
    ap.add_argument("--rows", type=int, nargs="+", default=[16, 64, 128, 512])
    ap.add_argument("--qtype", default="Q4_0", choices=["Q4_0", "Q4_1", "Q8_0", "Q5_0", "Q5_1"])
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--out", type=Path, default=None)
    args = ap.parse_args()
    from glassbox.perf.hardware import cpu_name

    runs = []
    for _ in range(args.rounds):
        runs.append({s: run(s, args) for s in SETTINGS})
        print(json.dumps({s: r["load_avg_1m"] for s, r in runs[-1].items()}), flush=True)
    summary: dict[str, Any] = {}
    for s in SETTINGS:
        for name in SHAPES:
            for m in args.rows:
                ms = {p: statistics.median(r[s][f"{name}/{m}/{p}"]["ms"] for r in runs) for p in PATHS}
                summary[f"{s}/{name}/{m}"] = {
                    **{f"{p}_ms": round(v, 2) for p, v in ms.items()},
                    "int8_speedup_vs_dequant": round(ms["dequant_gemm"] / ms["int8_gemm"], 2),
                }
    result = {
        "date": time.strftime("%Y-%m-%d %H:%M"),
        "machine": {"cpu": cpu_name(), "cores": os.cpu_count()},
        "qtype": args.qtype,
        "threads": args.threads,
        "load_avg_1m_per_round": [{s: r[s]["load_avg_1m"] for s in SETTINGS} for r in runs],
        "summary": summary,
        "runs": runs,
    }
    out = args.out or RESULTS / f"vnni-gemm-{args.qtype.lower()}-{time.strftime('%Y-%m-%d')}.json"
    out.write_text(json.dumps(result, indent=2) + "\n")
    for key, row in summary.items():
        print(key, row)
    print(f"wrote {out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
