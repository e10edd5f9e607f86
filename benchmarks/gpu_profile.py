"""Where a GPU decode step's time goes: torch.profiler over glassbox's decode steps, device kernels
grouped (attention, GEMV, GEMM, fused elementwise, sampling, index kernels, copies, other), the device's busy
share of the wall time, and the host time between steps.

Two cases by default, each in its own process: batch-1 decode on the Llama-3.1-8B shape (what bounds the roofline
fraction) and batch-256 decode on the Qwen3-0.6B shape (what bounds throughput). Same dummy-weight
models as benchmarks/gpu_bench.py; `--cases decode_b1_llama8b_int4` profiles the batch-1 case in 4-bit blocks.
Writes <out>/gpu-profile-<date>.json.

    PYTHONPATH=src python3 benchmarks/gpu_profile.py [--out benchmarks/results] [--eager] [--smoke]
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import re
import sys
import tempfile
from collections import defaultdict
from pathlib import Path
from typing import Any

import torch

# kernel name -> group, first match wins (glassbox's triton kernels, cuBLAS GEMV and GEMM kernels and
# cuTLASS ones, inductor's fused kernels). The LM head is a GEMV at batch 1 and a GEMM beyond, so it counts
# there; index kernels (KV cache writes, the rope and embedding lookups, the sampler's row selections) are
# their own group, not sampling's.
GROUPS: list[tuple[str, str]] = [
    ("attention", r"_decode_kernel|_prefill_kernel|_reduce_kernel|flash|fmha|attention"),
    ("gemv", r"gemv"),
    ("gemm", r"gemm|cutlass|nvjet|sm90_xmma|cublas|matmul|\bmm\b|addmm|linear|splitkreduce"),
    ("elementwise (compiled)", r"^triton_"),
    ("sampling", r"argmax|argsort|sort|softmax|exponential|topk|cumsum|distribution|philox"),
    ("index (KV writes, rope, embedding, row selects)", r"index|gather|scatter|embedding"),
    ("copies", r"memcpy|memset|copy|fill"),
]


def group_of(name: str) -> str:
    low = name.lower()
    for group, pattern in GROUPS:
        if re.search(pattern, low):
            return group
    return "other"


def summarize(prof: Any, wall_s: float, steps: int) -> dict[str, Any]:
    """Device kernel time by group and the top kernels (CPU op self time when no CUDA kernel ran)."""
    events = list(prof.key_averages())
    on_device = [e for e in events if e.device_type == torch.autograd.DeviceType.CUDA]
    if on_device:
        rows = [(e.key, e.self_device_time_total, e.count) for e in on_device]
        source = "device kernels"
    else:
        rows = [(e.key, e.self_cpu_time_total, e.count) for e in events]
        source = "CPU op self time (no device kernels: a CPU run)"
    rows = [r for r in rows if r[1] > 0]
    total_us = sum(r[1] for r in rows)
    groups: dict[str, float] = defaultdict(float)
    for name, us, _ in rows:
        groups[group_of(name)] += us
    top = sorted(rows, key=lambda r: -r[1])[:15]
    return {
        "source": source,
        "steps": steps,
        "wall_ms_per_step": 1e3 * wall_s / steps,
        "busy_ms_per_step": total_us / 1e3 / steps,
        "busy_fraction": total_us / 1e6 / wall_s if wall_s > 0 else None,
        "groups_ms_per_step": {g: us / 1e3 / steps for g, us in sorted(groups.items(), key=lambda x: -x[1])},
        "top": [{"name": n[:160], "ms_per_step": us / 1e3 / steps, "calls": c} for n, us, c in top],
    }


def profile_decode(llm: Any, prompts: list[list[int]], steps: int) -> dict[str, Any]:
    """Prefill ``prompts`` unprofiled, then profile ``steps`` engine steps of pure decode."""
    from gpu_bench import sync_time
    from torch.profiler import ProfilerActivity, profile

    from glassbox import SamplingParams

    eng = llm.engine
    sp = SamplingParams(temperature=0, max_tokens=steps + 8, ignore_eos=True)
    for i, p in enumerate(prompts):
        eng.add_request(f"p{i}", p, sp)
    while any(s.num_output_tokens < 2 for s in eng.scheduler.running) or eng.scheduler.waiting:
        eng.step()
    activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if torch.cuda.is_available() else [])
    eng.step_records.clear()
    with profile(activities=activities) as prof:
        t = sync_time()
        for _ in range(steps):
            eng.step()
        wall = sync_time() - t
    recs = list(eng.step_records)
    res = summarize(prof, wall, steps)
    res["batch"] = max((r.batch_size for r in recs), default=0)
    res["host_outside_execute_ms_per_step"] = 1e3 * sum(r.duration_s - r.execute_s for r in recs) / len(recs)
    while eng.has_unfinished_requests():
        eng.step()
    return res


def case_b1(args: argparse.Namespace, quantization: str | None = None) -> dict[str, Any]:
    from gpu_bench import engine_for

    llm = engine_for("llama-3.1-8b", Path(args.models), max_model_len=4096, max_num_seqs=16,
                     enforce_eager=args.eager, quantization=quantization)  # fmt: skip
    vocab = llm.engine.model_config.vocab_size
    warm = [[(7 * j) % vocab for j in range(128)]]
    profile_decode(llm, warm, 8)  # compiles and warms everything outside the measured run
    return profile_decode(llm, [[(11 * j + 3) % vocab for j in range(128)]], args.steps)


def case_b256(args: argparse.Namespace) -> dict[str, Any]:
    from gpu_bench import engine_for

    llm = engine_for("qwen3-0.6b", Path(args.models), max_model_len=4096, max_num_seqs=256,
                     enforce_eager=args.eager)  # fmt: skip
    vocab = llm.engine.model_config.vocab_size
    n = 16 if os.environ.get("GLASSBOX_BENCH_SMOKE") == "1" else 256
    prompts = [[(13 * i + 7 * j) % vocab for j in range(512)] for i in range(n)]
    profile_decode(llm, prompts[:8], 4)
    return profile_decode(llm, prompts, args.steps)


CASES = {
    "decode_b1_llama8b": case_b1,
    "decode_b256_qwen06b": case_b256,
    # the same batch-1 step in 4-bit blocks (--quantization int4: the Triton block kernels)
    "decode_b1_llama8b_int4": lambda args: case_b1(args, quantization="int4"),
}
DEFAULT_CASES = "decode_b1_llama8b,decode_b256_qwen06b"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", default="benchmarks/results")
    ap.add_argument("--models", default=str(Path(tempfile.gettempdir()) / "glassbox-bench-models"))
    ap.add_argument("--cases", default=DEFAULT_CASES, help=f"of {', '.join(CASES)}")
    ap.add_argument("--steps", type=int, default=24, help="decode steps profiled per case")
    ap.add_argument("--eager", action="store_true", help="glassbox with enforce_eager (no CUDA graphs)")
    ap.add_argument("--timeout", type=float, default=300, help="seconds per case")
    ap.add_argument("--smoke", action="store_true", help="tiny shapes on the CPU: checks the script only")
    ap.add_argument("--case", help=argparse.SUPPRESS)
    ap.add_argument("--case-out", help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.smoke:
        os.environ["GLASSBOX_BENCH_SMOKE"] = "1"  # gpu_bench reads it at import: tiny shapes on the CPU
    sys.path.insert(0, str(Path(__file__).resolve().parent))
    if args.case:
        Path(args.case_out).write_text(json.dumps(CASES[args.case](args)))
        return
    from gpu_bench import run_isolated

    results: dict[str, Any] = {}
    for name in args.cases.split(","):
        cmd = [sys.executable, __file__, *sys.argv[1:], "--case", name, "--case-out"]
        results[name] = run_isolated(name, cmd, args.timeout)
    summary = {
        "device": torch.cuda.get_device_name(0) if torch.cuda.is_available() else "cpu",
        "torch": torch.__version__,
        "date": datetime.date.today().isoformat(),
        "command": " ".join(["benchmarks/gpu_profile.py", *sys.argv[1:]]),
        "smoke": args.smoke,
        "cases": results,
    }
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    dest = out / f"gpu-profile-{summary['date']}.json"
    dest.write_text(json.dumps(summary, indent=2) + "\n")
    print(f"wrote {dest}")


if __name__ == "__main__":
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    main()
