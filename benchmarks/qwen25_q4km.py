"""Issue 42's first target: a Qwen2.5-0.5B-shaped Q4_K_M file made by llama.cpp's own quantizer, batch-1
decode of glassbox (blocks kept) against llama.cpp on the same file, and glassbox's greedy tokens on it against
the same engine with the file dequantized at load (``quantization="none"``).

Hidden 896 is 3.5 super-blocks: llama.cpp's Q4_K_M falls back for every tensor whose rows are 896 values
(Q5_0 / Q8_0 in place of Q4_K / Q6_K; the file's type counts are written out), so the kept path runs the
32-value kernels beside the K-quant ones. The random bf16 checkpoint (std 0.02, Qwen2 with q/k/v biases, tied
embeddings) goes through benchmarks/gguf_export.py, then llama_cpp.llama_model_quantize. ``--layers`` cuts the
depth (the real model has 24). Engines decode in turns for ``--rounds`` rounds (fresh 128-token prompt each,
``--decode-tokens`` greedy steps, the same thread count); medians and per-round ratios, the 1-minute load
average before each round. Writes benchmarks/results/qwen25-q4km-<date>.json.

    .venv/bin/python benchmarks/qwen25_q4km.py [--layers 24] [--rounds 5] [--threads 1]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time
from collections import Counter
from pathlib import Path
from typing import Any

import torch
from gguf import GGUFReader

sys.path.insert(0, str(Path(__file__).resolve().parent))
from bench_models import cache_dir  # noqa: E402
from gguf_export import export_gguf  # noqa: E402
from kquant_e2e import quantize_q4_k_m  # noqa: E402
from llamacpp_peer import llamacpp_greedy, llamacpp_version  # noqa: E402
from quant_compare import Decoder, glassbox_decoder, llamacpp_decoder  # noqa: E402

from glassbox import LLM, SamplingParams  # noqa: E402
from glassbox.perf.hardware import cpu_name  # noqa: E402

RESULTS = Path(__file__).resolve().parent / "results"
# Qwen/Qwen2.5-0.5B config.json's dimensions
QWEN25_0_5B: dict[str, Any] = dict(
    hidden_size=896,
    num_attention_heads=14,
    num_key_value_heads=2,
    intermediate_size=4864,
    vocab_size=151936,
    max_position_embeddings=32768,
    rope_theta=1000000.0,
    tie_word_embeddings=True,
    rms_norm_eps=1e-6,
)


def qwen25_0_5b_random(layers: int, seed: int = 0) -> Path:
    """A Qwen2.5-0.5B-shaped bf16 model of ``layers`` layers, random weights, the test tokenizer."""
    import transformers as tf

    out = cache_dir() / f"qwen2.5-0.5b-random-{layers}l"
    if (out / "model.safetensors").is_file():
        return out
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "tests"))
    from tokenizer_factory import build_tokenizer_dir

    torch.manual_seed(seed)
    cfg = tf.Qwen2Config(**QWEN25_0_5B, num_hidden_layers=layers, eos_token_id=1, bos_token_id=0)
    model = tf.AutoModelForCausalLM.from_config(cfg, dtype=torch.bfloat16)
    model.save_pretrained(out, safe_serialization=True)
    build_tokenizer_dir(out)
    (out / "generation_config.json").write_text(json.dumps({"eos_token_id": 1}) + "\n")
    return out


def leading(a: list[int], b: list[int]) -> int:
    """How many leading tokens ``a`` and ``b`` share."""
    return next((i for i, (x, y) in enumerate(zip(a, b, strict=False)) if x != y), min(len(a), len(b)))


def agreement(path: Path, prompts: list[list[int]], new: int, dtype: str) -> dict[str, Any]:
    """Greedy tokens of the engine keeping the file's blocks against the engine that dequantizes it at load
    with the gguf package (``quantization="none"``), both in ``dtype``. float32: the kept layers multiply the
    dequantized weight, so the tokens must be equal; bfloat16 (as served): decode steps quantize activations
    to int8 (as llama.cpp does), so where the paths part, ``gap`` is the dequantized engine's logprob of its
    own token minus that of ours at the first difference (a near tie when small)."""
    params = SamplingParams(temperature=0, max_tokens=new, ignore_eos=True, logprobs=5)
    kept = LLM(str(path), device="cpu", dtype=dtype, max_model_len=512).generate(prompts, params)
    dense = LLM(str(path), device="cpu", dtype=dtype, max_model_len=512, quantization="none")
    deq = dense.generate(prompts, params)
    lead = [leading(a.token_ids, b.token_ids) for a, b in zip(kept, deq, strict=True)]
    gaps = []
    for a, b, n in zip(kept, deq, lead, strict=True):
        if n < new and b.logprobs is not None:
            lp = b.logprobs[n]
            gaps.append(round(lp[b.token_ids[n]] - lp.get(a.token_ids[n], float("-inf")), 4))
    return {"dtype": dtype, "new_tokens": new, "leading_equal": lead, "all_equal": all(n == new for n in lead),
            "gap_at_first_difference": gaps, "kept": [o.token_ids for o in kept]}  # fmt: skip


def peer_without_extra_buffers() -> None:
    """llama.cpp models loaded from here on with ``use_extra_bufts=False``: no AMX (nor repacked) weight
    buffers. On this VM (Xeon with AMX, oneDNN's AMX runs) the wheel's AMX matmul dies of SIGILL at its first
    ``tilezero`` (libggml-cpu.so, in a process of llama.cpp alone too), so the peer runs its plain CPU kernels."""
    import llama_cpp.llama_cpp as lc

    default = lc.llama_model_default_params

    def params() -> Any:
        p = default()
        p.use_extra_bufts = False
        return p

    lc.llama_model_default_params = params  # type: ignore[assignment]


def machine(threads: int) -> dict[str, Any]:
    flags = Path("/proc/cpuinfo").read_text().split("flags", 2)[1].split("\n", 1)[0].split()
    lscpu = subprocess.run(["lscpu"], capture_output=True, text=True).stdout
    model = next(
        (ln.split(":", 1)[1].strip() for ln in lscpu.splitlines() if ln.startswith("Model name")), ""
    )
    return {"cpu": cpu_name(), "lscpu_model": model, "cores": os.cpu_count(), "threads": threads,
            "amx": "amx_tile" in flags, "avx512_vnni": "avx512_vnni" in flags}  # fmt: skip


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0] if __doc__ else None)
    ap.add_argument("--layers", type=int, default=24)
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--decode-tokens", type=int, default=64)
    ap.add_argument("--agree-tokens", type=int, default=32)
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--out", type=Path, default=None)
    ap.add_argument("--peer-extra-buffers", action="store_true", help="llama.cpp's AMX/repacked buffers on")
    args = ap.parse_args()
    if not args.peer_extra_buffers:
        peer_without_extra_buffers()
    torch.set_num_threads(args.threads)
    model = qwen25_0_5b_random(args.layers)
    src = model / "model-bf16.gguf"
    if not src.is_file():
        export_gguf(model, src, "bf16")
    path = quantize_q4_k_m(src, model / "model-q4_k_m.gguf", args.threads)
    types = dict(Counter(t.tensor_type.name for t in GGUFReader(path).tensors))
    prompts = [
        torch.randint(2, 150000, (32,), generator=torch.Generator().manual_seed(s)).tolist() for s in (1, 2)
    ]
    agree: dict[str, Any] = {
        dt: agreement(path, prompts, args.agree_tokens, dt) for dt in ("float32", "bfloat16")
    }
    peer = llamacpp_greedy(path, prompts, args.agree_tokens, args.threads)
    agree["llama.cpp leading_equal (vs bf16 kept)"] = [
        leading(a, b) for a, b in zip(peer, agree["bfloat16"]["kept"], strict=True)
    ]
    print(f"types {types}; greedy agreement {agree}", flush=True)
    decoders: dict[str, Decoder] = {}
    decoders["glassbox"], info = glassbox_decoder(path, args.decode_tokens, device="cpu")
    decoders["llama.cpp"] = llamacpp_decoder(path, args.decode_tokens, args.threads)
    runs: dict[str, list[float]] = {name: [] for name in decoders}
    loads: list[float] = []
    for r in range(args.rounds):
        loads.append(os.getloadavg()[0])
        prompt = torch.randint(2, 150000, (128,), generator=torch.Generator().manual_seed(500 + r)).tolist()
        for name, decode in decoders.items():
            runs[name].append(decode(prompt))
        print(f"round {r} (load {loads[-1]:.2f}): " + ", ".join(f"{n} {v[-1]:.1f}" for n, v in runs.items()),
              flush=True)  # fmt: skip
    per = [x / y for x, y in zip(runs["glassbox"], runs["llama.cpp"], strict=True)]
    result = {
        "date": time.strftime("%Y-%m-%d %H:%M"),
        "machine": machine(args.threads),
        "loadavg_1m_per_round": loads,
        "model": f"Qwen2.5-0.5B shape, {args.layers} layers, random bf16 weights; Q4_K_M by llama.cpp's quantizer",
        "tensor_types": types,
        "peer": llamacpp_version(),
        "peer_extra_buffers": args.peer_extra_buffers,
        "engine": info,
        "greedy_vs_dequantized": agree,
        "decode_tokens": args.decode_tokens,
        "decode_b1_tok_s": {name: round(statistics.median(v), 2) for name, v in runs.items()},
        "runs": runs,
        "glassbox / llama.cpp": {
            "per_round": [round(x, 3) for x in per],
            "median": round(statistics.median(per), 3),
        },
    }
    out = args.out or RESULTS / f"qwen25-q4km-{time.strftime('%Y-%m-%d')}.json"
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(result, indent=2) + "\n")
    print(json.dumps({k: result[k] for k in ("engine", "decode_b1_tok_s", "glassbox / llama.cpp")}, indent=2))
    print(f"wrote {out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
