"""MoE decode on the CPU: glassbox, llama.cpp and transformers on the same random weights, in turns.

Two shapes with the real models' dimensions (benchmarks/bench_models.py: Qwen3-30B-A3B, 128 experts top-8
of width 768; gpt-oss-20b, 32 experts top-4 of width 2880, sinks, alternating 128-token sliding layers)
but FEW layers (``--layers``; a full-depth random model does not fit a small machine: each layer's bytes
are the real model's, the embedding and LM head are full size). Random bf16 weights (transformers' init,
std 0.02), written once as a Hugging Face checkpoint and as a bf16 GGUF (benchmarks/moe_gguf.py) that
llama.cpp runs through llama-cpp-python.

Each round, for each thread count of ``--threads`` (every engine alike: GLASSBOX_NUM_THREADS, n_threads,
torch.set_num_threads): the read and copy bandwidth (perf/hardware.py's probe functions: the roofline's
denominator); then one process holding glassbox and llama.cpp (llama-cpp-python, the GGUF mapped) runs
batch-1 decode in paired bursts: ``--bursts`` fresh random prompts of ``--prompt-tokens``, each followed
by ``--burst-tokens`` greedy tokens in one engine and then in the other (the order alternating), so that
the two engines of a pair saw the same machine (it is shared: its speed moves within seconds); then
glassbox's aggregate decode at each of ``--batches`` sequences; then transformers, in a process of its
own: batch-1 (``--decode-tokens``) and the same aggregates. Loads and warm-ups are outside the timings;
each process's weights are gone when it exits. Decode tok/s = tokens decoded after the first / their wall
time (prefill and the first token excluded, every engine alike). Aggregate = the batch's decoded tokens /
the time from its first first-token to its last finish. llama-cpp-python drives one sequence, so
llama.cpp has no aggregate here. The idle share of the machine's CPUs is sampled before each timed part.

Bytes per token (batch 1) = the weights one token reads, counted from the checkpoint's tensor shapes:
attention (+ biases, sinks), norms, router, k of E experts, the LM head and one embedding row; times 2
(bf16); plus the KV cache read (mean over the decode steps). Roofline = read bandwidth / that.

With ``--gguf SHAPE=FTYPE+FTYPE,...`` the bf16 GGUF is quantized by llama.cpp's own quantizer
(benchmarks/moe_gguf.quantize_gguf: Q4_K_M, Q4_0, MXFP4_MOE, ...) and glassbox loads THAT file too: only
the paired batch-1 bursts run, per file type (``--llamacpp-no-amx`` where ggml's AMX kernels crash). With
``--glassbox-quantization Q`` glassbox loads the bf16 checkpoint with ``--quantization Q`` instead (int4
against llama.cpp's Q4_0 of the same weights: the same rounding).

    PYTHONPATH=src .venv/bin/python benchmarks/moe_compare.py [--rounds 3] [--layers qwen3-30b-a3b=4,gpt-oss-20b=2]
    ... --gguf qwen3-30b-a3b=Q4_K_M+Q4_0,gpt-oss-20b=MXFP4_MOE --llamacpp-no-amx --threads 1
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import resource
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
from bench_models import MOE_SHAPES, moe_random  # noqa: E402
from moe_gguf import Checkpoint, export_moe_gguf, quantize_gguf  # noqa: E402

RESULTS = Path(__file__).resolve().parent / "results"
GIB = 2**30
# --tiny: a smoke test of the script itself (small dims, same code paths)
TINY: dict[str, dict[str, Any]] = {
    "qwen3-30b-a3b": dict(hidden_size=128, num_attention_heads=4, num_key_value_heads=2, head_dim=32,
                          vocab_size=1024, moe_intermediate_size=64, intermediate_size=256, num_experts=16),
    "gpt-oss-20b": dict(hidden_size=128, num_attention_heads=4, num_key_value_heads=2, head_dim=32,
                        vocab_size=1024, intermediate_size=64, num_local_experts=8, sliding_window=16),
}  # fmt: skip


def _prompts(n: int, length: int, seed: int, vocab: int) -> list[list[int]]:
    g = torch.Generator().manual_seed(seed)
    return [torch.randint(2, vocab, (length,), generator=g).tolist() for _ in range(n)]


def _mem_available_gib() -> float:
    for line in Path("/proc/meminfo").read_text().splitlines():
        if line.startswith("MemAvailable:"):
            return int(line.split()[1]) / 2**20
    return float("nan")


def cpu_idle(window_s: float = 1.0) -> float:
    """The machine's idle share over ``window_s`` (/proc/stat: idle + iowait over all CPU time)."""

    def sample() -> list[int]:
        return [int(v) for v in Path("/proc/stat").read_text().split("\n", 1)[0].split()[1:]]

    a = sample()
    time.sleep(window_s)
    d = [y - x for x, y in zip(a, sample(), strict=True)]
    return (d[3] + d[4]) / max(1, sum(d))


