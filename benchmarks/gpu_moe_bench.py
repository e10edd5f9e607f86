"""GPU benchmark of the fused triton MoE (kernels/triton_moe.py): Qwen3-30B-A3B's experts, bf16, dummy
weights, decode at batch 1 and 32. Meant to fit a short GPU session (about 2-3 minutes, each part in its
own process with its own timeout).

(a) kernels: one layer's experts (E=128, top-8, H=2048, I=768: 9.4 MB an expert) at T = 1 and 32 rows,
    softmax top-k routing of random logits, the calls rotating among enough layers' weights that each reads
    device memory, not the L2 the previous call filled: median microseconds, the bytes of the experts the
    call chose (distinct experts x expert bytes: what it must read), GB/s and the fraction of a read probe's
    bandwidth; beside it MoEExperts.dense (all E experts on every row: what the decode graphs ran before)
    and MoEExperts.grouped (one GEMM pair per chosen expert after a host read of the counts); and
    triton_moe.align alone by both paths from 1 to 2048 tokens (where ALIGN_KERNEL_PAIRS should sit).
(b) engine: the same shape with --layers layers through LLM (dummy weights, bf16, CUDA graphs), batch 1
    and 32: the decode graph's replay time, the experts it reads per layer (the fused kernels' device
    counter), the weight and KV bytes a step reads and their GB/s; and the engine's own decode step times.
Writes <out>/gpu-moe-<date>.json.

    PYTHONPATH=src python3 benchmarks/gpu_moe_bench.py [--out benchmarks/results] [--layers 8]
    PYTHONPATH=src python3 benchmarks/gpu_moe_bench.py --smoke   # tiny shapes on the CPU (interpreter)
"""

from __future__ import annotations

import argparse
import datetime
import itertools
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

SMOKE = os.environ.get("GLASSBOX_BENCH_SMOKE") == "1"
if SMOKE:  # before triton is imported: its interpreter runs the kernels on the CPU
    os.environ.setdefault("TRITON_INTERPRET", "1")

import torch  # noqa: E402
from gpu_bench import SHAPES as BENCH_SHAPES  # noqa: E402
from gpu_bench import model_dir, run_isolated  # noqa: E402

DEVICE = "cpu" if SMOKE else "cuda"
QWEN3_30B_A3B: dict[str, Any] = {
    "architectures": ["Qwen3MoeForCausalLM"], "model_type": "qwen3_moe", "hidden_size": 2048,
    "intermediate_size": 6144, "moe_intermediate_size": 768, "num_experts": 128, "num_experts_per_tok": 8,
    "norm_topk_prob": True, "decoder_sparse_step": 1, "mlp_only_layers": [], "num_hidden_layers": 48,
    "num_attention_heads": 32, "num_key_value_heads": 4, "head_dim": 128, "vocab_size": 151936,
    "rms_norm_eps": 1e-6, "max_position_embeddings": 40960, "rope_theta": 1000000.0,
    "tie_word_embeddings": False, "attention_bias": False, "hidden_act": "silu", "torch_dtype": "bfloat16",
    "use_sliding_window": False, "sliding_window": None, "bos_token_id": 1, "eos_token_id": 2,
}  # fmt: skip
TINY = dict(hidden_size=64, moe_intermediate_size=32, num_experts=8, num_experts_per_tok=2,
            num_attention_heads=4, num_key_value_heads=2, head_dim=16, vocab_size=1000)  # fmt: skip
BATCHES = (1, 32)


def timed_ms(fn: Any, iters: int) -> float:
    """Median milliseconds of ``fn``: CUDA events after a warm-up; wall time on the CPU (smoke)."""
    fn()
    times = []
    for _ in range(iters):
        if DEVICE == "cpu":
            t = time.perf_counter()
            fn()
            times.append(1e3 * (time.perf_counter() - t))
            continue
        a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        a.record()
        fn()
        b.record()
        b.synchronize()
        times.append(a.elapsed_time(b))
    return statistics.median(times)


def read_probe_gbps() -> float:
    """Read bandwidth: a sum over 1 GiB of bf16 (device memory, far past the L2)."""
    if DEVICE == "cpu":
        return float("nan")
    src = torch.randn(1 << 29, device=DEVICE, dtype=torch.bfloat16)
    return src.nbytes / timed_ms(lambda: src.sum(), 20) / 1e6


