"""Batched throughput, glassbox vs transformers in turns: B concurrent requests on one set of weights.

Both engines load the same random Qwen3-0.6B-shaped bf16 model in one process; each round runs glassbox's
batch of B requests (128-token prompts, ``--decode-tokens`` generated each, greedy, ignore_eos) and then
transformers' ``generate`` on the same B prompts (no padding: equal lengths), and records output tokens over
wall time, prefill included, for each. Where glassbox's bf16 tiles run on AMX, a third turn runs glassbox with
them on the AVX-512 dot products (GLASSBOX_BF16_AMX=off's path), to show what the AMX kernel buys. The per-round ratio is the figure (this shared machine's speed drifts
within minutes; only ratios measured side by side mean anything); the load average is written beside it.

    .venv/bin/python benchmarks/batched_in_turns.py --batch 16 --rounds 5 --threads 1
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import sys
import time
from pathlib import Path
from typing import Any

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
from bench_models import qwen3_0_6b_random  # noqa: E402
from cpu_compare import _prompts  # noqa: E402

from glassbox.perf.hardware import cpu_name  # noqa: E402

RESULTS = Path(__file__).resolve().parent / "results"


def _load() -> float:
    return float(Path("/proc/loadavg").read_text().split()[0])


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0] if __doc__ else None)
    ap.add_argument("--batch", type=int, default=16)
    ap.add_argument("--decode-tokens", type=int, default=64)
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--threads", type=int, default=torch.get_num_threads())
    ap.add_argument("--out", type=Path, default=None)
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    os.environ["GLASSBOX_NUM_THREADS"] = str(args.threads)
    import transformers as tf

    from glassbox import LLM, SamplingParams
    from glassbox.kernels import native

    model_dir = qwen3_0_6b_random()
    b, n = args.batch, args.decode_tokens
    llm = LLM(
        str(model_dir),
        dtype="bfloat16",
        max_num_seqs=b,
        enable_prefix_caching=False,
        num_kv_blocks=b * -(-(128 + n) // 16) + 16,
    )
    hf = tf.AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.bfloat16).eval()
    params = SamplingParams(temperature=0, max_tokens=n, ignore_eos=True)

    def glassbox_round(prompts: list[list[int]]) -> float:
        t0 = time.perf_counter()
        res = llm.generate(prompts, params)
        return sum(len(r.token_ids) for r in res) / (time.perf_counter() - t0)

    def hf_round(prompts: list[list[int]]) -> float:
        ids = torch.tensor(prompts)
        t0 = time.perf_counter()
        with torch.inference_mode():
            out = hf.generate(
                ids, attention_mask=torch.ones_like(ids), max_new_tokens=n, min_new_tokens=n,
                do_sample=False, pad_token_id=0,
            )  # fmt: skip
        assert out.shape == (len(prompts), ids.shape[1] + n)
        return b * n / (time.perf_counter() - t0)

    warm = _prompts(2, 32, 7)
    glassbox_round(warm)
    hf_round([p[:32] for p in _prompts(b, 128, 8)])
    lib = native.library()
    amx = lib is not None and native.bf16_amx_wanted() and bool(lib.gb_bf16_amx_init(1))
    rounds: list[dict[str, float]] = []
    for r in range(args.rounds):
        prompts = _prompts(b, 128, 100 + r)  # fresh prompts each round, the same for both engines
        g = glassbox_round(prompts)
        load_g = _load()
        h = hf_round(prompts)
        row = {"glassbox_tok_s": g, "transformers_tok_s": h, "ratio": g / h}
        if amx:
            assert lib is not None
            lib.gb_bf16_amx_init(0)
            row["glassbox_dot_products_tok_s"] = glassbox_round(prompts)
            lib.gb_bf16_amx_init(1)
        row["load"] = (load_g + _load()) / 2
        rounds.append(row)
        print(f"round {r}: " + ", ".join(f"{k} {v:.2f}" for k, v in row.items()), flush=True)
    ratios = [x["ratio"] for x in rounds]
    result: dict[str, Any] = {
        "machine": {
            "cpu": cpu_name(),
            "platform": platform.platform(),
            "threads": args.threads,
            "bf16_amx": amx,
        },
        "workload": {"batch": b, "prompt_tokens": 128, "decode_tokens": n, "model": "qwen3-0.6b-shaped bf16"},
        "rounds": rounds,
        "median_ratio": statistics.median(ratios),
    }
    print(f"median ratio glassbox / transformers at batch {b}: {result['median_ratio']:.2f}")
    out = args.out or RESULTS / f"batched-b{b}-{time.strftime('%Y-%m-%d')}-{args.threads}t.json"
    out.write_text(json.dumps(result, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
