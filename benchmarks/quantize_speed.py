"""Load-time ``--quantization int4|int8|int4-asym`` on this CPU: the C quantizer (kernels/cpu_quantize.c, what
``layers/block_quantize.quantize`` runs) against the PyTorch reference (``quantize_reference``, what it ran
before), on bf16 matrices of Qwen3-30B-A3B's routed experts (gate_up 1536 x 2048, down 2048 x 768: the
matrices a MoE quantizes by the hundred) and of a dense 4096 x 4096 layer. The two paths take turns for
``--rounds`` rounds (this machine's speed drifts); per path the median over rounds of the weights quantized
per second (packing into the kernels' layout included), at 1 and 2 threads. Both give the same bytes
(tests/quant/test_quantization.py).

    PYTHONPATH=src .venv/bin/python benchmarks/quantize_speed.py [--rounds 5] [--out FILE]
"""

from __future__ import annotations

import argparse
import json
import statistics
import time
from pathlib import Path
from typing import Any

import torch

from glassbox.perf.hardware import cpu_name
from glassbox.quant.blocks.quantize import quantize, quantize_reference

SHAPES = {"expert gate_up": (1536, 2048), "expert down": (2048, 768), "dense": (4096, 4096)}
MODES = {"int4": (4, False), "int8": (8, False), "int4-asym": (4, True)}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--out", type=Path, default=None)
    args = ap.parse_args()
    g = torch.Generator().manual_seed(0)
    mats = {name: (torch.randn(*shape, generator=g) * 0.02).bfloat16() for name, shape in SHAPES.items()}
    res: dict[str, Any] = {"machine": cpu_name(), "torch": torch.__version__, "rounds": args.rounds}
    for threads in (1, 2):
        torch.set_num_threads(threads)
        for mode, (bits, asym) in MODES.items():
            for name, w in mats.items():
                rates: dict[str, list[float]] = {"c": [], "torch": []}
                quantize(w[:64], bits, asym)  # the kernels built and loaded
                for _ in range(args.rounds):
                    for path, fn in (("c", quantize), ("torch", quantize_reference)):
                        t = time.perf_counter()
                        fn(w, bits, asym)
                        rates[path].append(w.numel() / (time.perf_counter() - t) / 1e6)
                c, ref = statistics.median(rates["c"]), statistics.median(rates["torch"])
                res[f"t{threads}_{mode}_{name}"] = {
                    "c_Mweights_s": c,
                    "torch_Mweights_s": ref,
                    "ratio": c / ref,
                }
                print(f"threads {threads} {mode:9s} {name:15s} C {c:6.0f} M/s  torch {ref:5.0f} M/s  x{c / ref:.1f}",
                      flush=True)  # fmt: skip
    if args.out:
        args.out.write_text(json.dumps(res, indent=1) + "\n")


if __name__ == "__main__":
    main()
