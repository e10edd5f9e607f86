"""A Q4_K_M GGUF on this CPU, batch-1 decode: glassbox (K-quants kept packed) against llama.cpp on the same file,
with the Q4_0 file of the same weights alongside.

The model is benchmarks/bench_models.py's Qwen3-0.6B-shaped random checkpoint (hidden 1024: every row is
whole 256-value super-blocks, so llama.cpp's Q4_K_M uses Q4_K and Q6_K throughout, with no fallback type).
Its bf16 GGUF (benchmarks/gguf_export.py) is quantized to Q4_K_M by llama.cpp's own quantizer
(llama-cpp-python's llama_model_quantize), to Q4_0 by the gguf package (as quant_compare.py). Engines decode
in turns for ``--rounds`` rounds (each a fresh 128-token prompt, ``--decode-tokens`` greedy steps), since
this machine's speed drifts; medians and per-round ratios are reported. Writes
benchmarks/results/kquant-e2e-<date>.json.

    .venv/bin/python benchmarks/kquant_e2e.py [--rounds 5] [--threads 1] [--bf16-gguf FILE] [--work DIR]
"""

from __future__ import annotations

import argparse
import ctypes
import json
import os
import statistics
import sys
import time
from collections import Counter
from pathlib import Path
from typing import Any

import torch
from gguf import GGUFReader

sys.path.insert(0, str(Path(__file__).resolve().parent))
from gguf_export import export_gguf  # noqa: E402
from llamacpp_peer import llamacpp_version  # noqa: E402
from quant_compare import Decoder, glassbox_decoder, llamacpp_decoder  # noqa: E402

from glassbox.perf.hardware import cpu_name  # noqa: E402

RESULTS = Path(__file__).resolve().parent / "results"


def quantize_q4_k_m(src: Path, dst: Path, threads: int) -> Path:
    """llama.cpp's Q4_K_M of the GGUF ``src``, written to ``dst`` (kept when already there)."""
    if dst.is_file():
        return dst
    import llama_cpp

    params = llama_cpp.llama_model_quantize_default_params()
    params.nthread = threads
    params.ftype = llama_cpp.LLAMA_FTYPE_MOSTLY_Q4_K_M
    tmp = dst.with_suffix(".tmp")
    if llama_cpp.llama_model_quantize(str(src).encode(), str(tmp).encode(), ctypes.byref(params)) != 0:
        raise RuntimeError(f"llama_model_quantize failed on {src}")
    os.replace(tmp, dst)
    return dst


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0] if __doc__ else None)
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--decode-tokens", type=int, default=64)
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--bf16-gguf", type=Path, default=None, help="default: bench_models' Qwen3-0.6B shape")
    ap.add_argument("--work", type=Path, default=None, help="where the Q4_K_M / Q4_0 files go")
    ap.add_argument("--out", type=Path, default=None)
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    src = args.bf16_gguf
    if src is None:
        from bench_models import qwen3_0_6b_random

        model = qwen3_0_6b_random()
        src = model / "model-bf16.gguf"
        if not src.is_file():
            export_gguf(model, src, "bf16")
    work = args.work or src.parent
    files = {"Q4_K_M": quantize_q4_k_m(src, work / "model-q4_k_m.gguf", args.threads)}
    files["Q4_0"] = work / "model-q4_0.gguf"
    if not files["Q4_0"].is_file():
        raise SystemExit(f"{files['Q4_0']} is missing: benchmarks/quant_compare.py writes it")
    types = {k: dict(Counter(t.tensor_type.name for t in GGUFReader(p).tensors)) for k, p in files.items()}
    decoders: dict[str, Decoder] = {}
    info: dict[str, Any] = {}
    for kind, path in files.items():
        decoders[f"glassbox {kind}"], info[f"glassbox {kind}"] = glassbox_decoder(path, args.decode_tokens)
    for kind, path in files.items():
        decoders[f"llama.cpp {kind}"] = llamacpp_decoder(path, args.decode_tokens, args.threads)
    runs: dict[str, list[float]] = {name: [] for name in decoders}
    for r in range(args.rounds):
        prompt = torch.randint(2, 150000, (128,), generator=torch.Generator().manual_seed(500 + r)).tolist()
        for name, decode in decoders.items():
            runs[name].append(decode(prompt))
        print(f"round {r}: " + ", ".join(f"{n} {v[-1]:.1f}" for n, v in runs.items()), flush=True)

    def ratio(a: str, b: str) -> dict[str, Any]:
        per = [x / y for x, y in zip(runs[a], runs[b], strict=True)]
        return {"per_round": [round(x, 3) for x in per], "median": round(statistics.median(per), 3)}

    result = {
        "date": time.strftime("%Y-%m-%d %H:%M"),
        "machine": {"cpu": cpu_name(), "cores": os.cpu_count(), "threads": args.threads},
        "model": "Qwen3-0.6B shape, random bf16 weights; Q4_K_M by llama.cpp's quantizer, Q4_0 by the gguf package",
        "tensor_types": types,
        "peer": llamacpp_version(),
        "decode_tokens": args.decode_tokens,
        "engines": info,
        "decode_b1_tok_s": {name: round(statistics.median(v), 2) for name, v in runs.items()},
        "runs": runs,
        "ratios": {
            "glassbox Q4_K_M / llama.cpp Q4_K_M": ratio("glassbox Q4_K_M", "llama.cpp Q4_K_M"),
            "glassbox Q4_0 / llama.cpp Q4_0": ratio("glassbox Q4_0", "llama.cpp Q4_0"),
            "glassbox Q4_K_M / glassbox Q4_0": ratio("glassbox Q4_K_M", "glassbox Q4_0"),
        },
    }
    out = args.out or RESULTS / f"kquant-e2e-{time.strftime('%Y-%m-%d')}.json"
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(result, indent=2) + "\n")
    print(json.dumps({k: result[k] for k in ("engines", "decode_b1_tok_s", "ratios")}, indent=2))
    print(f"wrote {out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
