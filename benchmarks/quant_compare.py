"""Quantized weights on this CPU, batch-1 decode: glassbox's block weights against llama.cpp on the same files.

The Qwen3-0.6B-shaped random bf16 checkpoint of benchmarks/bench_models.py, and GGUF files exported from it
(benchmarks/gguf_export.py: bf16, and Q8_0 / Q4_0 quantized by the gguf package, llama.cpp's reference
quantization). Engines:
  glassbox bf16 (the safetensors), int8 / int4 / int4-asym / fp8 (--quantization, at load), Q8_0 / Q4_0 (the
  GGUF files as stored), CT W4A16 / CT W8A8 (compressed-tensors checkpoints written by the package:
  benchmarks/ct_export.py)
  llama.cpp bf16 / Q8_0 / Q4_0 (the same GGUF files; llama-cpp-python, benchmarks/llamacpp_peer.py)
Every engine decodes in turns for ``--rounds`` rounds (each a fresh 128-token prompt, 64 greedy steps), since this
machine's speed drifts by half within minutes; medians and the per-round ratios are reported, with the read
bandwidth probed at the start and the end of the run. Writes benchmarks/results/quant-compare-<date>.json.

    .venv/bin/python benchmarks/quant_compare.py [--rounds 5] [--threads 2] [--engines "glassbox bf16,..."]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
from bench_models import qwen3_0_6b_random  # noqa: E402
from ct_export import export_ct  # noqa: E402
from gguf_export import export_gguf  # noqa: E402
from llamacpp_peer import llamacpp_version, measure_llamacpp  # noqa: E402

from glassbox import LLM, SamplingParams  # noqa: E402
from glassbox.perf.hardware import cpu_name  # noqa: E402
from glassbox.perf.probe import measure_read_bandwidth  # noqa: E402

RESULTS = Path(__file__).resolve().parent / "results"
Decoder = Callable[[list[int]], float]


def glassbox_decoder(model: Path, decode_tokens: int, **engine: Any) -> tuple[Decoder, dict[str, Any]]:
    llm = LLM(str(model), enable_prefix_caching=False, num_kv_blocks=64, **engine)
    params = SamplingParams(temperature=0, max_tokens=decode_tokens + 1, ignore_eos=True)
    llm.generate([list(range(5, 37))], SamplingParams(temperature=0, max_tokens=4, ignore_eos=True))

    def decode(prompt: list[int]) -> float:
        m = llm.generate([prompt], params)[0].metrics
        assert m is not None
        return m.decode_tok_s

    ex = llm.engine.executor
    return decode, {
        "weights": ex.block_formats or [str(ex.dtype)],
        "weight_mb": round(ex.weight_bytes / 1e6, 1),
    }


def llamacpp_decoder(path: Path, decode_tokens: int, threads: int) -> Decoder:
    def decode(prompt: list[int]) -> float:
        return float(measure_llamacpp(path, prompt, decode_tokens, threads)["decode_tok_s"])

    return decode


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0] if __doc__ else None)
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--decode-tokens", type=int, default=64)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--out", type=Path, default=None)
    ap.add_argument("--engines", default="", help="only these engines (comma-separated names, e.g. "
                    "'glassbox bf16,glassbox fp8,llama.cpp Q8_0'); default: all")  # fmt: skip
    args = ap.parse_args()
    only = {e.strip() for e in args.engines.split(",") if e.strip()}

    def chosen(name: str) -> bool:
        return not only or name in only

    torch.set_num_threads(args.threads)
    model = qwen3_0_6b_random()
    files = {}
    for kind in ("bf16", "q8_0", "q4_0"):
        files[kind] = model / f"model-{kind}.gguf"
        if not files[kind].is_file():
            export_gguf(model, files[kind], kind)
    for scheme in ("w4a16", "w8a8"):
        files[scheme] = model.parent / f"{model.name}-ct-{scheme}"
        if chosen(f"glassbox CT {scheme.upper()}") and not (files[scheme] / "config.json").is_file():
            export_ct(model, files[scheme], scheme)
    bandwidth_start = measure_read_bandwidth("cpu")
    decoders: dict[str, Decoder] = {}
    info: dict[str, Any] = {}
    for name, path, engine in (
        ("glassbox bf16", model, {}),
        ("glassbox int8", model, {"quantization": "int8"}),
        ("glassbox int4", model, {"quantization": "int4"}),
        ("glassbox int4-asym", model, {"quantization": "int4-asym"}),
        ("glassbox fp8", model, {"quantization": "fp8"}),
        ("glassbox Q8_0", files["q8_0"], {}),
        ("glassbox Q4_0", files["q4_0"], {}),
        ("glassbox CT W4A16", files["w4a16"], {}),
        ("glassbox CT W8A8", files["w8a8"], {}),
    ):
        if chosen(name):
            decoders[name], info[name] = glassbox_decoder(path, args.decode_tokens, **engine)
    for kind in ("bf16", "q8_0", "q4_0"):
        name = f"llama.cpp {kind.upper() if kind != 'bf16' else kind}"
        if chosen(name):
            decoders[name] = llamacpp_decoder(files[kind], args.decode_tokens, args.threads)
    vocab = 150000
    runs: dict[str, list[float]] = {name: [] for name in decoders}
    for r in range(args.rounds):
        prompt = torch.randint(2, vocab, (128,), generator=torch.Generator().manual_seed(500 + r)).tolist()
        for name, decode in decoders.items():
            runs[name].append(decode(prompt))
        print(f"round {r}: " + ", ".join(f"{n} {v[-1]:.1f}" for n, v in runs.items()), flush=True)
    bandwidth_end = measure_read_bandwidth("cpu")

    def ratios(a: str, b: str) -> dict[str, Any] | None:
        if a not in runs or b not in runs:
            return None
        per = [x / y for x, y in zip(runs[a], runs[b], strict=True)]
        return {"per_round": [round(x, 3) for x in per], "median": statistics.median(per)}

    result = {
        "date": time.strftime("%Y-%m-%d %H:%M"),
        "machine": {"cpu": cpu_name(), "cores": os.cpu_count(), "threads": args.threads},
        "read_bandwidth_gbs": {"start": bandwidth_start, "end": bandwidth_end},
        "model": "Qwen3-0.6B shape, random bf16 weights; GGUF Q8_0/Q4_0 by the gguf package",
        "peer": llamacpp_version(),
        "decode_tokens": args.decode_tokens,
        "engines": info,
        "decode_b1_tok_s": {name: statistics.median(v) for name, v in runs.items()},
        "runs": runs,
        "ratios": {
            k: v
            for k, v in {
                "glassbox Q4_0 / llama.cpp Q4_0": ratios("glassbox Q4_0", "llama.cpp Q4_0"),
                "glassbox Q8_0 / llama.cpp Q8_0": ratios("glassbox Q8_0", "llama.cpp Q8_0"),
                "glassbox int4 / glassbox bf16": ratios("glassbox int4", "glassbox bf16"),
                "glassbox int4-asym / glassbox bf16": ratios("glassbox int4-asym", "glassbox bf16"),
                "glassbox int8 / glassbox bf16": ratios("glassbox int8", "glassbox bf16"),
                "glassbox fp8 / glassbox bf16": ratios("glassbox fp8", "glassbox bf16"),
                "glassbox fp8 / llama.cpp Q8_0": ratios("glassbox fp8", "llama.cpp Q8_0"),
                "glassbox bf16 / llama.cpp bf16": ratios("glassbox bf16", "llama.cpp bf16"),
            }.items()
            if v is not None
        },
    }
    out = args.out or RESULTS / f"quant-compare-{time.strftime('%Y-%m-%d')}.json"
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(result, indent=2) + "\n")
    print(json.dumps({k: result[k] for k in ("decode_b1_tok_s", "ratios", "read_bandwidth_gbs")}, indent=2))
    print(f"wrote {out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