# -- parts (each runs in a fresh process) ------------------------------------------------------------
def part_kernels(args: argparse.Namespace) -> dict[str, Any]:
    from glassbox.kernels.triton_moe import fused_moe
    from glassbox.models.moe import MoEExperts, gated, route

    cfg = {**QWEN3_30B_A3B, **(TINY if SMOKE else {})}
    e, k = cfg["num_experts"], cfg["num_experts_per_tok"]
    h, i = cfg["hidden_size"], cfg["moe_intermediate_size"]
    dtype = torch.bfloat16 if DEVICE == "cuda" else torch.float16  # the interpreter's bf16 dot is wrong
    expert_bytes = 3 * h * i * dtype.itemsize
    res: dict[str, Any] = {"read_GBps": read_probe_gbps(), "expert_bytes": expert_bytes}
    l2 = torch.cuda.get_device_properties(0).L2_cache_size if DEVICE == "cuda" else 0
    res["l2_bytes"] = l2
    layers = 1 if SMOKE else 3  # 3 x 1.2 GB of experts: a batch-1 call's 8 experts (75 MB) leave the L2
    experts = []
    for _ in range(layers):
        m = MoEExperts(e, h, i, gated("silu")).to(DEVICE, dtype)
        with torch.no_grad():
            m.gate_up_proj.normal_(0, 0.02)
            m.down_proj.normal_(0, 0.02)
        experts.append(m)
    g = torch.Generator(device=DEVICE).manual_seed(0)
    for t in BATCHES:
        xs = [torch.randn(t, h, device=DEVICE, generator=g).to(dtype) for _ in range(layers)]
        routes = [route(torch.randn(t, e, device=DEVICE, generator=g), k, True) for _ in range(layers)]
        chosen = statistics.mean(len(set(ids.flatten().tolist())) for _, ids in routes)
        active = chosen * expert_bytes
        calls = [(m, x, ids, w.to(dtype)) for m, x, (w, ids) in zip(experts, xs, routes, strict=True)]
        row: dict[str, Any] = {"experts_chosen": chosen, "active_bytes": active}
        for kind in ("fused", "dense", "grouped"):
            turn = itertools.cycle(calls)

            def call(kind: str = kind, turn: Any = turn) -> None:
                m, x, ids, w = next(turn)
                if kind == "fused":
                    fused_moe(x, ids, w, m.gate_up_proj, m.down_proj)
                else:
                    getattr(m, kind)(x, ids, w)

            try:
                ms = timed_ms(call, 3 if SMOKE else 30)
            except Exception as err:  # report and go on: the other kinds still measure
                row[kind] = {"error": repr(err)[:300]}
                continue
            read = active if kind != "dense" else e * expert_bytes
            row[kind] = {"us": 1e3 * ms, "bytes_read": read, "GBps": read / ms / 1e6}
            if res["read_GBps"] == res["read_GBps"]:  # not NaN
                row[kind]["fraction_of_read_bw"] = read / ms / 1e6 / res["read_GBps"]
        res[f"T{t}"] = row
    from glassbox.kernels.triton_moe import ALIGN_KERNEL_PAIRS, align

    res["align_kernel_pairs"] = ALIGN_KERNEL_PAIRS  # where align() switches: these times are for tuning it
    for t in (1, 32, 128, 512, 2048) if not SMOKE else (1, 64):
        ids = route(torch.randn(t, e, device=DEVICE, generator=g), k, True)[1]
        bm = 16 if t * k <= 16 * e else 64
        res[f"align_T{t}_us"] = {
            path: 1e3 * timed_ms(lambda i=ids, b=bm, kn=kernel: align(i, e, b, None, kn), 3 if SMOKE else 30)
            for path, kernel in (("kernel", True), ("torch", False))
        }
    return res