def bytes_per_token(model_dir: Path, prompt_tokens: int, decode_tokens: int) -> dict[str, Any]:
    """What one batch-1 decode token reads, from the checkpoint's tensor shapes (bf16 = 2 bytes)."""
    cfg = json.loads((model_dir / "config.json").read_text())
    ck = Checkpoint(model_dir)
    e = int(cfg.get("num_experts") or cfg["num_local_experts"])
    k = int(cfg["num_experts_per_tok"])
    groups = {"attention": 0.0, "norms": 0.0, "router": 0.0, "experts_active": 0.0, "lm_head": 0.0,
              "embedding_row": 0.0}  # fmt: skip
    experts_total = total = 0
    for name in ck.names():
        n = 1
        for d in ck.shape(name):
            n *= d
        total += n
        if ".mlp.experts." in name:
            experts_total += n
            groups["experts_active"] += n * k / e
        elif name == "model.embed_tokens.weight":
            groups["embedding_row"] += ck.shape(name)[1]
        elif name == "lm_head.weight":
            groups["lm_head"] += n
        elif ".mlp.gate." in name or ".mlp.router." in name:
            groups["router"] += n
        elif "norm" in name:
            groups["norms"] += n
        else:
            groups["attention"] += n
    weights = 2 * sum(groups.values())
    # KV read per step: every layer's K and V rows up to the position (sliding layers: the window)
    layers, kv_heads = int(cfg["num_hidden_layers"]), int(cfg["num_key_value_heads"])
    head_dim = int(cfg.get("head_dim") or cfg["hidden_size"] // cfg["num_attention_heads"])
    kinds = cfg.get("layer_types") or ["full_attention"] * layers
    window = cfg.get("sliding_window") or 1 << 30
    per_row = 2 * kv_heads * head_dim * 2
    steps = [prompt_tokens + i for i in range(1, decode_tokens + 1)]
    kv = statistics.mean(
        sum(per_row * (min(p, window) if kd == "sliding_attention" else p) for kd in kinds) for p in steps
    )
    return {
        "params_by_group": {g: int(v) for g, v in groups.items()},
        "experts_total_params": experts_total,
        "weight_bytes_per_token": int(weights),
        "kv_bytes_per_token_mean": int(kv),
        "bytes_per_token": int(weights + kv),
        "checkpoint_bytes": 2 * total,
    }


# ------------------------------------------------------------------------------- the engines' workers


def _llamacpp_burst(lc: Any, prompt: list[int], n: int) -> float:
    """llama.cpp batch-1 decode as benchmarks/llamacpp_peer.measure_llamacpp times it: after the prompt's
    ``eval`` and its first token, each step an ``eval`` of one token + the argmax of its logits."""
    from llamacpp_peer import greedy_next

    lc.reset()
    lc.eval(list(prompt))
    tok = greedy_next(lc)
    t0 = time.perf_counter()
    for _ in range(n):
        lc.eval([tok])
        tok = greedy_next(lc)
    return n / (time.perf_counter() - t0)


def glassbox_worker(model_dir: Path, work: dict[str, Any], threads: int) -> dict[str, Any]:
    """In its own process (GLASSBOX_NUM_THREADS set): glassbox and llama.cpp batch-1 in paired bursts,
    then glassbox's aggregates."""
    from llamacpp_peer import _warm_up, load_llama

    from glassbox import LLM, SamplingParams

    vocab = json.loads((model_dir / "config.json").read_text())["vocab_size"]
    aggs: dict[str, list[list[int]]] = work["aggregates"]
    most = max([1, *(len(p) for p in aggs.values())])
    blocks = most * -(-(work["prompt_tokens"] + work["decode_tokens"] + 1) // 16) + 16
    t0 = time.perf_counter()
    model = work.get("glassbox_model") or str(model_dir)  # --gguf: the quantized file llama.cpp runs
    llm = LLM(model, dtype="bfloat16", max_num_seqs=most, enable_prefix_caching=False,
              num_kv_blocks=blocks, max_model_len=512,
              quantization=work.get("glassbox_quantization"))  # fmt: skip
    load_s = time.perf_counter() - t0
    llm.generate(_prompts(1, 16, 99, vocab), SamplingParams(temperature=0, max_tokens=4, ignore_eos=True))

    def glassbox(prompts: list[list[int]], n: int) -> float:
        sp = SamplingParams(temperature=0, max_tokens=n + 1, ignore_eos=True)
        ms = [o.metrics for o in llm.generate(prompts, sp) if o.metrics is not None]
        if len(prompts) == 1:
            return float(ms[0].decode_tok_s)
        decoded = sum(m.output_tokens - 1 for m in ms)
        span = max(m.finished_time or 0.0 for m in ms) - min(m.first_token_time or 0.0 for m in ms)
        return float(decoded / span)

    lc = load_llama(Path(work["gguf"]), 512, threads, True)
    _warm_up(lc, lc.n_vocab())
    faults = resource.getrusage(resource.RUSAGE_SELF).ru_majflt
    bursts = []
    for i, prompt in enumerate(work["bursts"]):
        row: dict[str, Any] = {"idle": round(cpu_idle(0.3), 2)}
        for engine in ("glassbox", "llama_cpp") if i % 2 == 0 else ("llama_cpp", "glassbox"):
            n = work["burst_tokens"]
            row[engine] = glassbox([prompt], n) if engine == "glassbox" else _llamacpp_burst(lc, prompt, n)
        row["ratio"] = row["glassbox"] / row["llama_cpp"]
        bursts.append(row)
    lc.close()
    res: dict[str, Any] = {"b1_bursts": bursts}
    res["b1_major_faults"] = resource.getrusage(resource.RUSAGE_SELF).ru_majflt - faults
    for engine in ("glassbox", "llama_cpp"):  # all the bursts' tokens over their time
        res[f"{engine}_b1_tok_s"] = len(bursts) / sum(1 / b[engine] for b in bursts)
    res["glassbox_over_llama_cpp_b1"] = statistics.median(b["ratio"] for b in bursts)
    for b, prompts in aggs.items():
        res[f"glassbox_b{b}_idle"] = round(cpu_idle(0.3), 2)
        res[f"glassbox_b{b}_tok_s"] = glassbox(prompts, work["decode_tokens"])
    ex = llm.engine.executor
    res["glassbox_weight_formats"] = ex.block_formats  # what the experts (and the rest) are held in
    return {**res, "glassbox_load_s": load_s, "glassbox_backend": ex.attn_backend,
            "glassbox_weight_gib": ex.weight_bytes / GIB, "glassbox_packed_matrices": ex.packed,
            "planner_active_params": ex.facts.active_params, "glassbox_threads": torch.get_num_threads()}  # fmt: skip


def hf_worker(model_dir: Path, work: dict[str, Any], threads: int) -> dict[str, Any]:
    """In its own process: load, then batch-1 and batched greedy decode, timed step by step."""
    import transformers as tf

    t0 = time.perf_counter()
    model = tf.AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.bfloat16)
    model.eval()
    load_s = time.perf_counter() - t0

    def decode(prompts: list[list[int]], n: int) -> float:
        ids = torch.tensor(prompts)
        with torch.inference_mode():
            out = model(input_ids=ids, use_cache=True)
            cache, tok = out.past_key_values, out.logits[:, -1].argmax(-1, keepdim=True)
            t1 = time.perf_counter()
            for _ in range(n):
                out = model(input_ids=tok, past_key_values=cache, use_cache=True)
                cache, tok = out.past_key_values, out.logits[:, -1].argmax(-1, keepdim=True)
            return len(prompts) * n / (time.perf_counter() - t1)

    decode([work["bursts"][0][:8]], 2)  # warm-up
    res: dict[str, Any] = {"b1_idle": round(cpu_idle(0.3), 2)}
    res["b1_tok_s"] = decode([work["bursts"][0]], work["decode_tokens"])
    for b, prompts in work["aggregates"].items():
        res[f"b{b}_idle"] = round(cpu_idle(0.3), 2)
        res[f"b{b}_tok_s"] = decode(prompts, work["decode_tokens"])
    impl = getattr(model.config, "_experts_implementation", None)
    return {**res, "load_s": load_s, "experts_implementation": impl, "version": tf.__version__,
            "threads": torch.get_num_threads()}  # fmt: skip


# ggml's AMX kernels (a CPU listing amx_int8) die of SIGILL on their first tile instruction in VMs that list
# AMX but do not enable its state; ggml skips them when arch_prctl(ARCH_REQ_XCOMP_PERM) fails, which this
# preloaded shim makes it do (llama.cpp then runs as on any AVX-512 CPU without AMX: its repacked layouts).
_NO_AMX_C = r"""
#define _GNU_SOURCE
#include <dlfcn.h>
#include <errno.h>
#include <stdarg.h>
#include <sys/syscall.h>
long syscall(long n, ...) {
    va_list ap;
    va_start(ap, n);
    long a = va_arg(ap, long), b = va_arg(ap, long), c = va_arg(ap, long);
    long d = va_arg(ap, long), e = va_arg(ap, long), f = va_arg(ap, long);
    va_end(ap);
    if (n == SYS_arch_prctl && a == 0x1023) { errno = EPERM; return -1; }
    static long (*real)(long, ...);
    if (!real) real = (long (*)(long, ...))dlsym(RTLD_NEXT, "syscall");
    return real(n, a, b, c, d, e, f);
}
"""


def no_amx_preload() -> str:
    """The shim above, built once into /tmp; its path for LD_PRELOAD."""
    out = Path(f"/tmp/glassbox-no-amx-{os.getuid()}.so")
    if not out.is_file():
        src = out.with_suffix(".c")
        src.write_text(_NO_AMX_C)
        subprocess.run(["cc", "-O2", "-shared", "-fPIC", "-o", str(out), str(src), "-ldl"], check=True)
    return str(out)


def run_worker(engine: str, model_dir: Path, work: dict[str, Any], threads: int) -> dict[str, Any]:
    """One engine's measurements in a fresh process (its weights are gone when it exits)."""
    cmd = [sys.executable, __file__, "--worker", engine, str(model_dir), "--threads", str(threads)]
    env = {**os.environ, "OMP_NUM_THREADS": str(threads), "GLASSBOX_NUM_THREADS": str(threads)}
    if work.get("no_amx"):
        env["LD_PRELOAD"] = no_amx_preload()
    p = subprocess.run(cmd, input=json.dumps(work), capture_output=True, text=True, env=env)
    lines = p.stdout.strip().splitlines()
    if p.returncode != 0 or not lines:
        tail = p.stderr.strip().splitlines()[-3:] if p.stderr.strip() else [f"exit {p.returncode}"]
        return {"error": " | ".join(tail)}
    return dict(json.loads(lines[-1]))


# ---------------------------------------------------------------------------------------- one shape


def _ratios(row: dict[str, Any], batches: list[int], roof: float) -> None:
    row["roofline_tok_s"] = roof
    for engine in ("glassbox", "llama_cpp", "transformers"):
        if isinstance(row.get(f"{engine}_b1_tok_s"), float):
            row[f"{engine}_b1_fraction_of_roofline"] = row[f"{engine}_b1_tok_s"] / roof
    for b in [1, *batches]:
        g, t = row.get(f"glassbox_b{b}_tok_s"), row.get(f"transformers_b{b}_tok_s")
        if isinstance(g, float) and isinstance(t, float):
            row[f"glassbox_over_transformers_b{b}"] = g / t


def measure_shape(shape: str, layers: int, args: argparse.Namespace) -> dict[str, Any]:
    from llamacpp_peer import llamacpp_version

    from glassbox.perf.probe import measure_bandwidth, measure_read_bandwidth

    t0 = time.perf_counter()
    model_dir = moe_random(shape, layers, **(TINY[shape] if args.tiny else {}))
    gguf = model_dir / "model-bf16.gguf"
    if not gguf.is_file():
        export_moe_gguf(model_dir, gguf)
    prep_s = time.perf_counter() - t0
    if args.gguf:
        return measure_gguf(shape, model_dir, gguf, args)
    vocab = json.loads((model_dir / "config.json").read_text())["vocab_size"]
    batches = [int(b) for b in args.batches.split(",") if b]
    bpt = bytes_per_token(model_dir, args.prompt_tokens, args.decode_tokens)
    thread_counts = [int(t) for t in args.threads.split(",")]
    rounds: dict[int, list[dict[str, Any]]] = {t: [] for t in thread_counts}
    for r in range(args.rounds):
        for threads in thread_counts:
            torch.set_num_threads(threads)
            row: dict[str, Any] = {"round": r, "threads": threads, "load_avg_1m": os.getloadavg()[0],
                                   "mem_available_gib": round(_mem_available_gib(), 1),
                                   "idle": round(cpu_idle(0.5), 2)}  # fmt: skip
            row["read_gbs"] = measure_read_bandwidth("cpu")
            row["copy_gbs"] = measure_bandwidth("cpu")
            work = {
                "gguf": str(gguf),
                "prompt_tokens": args.prompt_tokens,
                "decode_tokens": args.decode_tokens,
                "burst_tokens": args.burst_tokens,
                "bursts": _prompts(args.bursts, args.prompt_tokens, 1000 + 10 * r, vocab),
                "aggregates": {
                    b: _prompts(b, args.prompt_tokens, 2000 + 100 * r + b, vocab) for b in batches
                },
            }
            row.update(run_worker("glassbox", model_dir, work, threads))
            if not args.skip_hf:
                hf = run_worker("transformers", model_dir, work, threads)
                row.update({f"transformers_{k}": v for k, v in hf.items()})
            _ratios(row, batches, row["read_gbs"] * 1e9 / bpt["bytes_per_token"])
            print(json.dumps({shape: row}), flush=True)
            rounds[threads].append(row)
    medians = {}
    for threads, rows in rounds.items():
        keys = sorted(
            {k for x in rows for k, v in x.items() if isinstance(v, float) and not k.endswith("load_s")}
        )
        medians[f"threads={threads}"] = {
            k: statistics.median(x[k] for x in rows if isinstance(x.get(k), float)) for k in keys
        }
    return {
        "shape": shape,
        "layers": layers,
        "model_dir": str(model_dir),
        "gguf": str(gguf),
        "gguf_bytes": gguf.stat().st_size,
        "prepare_s": prep_s,
        "llama_cpp": llamacpp_version(),
        "bytes": bpt,
        "rounds": {f"threads={t}": rows for t, rows in rounds.items()},
        "median": medians,
    }


def measure_gguf(shape: str, model_dir: Path, bf16: Path, args: argparse.Namespace) -> dict[str, Any]:
    """--gguf: glassbox and llama.cpp on the SAME quantized GGUF (llama.cpp's quantizer on the bf16 file),
    batch-1 decode in paired bursts, per file type and thread count."""
    from llamacpp_peer import llamacpp_version

    vocab = json.loads((model_dir / "config.json").read_text())["vocab_size"]
    wanted = dict(kv.split("=") for kv in args.gguf.split(","))
    out: dict[str, Any] = {"shape": shape, "model_dir": str(model_dir), "llama_cpp": llamacpp_version()}
    for ftype in [f for f in wanted.get(shape, "").split("+") if f]:
        t0 = time.perf_counter()
        path = quantize_gguf(bf16, model_dir / f"model-{ftype}.gguf", ftype, threads=2)
        entry: dict[str, Any] = {"gguf": str(path), "gguf_bytes": path.stat().st_size,
                                 "quantize_s": time.perf_counter() - t0, "rounds": {}}  # fmt: skip
        for threads in [int(t) for t in args.threads.split(",")]:
            rows = []
            for r in range(args.rounds):
                row: dict[str, Any] = {"round": r, "threads": threads, "load_avg_1m": os.getloadavg()[0],
                                       "mem_available_gib": round(_mem_available_gib(), 1),
                                       "idle": round(cpu_idle(0.5), 2)}  # fmt: skip
                mine = {"glassbox_model": str(model_dir), "glassbox_quantization": args.glassbox_quantization} if (
                    args.glassbox_quantization) else {"glassbox_model": str(path)}  # fmt: skip
                work = {"gguf": str(path), **mine, "no_amx": args.llamacpp_no_amx,
                        "prompt_tokens": args.prompt_tokens,
                        "decode_tokens": args.decode_tokens, "burst_tokens": args.burst_tokens,
                        "bursts": _prompts(args.bursts, args.prompt_tokens, 1000 + 10 * r, vocab),
                        "aggregates": {}}  # fmt: skip
                row.update(run_worker("glassbox", model_dir, work, threads))
                print(json.dumps({shape: {ftype: row}}), flush=True)
                rows.append(row)
            ratios = [x["glassbox_over_llama_cpp_b1"] for x in rows if "glassbox_over_llama_cpp_b1" in x]
            entry["rounds"][f"threads={threads}"] = rows
            entry[f"median_ratio_threads={threads}"] = statistics.median(ratios) if ratios else None
            for engine in ("glassbox", "llama_cpp"):
                tok_s = [x[f"{engine}_b1_tok_s"] for x in rows if f"{engine}_b1_tok_s" in x]
                entry[f"median_{engine}_b1_tok_s_threads={threads}"] = (
                    statistics.median(tok_s) if tok_s else None
                )
        out[ftype] = entry
    return out


# ---------------------------------------------------------------------------------------- main


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0] if __doc__ else None)
    ap.add_argument("--shapes", default=",".join(MOE_SHAPES))
    ap.add_argument("--layers", default="qwen3-30b-a3b=4,gpt-oss-20b=2", help="SHAPE=N,...")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--threads", default="2,1", help="comma list: each round runs every engine at each")
    ap.add_argument("--prompt-tokens", type=int, default=32)
    ap.add_argument("--bursts", type=int, default=4, help="paired batch-1 bursts per round")
    ap.add_argument("--burst-tokens", type=int, default=16)
    ap.add_argument("--decode-tokens", type=int, default=64, help="transformers batch-1, the aggregates")
    ap.add_argument("--batches", default="8,32", help="aggregate decode at these numbers of sequences")
    ap.add_argument("--skip-hf", action="store_true", help="no transformers")
    ap.add_argument("--tiny", action="store_true", help="smoke test: small dims instead of the real ones")
    ap.add_argument("--gguf", default="", help="SHAPE=FTYPE+FTYPE,...: glassbox loads the same quantized GGUF "
                    "llama.cpp runs (llama.cpp's quantizer, e.g. qwen3-30b-a3b=Q4_K_M+Q4_0,gpt-oss-20b=MXFP4_MOE); "
                    "batch-1 bursts only")  # fmt: skip
    ap.add_argument("--glassbox-quantization", default=None, help="with --gguf: glassbox loads the bf16 "
                    "checkpoint with this --quantization (int4: Q4_0's rounding) instead of the GGUF file")  # fmt: skip
    ap.add_argument(
        "--llamacpp-no-amx",
        action="store_true",
        help="keep ggml off its AMX kernels (SIGILL where a VM lists AMX without enabling it)",
    )
    ap.add_argument("--out", type=Path, default=None)
    ap.add_argument("--worker", nargs=2, default=None, help=argparse.SUPPRESS)
    ap.add_argument("--shape-worker", default=None, help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.worker is not None:  # ENGINE MODEL_DIR; the work (prompts, sizes) on stdin
        torch.set_num_threads(int(args.threads))
        fn = glassbox_worker if args.worker[0] == "glassbox" else hf_worker
        print(json.dumps(fn(Path(args.worker[1]), json.loads(sys.stdin.read()), int(args.threads))))
        return 0
    layers = {k: int(v) for k, v in (kv.split("=") for kv in args.layers.split(","))}
    if args.shape_worker is not None:  # one shape in its own process: its memory is gone after it
        res = measure_shape(args.shape_worker, layers[args.shape_worker], args)
        Path(os.environ["MOE_COMPARE_OUT"]).write_text(json.dumps(res))
        return 0
    from glassbox.perf.hardware import cpu_name

    result: dict[str, Any] = {
        "date": time.strftime("%Y-%m-%d %H:%M"),
        "command": " ".join([os.path.basename(sys.executable), *sys.argv]),
        "machine": {
            "cpu": cpu_name(),
            "cores": os.cpu_count(),
            "ram_gib": round(os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES") / GIB, 1),
            "shared": "yes: other jobs ran on the same 2 cores and RAM throughout",
            "python": platform.python_version(),
            "torch": torch.__version__,
        },
        "threads": args.threads,
        "prompt_tokens": args.prompt_tokens,
        "bursts": args.bursts,
        "burst_tokens": args.burst_tokens,
        "decode_tokens": args.decode_tokens,
        "shapes": {},
    }
    for shape in [s for s in args.shapes.split(",") if s]:
        out = Path(f"/tmp/moe-compare-{os.getpid()}-{shape}.json")
        cmd = [sys.executable, __file__, *sys.argv[1:], "--shape-worker", shape]
        p = subprocess.run(cmd, env={**os.environ, "MOE_COMPARE_OUT": str(out)})
        result["shapes"][shape] = (
            json.loads(out.read_text()) if p.returncode == 0 else {"error": f"exit {p.returncode}"}
        )
    path = args.out or RESULTS / f"moe-compare-{time.strftime('%Y-%m-%d')}.json"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(result, indent=2) + "\n")
    print(f"wrote {path}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
