"""Prefill of a Q4_0 (or any block-format) GGUF file with AMX denied to both engines: glassbox's int8 prompt
GEMM (quant/blocks/prompt_gemm.py), glassbox's reference path (the weight dequantized, oneDNN's AVX-512 bf16
GEMM) and llama.cpp, in turns, same threads, several rounds, the load average beside each figure.

Each engine runs in a child process with AMX denied: moe_compare's shim (arch_prctl refuses AMX's state, so
neither oneDNN nor ggml can use it) and, for glassbox, the Makefile's test-no-amx settings
(ONEDNN_MAX_CPU_ISA=AVX512_CORE_BF16, GLASSBOX_BF16_PROMPTS=tiles). llama.cpp (llama-cpp-python) runs with its
extra (repacked) buffer types off unless ``--llamacpp-repack``: llama_model_params.use_extra_bufts. A round:
for each prompt size P, a fresh prompt of P random ids prefilled at batch 1 (glassbox: the request's
prefill_tok_s with prefix caching off; llama.cpp: benchmarks/llamacpp_peer.py's measure_llamacpp_prefill).

    .venv/bin/python benchmarks/vnni_prefill.py --model FILE.gguf [--rounds 3] [--prompt-tokens 128 512]
        [--threads 1]      # writes results/vnni-prefill-<date>.json
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))

RESULTS = Path(__file__).resolve().parent / "results"
ENGINES = ("glassbox_int8", "glassbox_dequant", "llama_cpp")
NO_AMX_ENV = {"ONEDNN_MAX_CPU_ISA": "AVX512_CORE_BF16", "GLASSBOX_BF16_PROMPTS": "tiles"}


def glassbox_worker(path: str, sizes: list[int], seed: int, max_model_len: int) -> dict[str, Any]:
    from glassbox import LLM, SamplingParams
    from glassbox.quant.blocks.prompt_gemm import int8_prompt_rows

    llm = LLM(path, enable_prefix_caching=False, max_model_len=max_model_len)
    vocab = llm.engine.facts.vocab_size
    params = SamplingParams(temperature=0, max_tokens=1, ignore_eos=True)
    llm.generate([list(range(5, 69))], params)  # warm-up
    out: dict[str, Any] = {"int8_prompt_rows": min(int8_prompt_rows(), 1 << 30)}
    for p in sizes:
        prompt = np.random.default_rng(seed + p).integers(5, vocab, size=p).tolist()
        load = os.getloadavg()[0]
        m = llm.generate([prompt], params)[0].metrics
        assert m is not None
        out[str(p)] = {"tok_s": m.prefill_tok_s, "load_avg_1m": load}
    return out


def llamacpp_worker(path: str, sizes: list[int], seed: int, threads: int, repack: bool) -> dict[str, Any]:
    import llama_cpp.llama_cpp as lc
    from llamacpp_peer import measure_llamacpp_prefill

    if not repack:
        default = lc.llama_model_default_params

        def no_extra_bufts() -> Any:
            params = default()
            params.use_extra_bufts = False
            return params

        lc.llama_model_default_params = no_extra_bufts  # what Llama() reads its model parameters from
    out: dict[str, Any] = {}
    for p in sizes:
        load = os.getloadavg()[0]
        out[str(p)] = {
            "tok_s": measure_llamacpp_prefill(Path(path), p, threads, True, seed + p),
            "load_avg_1m": load,
        }
    return out


def run_child(engine: str, args: argparse.Namespace, seed: int) -> dict[str, Any]:
    from moe_compare import no_amx_preload

    env = {**os.environ, "LD_PRELOAD": no_amx_preload(), "OMP_NUM_THREADS": str(args.threads)}
    env["GLASSBOX_NUM_THREADS"] = str(args.threads)
    if engine.startswith("glassbox"):
        env.update(NO_AMX_ENV)
        env["GLASSBOX_BLOCK_PROMPTS"] = "dequant" if engine == "glassbox_dequant" else "auto"
    work = [
        engine,
        str(args.model),
        args.prompt_tokens,
        seed,
        args.threads,
        args.max_model_len,
        args.llamacpp_repack,
    ]
    p = subprocess.run(
        [sys.executable, __file__, "--worker"],
        input=json.dumps(work),
        capture_output=True,
        text=True,
        env=env,
    )
    lines = p.stdout.strip().splitlines()
    if p.returncode != 0 or not lines:
        raise RuntimeError(f"{engine} failed (exit {p.returncode}): {p.stderr.strip()[-800:]}")
    return dict(json.loads(lines[-1]))


def worker() -> int:
    engine, path, sizes, seed, threads, max_len, repack = json.loads(sys.stdin.read())
    if engine == "llama_cpp":
        result = llamacpp_worker(path, sizes, seed, threads, repack)
    else:
        result = glassbox_worker(path, sizes, seed, max_len)
    print(json.dumps(result))
    return 0


def summarize(runs: list[dict[str, Any]], sizes: list[int]) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for p in sizes:
        k = str(p)
        per = {e: [r[e][k]["tok_s"] for r in runs] for e in ENGINES}
        ratios = [r["glassbox_int8"][k]["tok_s"] / r["llama_cpp"][k]["tok_s"] for r in runs]
        ref = [r["glassbox_int8"][k]["tok_s"] / r["glassbox_dequant"][k]["tok_s"] for r in runs]
        out[k] = {
            **{f"{e}_median_tok_s": round(statistics.median(v), 2) for e, v in per.items()},
            "int8_vs_llama_cpp_per_round": [round(x, 3) for x in ratios],
            "int8_vs_llama_cpp_median": round(statistics.median(ratios), 3),
            "int8_vs_dequant_per_round": [round(x, 3) for x in ref],
            "load_avg_1m_per_round": [[r[e][k]["load_avg_1m"] for e in ENGINES] for r in runs],
        }
    return out


def main() -> int:
    if sys.argv[1:] == ["--worker"]:
        return worker()
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0] if __doc__ else None)
    ap.add_argument("--model", type=Path, required=True, help="a .gguf file (Q4_0, Q8_0, ...)")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--prompt-tokens", type=int, nargs="+", default=[128, 512])
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--max-model-len", type=int, default=2048)
    ap.add_argument("--llamacpp-repack", action="store_true", help="llama.cpp with its extra buffer types")
    ap.add_argument("--out", type=Path, default=None)
    args = ap.parse_args()
    if not args.model.is_file():
        raise SystemExit(f"--model: no such file {args.model}")
    from glassbox.perf.hardware import cpu_name

    runs = []
    for r in range(args.rounds):
        runs.append({e: run_child(e, args, 100 * r) for e in ENGINES})
        print(json.dumps(runs[-1]), flush=True)
    result = {
        "date": time.strftime("%Y-%m-%d %H:%M"),
        "machine": {"cpu": cpu_name(), "cores": os.cpu_count(), "amx_in_cpu": _has_amx(), "amx_denied": True},
        "model": str(args.model),
        "threads": args.threads,
        "llama_cpp": {"version": _llamacpp_version(), "extra_bufts": args.llamacpp_repack},
        "glassbox_env": NO_AMX_ENV,
        "runs": runs,
        "summary": summarize(runs, args.prompt_tokens),
    }
    out = args.out or RESULTS / f"vnni-prefill-{time.strftime('%Y-%m-%d')}.json"
    out.write_text(json.dumps(result, indent=2) + "\n")
    print(json.dumps(result["summary"], indent=2))
    print(f"wrote {out}")
    return 0


def _has_amx() -> bool:
    with open("/proc/cpuinfo") as f:
        return any(line.startswith("flags") and " amx_bf16" in line for line in f)


def _llamacpp_version() -> str:
    from llamacpp_peer import llamacpp_version

    return llamacpp_version()


if __name__ == "__main__":
    raise SystemExit(main())