def part_engine(args: argparse.Namespace) -> dict[str, Any]:
    from glassbox import LLM, SamplingParams
    from glassbox.models.moe import MoEExperts
    from glassbox.models.moe_triton import experts_read, use_triton_experts

    read_gbps = read_probe_gbps()  # before the engine takes the memory for its KV cache
    if DEVICE == "cuda":
        torch.cuda.empty_cache()
    name = f"qwen3-30b-a3b-{args.layers}l"
    BENCH_SHAPES[name] = {**QWEN3_30B_A3B, "num_hidden_layers": args.layers, **(TINY if SMOKE else {})}
    t0 = time.perf_counter()
    dtype = "bfloat16" if DEVICE == "cuda" else "float32"
    llm = LLM(str(model_dir(Path(args.models), name)), load_format="dummy", dtype=dtype, device=DEVICE,
              max_num_seqs=max(BATCHES), max_model_len=2048, memory_utilization=0.6)  # fmt: skip
    res: dict[str, Any] = {"load_s": time.perf_counter() - t0, "layers": args.layers}
    ex = llm.engine.executor
    if DEVICE == "cpu":  # smoke: the interpreter runs the fused kernels as CUDA would
        ex.attn_backend, ex.forward = "triton", ex.model
        use_triton_experts(ex.model)
    experts = [m for m in ex.model.modules() if isinstance(m, MoEExperts)]
    res["fused_layers"] = sum(m.fused is not None for m in experts)
    res["read_GBps"] = read_gbps
    mc, facts = llm.engine.model_config, llm.engine.facts
    expert_bytes = experts[0].expert_bytes()
    all_expert_bytes = len(experts) * mc.num_experts * expert_bytes
    embedding = mc.vocab_size * mc.hidden_size * ex.dtype.itemsize  # one row of it is read, not the table
    fixed_bytes = ex.weight_bytes - all_expert_bytes - embedding  # attention, norms, routers, the LM head
    res.update(expert_bytes=expert_bytes, other_weight_bytes=fixed_bytes)
    vocab = mc.vocab_size
    prompt_len, new = (16, 8) if SMOKE else (128, 64)
    for b in BATCHES:
        prompts = [[(17 * j + 31 * p) % (vocab - 10) + 10 for p in range(prompt_len)] for j in range(b)]
        sp = SamplingParams(temperature=0, max_tokens=new, ignore_eos=True)
        llm.engine.step_records.clear()
        llm.generate(prompts, sp)
        steps = [r.duration_s for r in llm.engine.step_records if r.phase == "decode" and r.batch_size == b]
        row: dict[str, Any] = {"engine_step_ms_median": 1e3 * statistics.median(steps) if steps else None}
        kv = facts.kv_bytes_per_token(ex.kv_dtype.itemsize) * b * (prompt_len + new)
        if ex.graphs is not None:
            size = ex.graphs.padded_size(b)
            graph = ex.graphs.graphs[size]  # replays the last step's inputs: the same routing each time
            before = sum(experts_read(m)[0] for m in experts)
            iters = 30
            ms = timed_ms(graph.replay, iters)
            per_layer = (sum(experts_read(m)[0] for m in experts) - before) / (iters + 1) / len(experts)
            read = fixed_bytes + per_layer * len(experts) * expert_bytes + kv
            row.update(graph_size=size, replay_ms=ms, experts_read_per_layer=per_layer, bytes_read=read,
                       GBps=read / ms / 1e6)  # fmt: skip
            if res["read_GBps"] == res["read_GBps"]:
                row["fraction_of_read_bw"] = read / ms / 1e6 / res["read_GBps"]
        res[f"batch{b}"] = row
    return res


PARTS = {"kernels": part_kernels, "engine": part_engine}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", default="benchmarks/results")
    ap.add_argument("--parts", default="kernels,engine")
    ap.add_argument("--layers", type=int, default=8, help="MoE layers of the engine part's model")
    ap.add_argument("--models", default=str(Path(tempfile.gettempdir()) / "glassbox-bench-models"))
    ap.add_argument("--timeout", type=float, default=240, help="seconds per part")
    ap.add_argument("--smoke", action="store_true", help="tiny shapes on the CPU: checks the script only")
    ap.add_argument("--part", help=argparse.SUPPRESS)
    ap.add_argument("--part-out", help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.smoke and not SMOKE:  # re-run with the flag in the environment (read at import, parts inherit it)
        os.environ["GLASSBOX_BENCH_SMOKE"] = "1"
        sys.exit(subprocess.call([sys.executable, __file__, *sys.argv[1:]]))
    if args.part:
        Path(args.part_out).write_text(json.dumps(PARTS[args.part](args)))
        return
    parts = {}
    for p in args.parts.split(","):
        cmd = [sys.executable, __file__, "--part", p, "--models", args.models, f"--layers={args.layers}",
               "--part-out"]  # fmt: skip
        parts[p] = run_isolated(p, cmd, args.timeout)
    summary = {
        "device": torch.cuda.get_device_name(0) if torch.cuda.is_available() else None,
        "torch": torch.__version__,
        "date": datetime.date.today().isoformat(),
        "command": " ".join(["benchmarks/gpu_moe_bench.py", *sys.argv[1:]]),
        "smoke": SMOKE,
        "model": "Qwen3-30B-A3B shape (E=128, top-8, H=2048, I=768), dummy weights, bf16",
        "parts": parts,
    }
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    path = out / f"gpu-moe-{summary['date']}{'-smoke' if SMOKE else ''}.json"
    path.write_text(json.dumps(summary, indent=2) + "\n")
    print(f"wrote {path}")


if __name__ == "__main__":
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    main()
