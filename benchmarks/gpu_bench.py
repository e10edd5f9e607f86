"""GPU benchmark: glassbox vs transformers on one CUDA device, dummy weights of real model shapes.

(a) batch-1 decode, Llama-3.1-8B shape, bf16: tok/s, bytes read per token, a copy-probe bandwidth and
    the roofline fraction, with transformers (static cache; compiled with --hf-compile) beside it; the
    same in 4-bit blocks (--quantization int4: Q4_0's layout, 4.5 bits a weight, on the Triton kernels),
    and those kernels alone (part block_kernels: each 8B linear shape at 1 and 16 rows, bf16 beside it);
(b) throughput, Qwen3-0.6B shape: N requests, prompt and output lengths uniform in [100, 1024],
    ignore_eos, glassbox vs transformers (padded batches sorted by length; continuous batching too);
    (part gb_throughput_sync: glassbox again without async output, to see what the overlap buys);
(c) TTFT of an 8K-token prompt on the 8B shape.
Each part runs in its own process (clean GPU memory). Writes <out>/gpu-<date>.json.

    PYTHONPATH=src python3 benchmarks/gpu_bench.py [--out benchmarks/results] [--hf-requests 256]
"""

from __future__ import annotations

import argparse
import dataclasses
import datetime
import functools
import itertools
import json
import os
import random
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import torch

LLAMA_8B: dict[str, Any] = {
    "architectures": ["LlamaForCausalLM"], "model_type": "llama", "hidden_size": 4096,
    "intermediate_size": 14336, "num_hidden_layers": 32, "num_attention_heads": 32,
    "num_key_value_heads": 8, "head_dim": 128, "vocab_size": 128256, "rms_norm_eps": 1e-5,
    "max_position_embeddings": 131072, "rope_theta": 500000.0, "tie_word_embeddings": False,
    "rope_scaling": {"factor": 8.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0,
                     "original_max_position_embeddings": 8192, "rope_type": "llama3"},
    "attention_bias": False, "mlp_bias": False, "hidden_act": "silu", "torch_dtype": "bfloat16",
    "bos_token_id": 1, "eos_token_id": 2,
}  # fmt: skip
QWEN3_06B: dict[str, Any] = {
    "architectures": ["Qwen3ForCausalLM"], "model_type": "qwen3", "hidden_size": 1024,
    "intermediate_size": 3072, "num_hidden_layers": 28, "num_attention_heads": 16,
    "num_key_value_heads": 8, "head_dim": 128, "vocab_size": 151936, "rms_norm_eps": 1e-6,
    "max_position_embeddings": 40960, "rope_theta": 1000000.0, "tie_word_embeddings": True,
    "attention_bias": False, "hidden_act": "silu", "torch_dtype": "bfloat16",
    "use_sliding_window": False, "sliding_window": None, "bos_token_id": 1, "eos_token_id": 2,
}  # fmt: skip
SHAPES = {"llama-3.1-8b": LLAMA_8B, "qwen3-0.6b": QWEN3_06B}
# --smoke: the same script on the CPU with tiny shapes and lengths, to check its plumbing anywhere
SMOKE = os.environ.get("GLASSBOX_BENCH_SMOKE") == "1"
DEVICE = "cpu" if SMOKE else "cuda"
TINY = dict(hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4,
            num_key_value_heads=2, head_dim=16, vocab_size=1000)  # fmt: skip
LENGTHS = (8, 24) if SMOKE else (100, 1024)
TTFT_TOKENS = 256 if SMOKE else 8192


def model_dir(root: Path, name: str) -> Path:
    """config.json of the shape plus a word-level tokenizer covering the whole vocabulary."""
    from tokenizers import Tokenizer, models, pre_tokenizers

    cfg = {**SHAPES[name], **(TINY if SMOKE else {})}
    out = root / name
    if (out / "tokenizer.json").is_file():
        return out
    out.mkdir(parents=True, exist_ok=True)
    (out / "config.json").write_text(json.dumps(cfg))
    tok = Tokenizer(models.WordLevel({f"t{i}": i for i in range(cfg["vocab_size"])}, unk_token="t0"))
    tok.pre_tokenizer = pre_tokenizers.WhitespaceSplit()  # type: ignore[assignment]
    tok.save(str(out / "tokenizer.json"))
    (out / "tokenizer_config.json").write_text("{}")
    (out / "generation_config.json").write_text(json.dumps({"eos_token_id": cfg["eos_token_id"]}))
    return out


def sync_time() -> float:
    if torch.cuda.is_available():
        torch.cuda.synchronize()
    return time.perf_counter()


def cuda_ms(fn: Any, iters: int) -> float:
    """Median milliseconds of ``fn`` over ``iters`` runs, timed with CUDA events after a warm-up."""
    fn()
    times = []
    for _ in range(iters):
        a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        a.record()
        fn()
        b.record()
        b.synchronize()
        times.append(a.elapsed_time(b))
    return statistics.median(times)


def l2_copies(first: Any, nbytes: int, make: Any) -> list[Any]:
    """``first`` and enough more made by ``make()`` that a round over them reads 4x the L2 (``nbytes`` each),
    so that each call reads device memory, not what the previous call left in the cache."""
    l2 = torch.cuda.get_device_properties(0).L2_cache_size
    return [first] + [make() for _ in range(max(0, -(-4 * l2 // nbytes) - 1))]


def graph_ms(fn: Any, calls: int = 20) -> float:
    """Median milliseconds of one ``fn`` on the device alone: ``calls`` of them captured in a CUDA graph
    whose replays are timed (events around a single eager call also time the host's launch, which bounds
    small kernels: ~45 us for cuBLAS, ~130 us for a Triton launch on an H100 machine)."""
    s = torch.cuda.Stream()
    s.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(s):
        for _ in range(calls):  # warm-up: compiles, and the allocator's pool for the capture
            fn()
    torch.cuda.current_stream().wait_stream(s)
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        for _ in range(calls):
            fn()
    return cuda_ms(g.replay, 20) / calls


def workload(n: int, vocab: int, seed: int = 0) -> list[tuple[list[int], int]]:
    """``n`` (prompt ids, output length) pairs; both lengths uniform in LENGTHS ([100, 1024])."""
    rng = random.Random(seed)
    reqs = []
    for _ in range(n):
        p, o = rng.randint(*LENGTHS), rng.randint(*LENGTHS)
        reqs.append(([rng.randrange(10, vocab) for _ in range(p)], o))
    return reqs


# -- parts (each runs in a fresh process) ------------------------------------------------------------
def part_probe(args: argparse.Namespace) -> dict[str, Any]:
    n = 1 << 30  # 2 GiB of bf16 each way
    src = torch.randn(n, device="cuda", dtype=torch.bfloat16)
    dst = torch.empty_like(src)
    copy_ms = cuda_ms(lambda: dst.copy_(src), 20)
    read_ms = cuda_ms(lambda: src.sum(), 20)
    a = torch.randn(8192, 8192, device="cuda", dtype=torch.bfloat16)
    mm_ms = cuda_ms(lambda: a @ a, 10)
    return {
        "copy_GBps": 2 * src.nbytes / copy_ms / 1e6,  # bytes read + bytes written
        "read_GBps": src.nbytes / read_ms / 1e6,
        "bf16_matmul_TFLOPs": 2 * 8192**3 / mm_ms / 1e9,
    }


def engine_for(name: str, root: Path, **kw: Any) -> Any:
    from glassbox import LLM

    return LLM(str(model_dir(root, name)), load_format="dummy", dtype="bfloat16", device=DEVICE, **kw)


def part_gb_decode(args: argparse.Namespace, quantization: str | None = None) -> dict[str, Any]:
    from glassbox import SamplingParams
    from glassbox.quant.blocks.linear import BlockQuantEmbedding

    root = Path(args.models)
    t0 = time.perf_counter()
    llm = engine_for(
        "llama-3.1-8b", root, max_model_len=16384, max_num_seqs=16, enforce_eager=args.eager,
        quantization=quantization,
    )  # fmt: skip
    load_s = time.perf_counter() - t0
    ex = llm.engine.executor
    rng = random.Random(1)
    vocab = llm.engine.model_config.vocab_size
    prompt = [rng.randrange(10, vocab) for _ in range(args.prompt_len)]
    sp = SamplingParams(temperature=0, max_tokens=args.decode_tokens, ignore_eos=True)
    llm.generate([prompt], SamplingParams(temperature=0, max_tokens=8, ignore_eos=True))  # warm-up
    llm.engine.step_records.clear()
    out = llm.generate([prompt], sp)[0]
    m = out.metrics
    assert m is not None
    steps = [r.duration_s / r.passes for r in llm.engine.step_records if r.phase == "decode"]  # per pass
    mc = llm.engine.model_config
    table = ex.model.get_submodule("model.embed_tokens")
    emb = table.w.nbytes if isinstance(table, BlockQuantEmbedding) else mc.vocab_size * mc.hidden_size * 2
    weights_read = ex.weight_bytes - (0 if mc.tie_word_embeddings else emb)  # one embedding row is read
    ctx_mean = args.prompt_len + args.decode_tokens / 2
    bytes_per_token = weights_read + llm.engine.facts.kv_bytes_per_token(ex.kv_dtype.itemsize) * ctx_mean
    res: dict[str, Any] = {
        "quantization": quantization,
        "block_formats": ex.block_formats,
        "load_s": load_s,
        "tok_s": m.decode_tok_s,
        "step_ms_median": 1e3 * statistics.median(steps),
        "bytes_per_token": bytes_per_token,
        "weight_bytes": ex.weight_bytes,
        "kv_cache_gib": ex.kv_plan.gib,
        "kv_blocks": ex.kv_plan.num_blocks,
        "graphs": None if ex.graphs is None else len(ex.graphs.sizes),
        "compiled": ex.compiled,
        "attention": ex.attn_backend,
        "prompt_len": args.prompt_len,
        "decode_tokens": args.decode_tokens,
    }
    if ex.graphs is not None:  # GPU time of one batch-1 decode forward alone (graph replay)
        g = ex.graphs.graphs[1]
        res["graph_replay_ms"] = cuda_ms(g.replay, 50)
        hidden = ex.graphs.outputs[1]

        def logits() -> None:  # as the engine runs it: in inference mode, on the graph's output
            with torch.inference_mode():
                ex.model.compute_logits(hidden).argmax(-1)

        res["logits_ms"] = cuda_ms(logits, 50)
    if torch.cuda.is_available():
        res["mem_reserved_gib"] = torch.cuda.memory_reserved() / 2**30
        res["mem_total_gib"] = torch.cuda.get_device_properties(0).total_memory / 2**30
    if not args.eager:
        long_prompt = [rng.randrange(10, vocab) for _ in range(TTFT_TOKENS)]
        one = SamplingParams(temperature=0, max_tokens=1, ignore_eos=True)
        llm.generate([long_prompt[: TTFT_TOKENS // 8]], one)  # warm-up of the prefill kernels
        ttfts = []
        for i in range(3):
            t = sync_time()
            llm.generate([[i + 3, *long_prompt[1:]]], one)  # a fresh first token: no prefix-cache hit
            ttfts.append(sync_time() - t)
        res["ttft_8k_s"] = min(ttfts)
        res["ttft_prompt_tokens"] = TTFT_TOKENS
        res["ttft_8k_all_s"] = ttfts
        # more cells for the planner's fit and its held-out checks: shorter prompts' TTFT, and decode
        # steps at batch 16 (max_num_seqs) over the same 128-token prompts
        # (each prompt its own first token, so that no prompt finds another's blocks in the prefix cache; on
        # 2026-11-26 the 4K prompts began with the 1K ones' tokens and found 1024 of them cached)
        for j, n in enumerate((TTFT_TOKENS // 8, TTFT_TOKENS // 2)):
            times = []
            for i in range(2):
                t = sync_time()
                llm.generate([[10 * j + i + 7, *long_prompt[1:n]]], one)
                times.append(sync_time() - t)
            res[f"ttft_{n}_s"] = min(times)
        res["ttft_cached_tokens"] = 0
        batch = [[i + 11, *prompt[1:]] for i in range(16)]
        llm.engine.step_records.clear()
        llm.generate(batch, SamplingParams(temperature=0, max_tokens=64, ignore_eos=True))
        recs = llm.engine.step_records
        full = [r.duration_s / r.passes for r in recs if r.phase == "decode" and r.batch_size == 16]
        res["decode_b16_step_ms_median"] = 1e3 * statistics.median(full) if full else None
        res["decode_b16_steps"] = len(full)
    return res


def _hf_model(name: str, root: Path) -> Any:
    import transformers as tf

    cfg = tf.AutoConfig.from_pretrained(model_dir(root, name))
    with torch.device(DEVICE):
        model = tf.AutoModelForCausalLM.from_config(cfg, dtype=torch.bfloat16)
    model.eval()
    model.generation_config.pad_token_id = 0
    return model


def part_hf_decode(args: argparse.Namespace) -> dict[str, Any]:
    model = _hf_model("llama-3.1-8b", Path(args.models))
    rng = random.Random(1)
    vocab = model.config.vocab_size
    ids = torch.tensor([[rng.randrange(10, vocab) for _ in range(args.prompt_len)]], device=DEVICE)
    res: dict[str, Any] = {}
    variants = [("static", True)] + ([("static_compiled", False)] if args.hf_compile else [])
    for label, no_compile in variants:
        kw = dict(do_sample=False, cache_implementation="static", disable_compile=no_compile)

        def gen(n: int, kw: dict[str, Any] = kw) -> float:
            t = sync_time()
            with torch.inference_mode():
                model.generate(ids, max_new_tokens=n, min_new_tokens=n, **kw)
            return sync_time() - t

        t = time.perf_counter()
        gen(args.decode_tokens)  # warm-up (compiles, when compiling)
        warm_s = time.perf_counter() - t
        first = min(gen(1) for _ in range(2))
        total = gen(args.decode_tokens)
        res[label] = {"tok_s": (args.decode_tokens - 1) / (total - first), "warmup_s": warm_s}
    res["tok_s"] = max(v["tok_s"] for v in res.values() if isinstance(v, dict))
    return res


def part_gb_throughput(args: argparse.Namespace, async_output: bool | None = None) -> dict[str, Any]:
    from glassbox import SamplingParams

    root = Path(args.models)
    t0 = time.perf_counter()
    llm = engine_for("qwen3-0.6b", root, max_model_len=4096, max_num_seqs=256, async_output=async_output)
    load_s = time.perf_counter() - t0
    reqs = workload(args.requests, llm.engine.model_config.vocab_size)
    llm.generate([reqs[0][0]], SamplingParams(temperature=0, max_tokens=4, ignore_eos=True))  # warm-up
    eng = llm.engine
    eng.step_records.clear()
    params = [SamplingParams(temperature=0, max_tokens=o, ignore_eos=True) for _, o in reqs]
    t = sync_time()
    outs = llm.generate([p for p, _ in reqs], params)
    wall = sync_time() - t
    out_tokens = sum(len(o.token_ids) for o in outs)
    recs = list(eng.step_records)
    dec = [r for r in recs if r.phase == "decode"]
    return {
        "load_s": load_s,
        "wall_s": wall,
        "tok_s": out_tokens / wall,
        "total_tok_s": (out_tokens + sum(len(p) for p, _ in reqs)) / wall,
        "requests": len(reqs),
        "output_tokens": out_tokens,
        "prompt_tokens": sum(len(p) for p, _ in reqs),
        "steps": len(recs),
        "execute_s": sum(r.duration_s for r in recs),
        "prefill_or_mixed_execute_s": sum(r.duration_s for r in recs if r.phase != "decode"),
        "decode_execute_s": sum(r.duration_s for r in dec),
        "decode_step_ms_median": 1e3 * statistics.median(r.duration_s for r in dec) if dec else None,
        "mean_decode_batch": statistics.mean(r.batch_size for r in dec) if dec else None,
        "host_outside_execute_s": sum(r.duration_s - r.execute_s for r in recs),
        "preemptions": eng.scheduler.num_preemptions,
        "kv_cache_gib": eng.executor.kv_plan.gib,
        "compiled": eng.executor.compiled,
        "async_output": eng.async_output,
    }


def part_hf_throughput(args: argparse.Namespace) -> dict[str, Any]:
    model = _hf_model("qwen3-0.6b", Path(args.models))
    reqs = workload(args.requests, model.config.vocab_size)
    sub = reqs[: args.hf_requests]
    # sorted by output length so that a batch's members stop together (least wasted decode steps)
    order = sorted(range(len(sub)), key=lambda i: sub[i][1])
    bsz = args.hf_batch
    done, useful = 0, 0
    t = sync_time()
    for b in range(0, len(order), bsz):
        chunk = [sub[i] for i in order[b : b + bsz]]
        width = max(len(p) for p, _ in chunk)
        ids = torch.zeros((len(chunk), width), dtype=torch.long)
        mask = torch.zeros_like(ids)
        for r, (p, _) in enumerate(chunk):
            ids[r, width - len(p) :] = torch.tensor(p)
            mask[r, width - len(p) :] = 1
        n = max(o for _, o in chunk)
        with torch.inference_mode():
            model.generate(
                ids.to(DEVICE),
                attention_mask=mask.to(DEVICE),
                max_new_tokens=n,
                min_new_tokens=n,
                do_sample=False,
            )
        done += len(chunk)
        useful += sum(o for _, o in chunk)
    wall = sync_time() - t
    return {
        "method": f"generate(), left-padded batches of {bsz} sorted by output length, sdpa, dynamic cache",
        "requests": len(sub),
        "output_tokens": useful,
        "wall_s": wall,
        "tok_s": useful / wall,
    }


def part_hf_cb(args: argparse.Namespace) -> dict[str, Any]:
    """transformers' continuous batching (generate_batch / paged attention), per-request lengths."""
    from transformers import GenerationConfig

    model = _hf_model("qwen3-0.6b", Path(args.models))
    reqs = workload(args.requests, model.config.vocab_size)[: args.hf_requests]
    gc = GenerationConfig(max_new_tokens=1024, do_sample=False, eos_token_id=None, pad_token_id=0)
    manager = model.init_continuous_batching(generation_config=gc)
    manager.start()
    t = sync_time()
    for i, (p, o) in enumerate(reqs):
        manager.add_request(p, request_id=f"r{i}", max_new_tokens=o)
    got: dict[str, int] = {}
    deadline = time.perf_counter() + args.hf_cb_timeout
    while len(got) < len(reqs) and time.perf_counter() < deadline:
        r = manager.get_result(timeout=1)
        if r is not None and r.is_finished():
            got[r.request_id] = len(r.generated_tokens)
    wall = sync_time() - t
    manager.stop(block=True, timeout=10)
    toks = sum(got.values())
    return {
        "method": "init_continuous_batching() manager, per-request max_new_tokens",
        "requests": len(reqs),
        "finished": len(got),
        "output_tokens": toks,
        "wall_s": wall,
        "tok_s": toks / wall,
    }


def part_kernels(args: argparse.Namespace) -> dict[str, Any]:
    """Triton kernels alone: decode bandwidth by batch, prefill vs SDPA flash at 8K."""
    import torch.nn.functional as F

    from glassbox.kernels import triton_attention as ta
    from glassbox.layers.attention import build_paged_prefill

    res: dict[str, Any] = {}
    hq, hk, d, bs = 32, 8, 128, 16

    l2 = torch.cuda.get_device_properties(0).L2_cache_size
    res["l2_bytes"] = l2

    def decode_case(batch: int, ctx: int, block_n: int | None = None) -> dict[str, float]:
        """Median of ``batch`` rows over ``ctx`` tokens each; the calls rotate among as many input sets
        (block tables over disjoint cache blocks, queries) as it takes to read 4x the L2 per round, so
        that a small case reads device memory, not the L2 the previous call filled."""
        per_set = 2 * batch * ctx * hk * d * 2  # K and V, bf16
        sets = max(1, -(-4 * l2 // per_set))
        n = batch * ctx // bs
        cache = torch.randn(2, sets * n + 1, bs, hk, d, device="cuda", dtype=torch.bfloat16)
        perm = torch.randperm(sets * n, device="cuda").int()
        tables = [perm[i * n : (i + 1) * n].view(batch, -1) for i in range(sets)]
        lens = torch.full((batch,), ctx, device="cuda", dtype=torch.int32)
        qs = [torch.randn(batch, hq, d, device="cuda", dtype=torch.bfloat16) for _ in range(sets)]
        out = torch.empty_like(qs[0])
        turn = itertools.cycle(range(sets))

        def run() -> None:
            i = next(turn)
            ta.decode_attention(
                qs[i], cache[0], cache[1], tables[i], lens, d**-0.5, None, out, block_n=block_n
            )

        ms = cuda_ms(run, 50)
        return {"us": 1e3 * ms, "GBps": per_set / ms / 1e6, "input_sets": sets}

    for batch, ctx in ((1, 1024), (1, 16384), (8, 1024), (64, 1024), (256, 1024)):
        res[f"decode_b{batch}_ctx{ctx}"] = decode_case(batch, ctx)
    # keys per tile: 64 (the default for 128 dims) compiles to 80 registers on sm_90, 32 to 64, 16 to 56
    # (tests/helpers/triton_aot.py); all without a spill. Which is fastest is a measurement.
    for block_n in (16, 32):
        for batch, ctx in ((1, 16384), (256, 1024)):
            res[f"decode_b{batch}_ctx{ctx}_block_n{block_n}"] = decode_case(batch, ctx, block_n)
    n = 8192
    nb = n // bs
    cache = torch.randn(2, nb, bs, hk, d, device="cuda", dtype=torch.bfloat16)
    q = torch.randn(n, hq, d, device="cuda", dtype=torch.bfloat16)
    flops = 4 * n * n * d * hq / 2
    pp = build_paged_prefill(
        [(0, n, list(range(nb)))], ta.prefill_block_m(d, cache.dtype, q.dtype, q.device), q.device
    )
    out = torch.empty_like(q)

    def tri() -> None:
        ta.prefill_attention(
            q, cache[0], cache[1], pp.block_tables, pp.tile_seq, pp.tile_m, pp.q_start, pp.q_len,
            pp.ctx, d**-0.5, None, out, pp.block_m,
        )  # fmt: skip

    ms = cuda_ms(tri, 10)
    res["prefill_triton_8k"] = {"ms": ms, "TFLOPs": flops / ms / 1e9}
    qs = q.transpose(0, 1)[None]
    ks = cache[0].reshape(n, hk, d).transpose(0, 1)[None]
    vs = cache[1].reshape(n, hk, d).transpose(0, 1)[None]
    for label, k_, v_, gqa in (
        ("sdpa_gqa", ks, vs, True),
        ("sdpa_expanded", ks.repeat_interleave(4, 1), vs.repeat_interleave(4, 1), False),
    ):
        ms = cuda_ms(lambda k_=k_, v_=v_, gqa=gqa: F.scaled_dot_product_attention(
            qs, k_, v_, is_causal=True, enable_gqa=gqa), 10)  # fmt: skip
        res[f"prefill_{label}_8k"] = {"ms": ms, "TFLOPs": flops / ms / 1e9}
    return res


def part_block_kernels(args: argparse.Namespace) -> dict[str, Any]:
    """The block-weight Triton kernels alone on Llama-3.1-8B's linear shapes (N, K), int4 (Q4_0's layout)
    and int8: microseconds and the weight bytes read per second at 1 row (the GEMV) and 16 (split-K), bf16
    ``F.linear`` beside them. The weights rotate among enough copies to read 4x the L2 per round."""
    import torch.nn.functional as F

    from glassbox.kernels.triton_block_linear import block_matmul
    from glassbox.quant.blocks.quantize import quantize

    if SMOKE:
        return {"skipped": "the Triton kernels need CUDA"}
    l2 = torch.cuda.get_device_properties(0).L2_cache_size
    res: dict[str, Any] = {"l2_bytes": l2}
    for n, k in ((6144, 4096), (4096, 4096), (28672, 4096), (4096, 14336), (128256, 4096)):
        dense = torch.randn(n, k, device="cuda", dtype=torch.bfloat16) * 0.02
        for bits in (4, 8):
            w = quantize(dense, bits)
            nbytes = w.nbytes
            copies = l2_copies(w, nbytes, functools.partial(quantize, dense, bits))
            for m in (1, 16):
                x = torch.randn(m, k, device="cuda", dtype=torch.bfloat16)
                turn = itertools.cycle(copies)

                def run(x: torch.Tensor = x, turn: Any = turn) -> None:
                    c = next(turn)
                    block_matmul(x, c.triton_args, None, True)

                ms = graph_ms(run, len(copies) * 4)
                res[f"int{bits}_{n}x{k}_m{m}"] = {"us": 1e3 * ms, "GBps": nbytes / ms / 1e6}
            del copies, w
        dense_copies = l2_copies(dense, dense.nbytes, dense.clone)
        for m in (1, 16):
            x = torch.randn(m, k, device="cuda", dtype=torch.bfloat16)
            dense_turn = itertools.cycle(dense_copies)
            ms = graph_ms(lambda x=x, t=dense_turn: F.linear(x, next(t)), len(dense_copies) * 4)
            res[f"bf16_{n}x{k}_m{m}"] = {"us": 1e3 * ms, "GBps": dense.nbytes / ms / 1e6}
        del dense, dense_copies
        torch.cuda.empty_cache()
    return res


def _random_kquant(kind: int, n: int, k: int) -> Any:
    """A K-quant weight in the Triton layout (quant/blocks/kquant_triton.py) of random valid bytes, on the device:
    Q4_K (kind 4) or Q6_K (6); codes, 6-bit or int8 sub-block scales, small float16 super-block scales."""
    from glassbox.quant.blocks.kquant_triton import TritonKQuant

    dev, nb, nsb = "cuda", k // 32, k // 256
    if kind == 6:
        codes = torch.randint(0, 64, (n, k), dtype=torch.uint8, device=dev)
        sub = torch.randint(-128, 128, (n, 2 * nb), dtype=torch.int8, device=dev)
        sup = (torch.rand(n, nsb, device=dev) * 1e-3).half()
        return TritonKQuant(codes, sub, None, sup, 6, k, "Q6_K")
    codes = torch.randint(0, 256, (n, k // 2), dtype=torch.uint8, device=dev)
    sub, mins = (torch.randint(0, 64, (n, nb), dtype=torch.uint8, device=dev) for _ in range(2))
    sup = (torch.rand(n, 2 * nsb, device=dev) * 1e-3).half()
    return TritonKQuant(codes, sub, mins, sup, 4, k, "Q4_K")


def part_kquant_kernels(args: argparse.Namespace) -> dict[str, Any]:
    """GGUF K-quants on the block kernels (Q4_K, Q6_K: quant/blocks/kquant_triton.py) on two of Llama-3.1-8B's
    shapes at 1 row (the GEMV) and 16 (split-K), bf16 ``F.linear`` beside them: microseconds, weight bytes
    read per second, and the relative error against the layout's PyTorch dequantization on the device
    (the embedding lookup's path). Weights rotate among copies that read 4x the L2 per round."""
    import torch.nn.functional as F

    from glassbox.kernels.triton_block_linear import block_matmul

    if SMOKE:
        return {"skipped": "the Triton kernels need CUDA"}
    res: dict[str, Any] = {}
    for n, k in ((4096, 4096), (28672, 4096)):
        for kind in (4, 6):
            w = _random_kquant(kind, n, k)
            ref_w = w.dequantize_reference(torch.float32)
            copies = l2_copies(w, w.nbytes, functools.partial(_random_kquant, kind, n, k))
            for m in (1, 16):
                x = torch.randn(m, k, device="cuda", dtype=torch.bfloat16)
                ref = F.linear(x.float(), ref_w)
                err = ((block_matmul(x, w.triton_args, None, True).float() - ref).norm() / ref.norm()).item()
                turn = itertools.cycle(copies)
                ms = graph_ms(
                    lambda x=x, t=turn: block_matmul(x, next(t).triton_args, None, True), len(copies) * 4
                )
                res[f"Q{kind}_K_{n}x{k}_m{m}"] = {"us": 1e3 * ms, "GBps": w.nbytes / ms / 1e6, "rel_err": err}
            del copies, w, ref_w
        dense = torch.randn(n, k, device="cuda", dtype=torch.bfloat16) * 0.02
        dense_copies = l2_copies(dense, dense.nbytes, dense.clone)
        for m in (1, 16):
            x = torch.randn(m, k, device="cuda", dtype=torch.bfloat16)
            ms = graph_ms(
                lambda x=x, t=itertools.cycle(dense_copies): F.linear(x, next(t)), len(dense_copies) * 4
            )
            res[f"bf16_{n}x{k}_m{m}"] = {"us": 1e3 * ms, "GBps": dense.nbytes / ms / 1e6}
        del dense, dense_copies
        torch.cuda.empty_cache()
    return res


def part_block_moe(args: argparse.Namespace) -> dict[str, Any]:
    """The fused MoE on experts in blocks (kernels/triton_block_moe.py) against the float one
    (kernels/triton_moe.py) in bf16 on Qwen3-30B-A3B's layer shape (128 experts, top 8, H 2048, I 768):
    Q4_K (random valid bytes) and int4 experts at 1, 16 and 256 tokens, each graph-timed over enough layer
    copies to read 4x the L2; the weight bytes the chosen experts hold per second, and the relative error
    against the float kernels on the layout's dequantized experts."""
    from glassbox.kernels.triton_block_moe import block_fused_moe
    from glassbox.kernels.triton_moe import fused_moe
    from glassbox.quant.blocks.quantize import quantize

    if SMOKE:
        return {"skipped": "the Triton kernels need CUDA"}
    e, top, h, i = 128, 8, 2048, 768
    res: dict[str, Any] = {"shape": {"experts": e, "top_k": top, "hidden": h, "inter": i}}
    w1f = torch.randn(e, 2 * i, h, device="cuda", dtype=torch.bfloat16) * 0.02
    w2f = torch.randn(e, h, i, device="cuda", dtype=torch.bfloat16) * 0.02
    layers = {
        "Q4_K": lambda: (_random_kquant(4, e * 2 * i, h), _random_kquant(4, e * h, i)),
        "int4": lambda: (quantize(w1f.reshape(-1, h), 4), quantize(w2f.reshape(-1, i), 4)),
    }
    for name, make in layers.items():
        first = make()
        per_expert = (first[0].nbytes + first[1].nbytes) / e
        copies = l2_copies(first, int(per_expert * e), make)
        ref1 = first[0].dequantize_reference(torch.bfloat16).view(e, 2 * i, h)
        ref2 = first[1].dequantize_reference(torch.bfloat16).view(e, h, i)
        for t in (1, 16, 256):
            x = torch.randn(t, h, device="cuda", dtype=torch.bfloat16)
            ids = torch.stack([torch.randperm(e, device="cuda")[:top] for _ in range(t)])
            wts = torch.rand(t, top, device="cuda", dtype=torch.bfloat16)
            args_ = [(a.triton_args, b.triton_args) for a, b in copies]
            ref = fused_moe(x, ids, wts, ref1, ref2).float()
            out = block_fused_moe(x, ids, wts, *args_[0], e).float()
            err = ((out - ref).norm() / ref.norm()).item()
            turn = itertools.cycle(args_)
            ms = graph_ms(
                lambda x=x, ids=ids, w=wts, t=turn: block_fused_moe(x, ids, w, *next(t), e), len(args_) * 2
            )
            chosen = int(torch.unique(ids).numel())
            res[f"{name}_t{t}"] = {"us": 1e3 * ms, "GBps": chosen * per_expert / ms / 1e6, "rel_err": err,
                                   "experts_read": chosen}  # fmt: skip
        del copies
        torch.cuda.empty_cache()
    for t in (1, 16, 256):  # the float kernels on bf16 experts, for scale
        x = torch.randn(t, h, device="cuda", dtype=torch.bfloat16)
        ids = torch.stack([torch.randperm(e, device="cuda")[:top] for _ in range(t)])
        wts = torch.rand(t, top, device="cuda", dtype=torch.bfloat16)
        ms = graph_ms(lambda x=x, ids=ids, w=wts: fused_moe(x, ids, w, w1f, w2f), 8)
        chosen = int(torch.unique(ids).numel())
        res[f"bf16_t{t}"] = {
            "us": 1e3 * ms,
            "GBps": chosen * 3 * h * i * 2 / ms / 1e6,
            "experts_read": chosen,
        }
    return res


def _tinygemm_case(w: Any, x: torch.Tensor, ref: torch.Tensor, copies: int) -> dict[str, Any]:
    """torch's int4 weight-only kernel (``_weight_int4pack_mm``, gpt-fast's tinygemm: (q - 8) scale + zero
    per group, bf16 scales) on the same 4-bit codes and scales (bf16-rounded), graph-timed over as many
    copies of the packed weight: what the library reaches on this GPU, for scale."""
    try:
        q = w.unpacked_codes()[:, : w.in_features].to(torch.int32)  # (N, K) 0..15, value order
        packed = ((q[:, ::2] << 4) | q[:, 1::2]).to(torch.uint8)
        scales = w._rows(w.tiled_scales)[:, : w.in_features // 32].float()  # (N, K/32)
        sz = (
            torch.stack([scales, torch.zeros_like(scales)], -1)
            .transpose(0, 1)
            .contiguous()
            .to(torch.bfloat16)
        )
        mats = [torch.ops.aten._convert_weight_to_int4pack(packed, 8) for _ in range(copies)]
        out = torch.ops.aten._weight_int4pack_mm(x, mats[0], 32, sz)
        err = ((out.float() - ref).norm() / ref.norm()).item()
        turn = itertools.cycle(mats)
        ms = graph_ms(lambda: torch.ops.aten._weight_int4pack_mm(x, next(turn), 32, sz), copies * 2)
        nbytes = packed.numel() + sz.numel() * 2
        return {"us": 1e3 * ms, "GBps": nbytes / ms / 1e6, "rel_err": err}
    except Exception as e:  # not in this build, or another layout than assumed: say so
        return {"error": f"{type(e).__name__}: {str(e)[:300]}"}


def part_gemv_sweep(args: argparse.Namespace) -> dict[str, Any]:
    """The one-row block GEMV's tiles (``GEMV_TILES``: rows per program, 64-byte vectors per step, warps,
    stages) swept on two of Llama-3.1-8B's shapes in int4 and int8, each timed in a CUDA graph over enough
    weight copies to read 4x the L2, and checked against the dequantized weight (relative error): which
    tiles to ship is a measurement (2026-11-26's were ~4x off the SASS estimate)."""
    import torch.nn.functional as F

    from glassbox.kernels import triton_block_linear as tbl
    from glassbox.quant.blocks.quantize import quantize

    if SMOKE:
        return {"skipped": "the Triton kernels need CUDA"}
    l2 = torch.cuda.get_device_properties(0).L2_cache_size
    res: dict[str, Any] = {"l2_bytes": l2, "shipped": dataclasses.asdict(tbl.GEMV_TILES)}
    shipped = tbl.GEMV_TILES
    grid = [(bn, v, w, 3) for bn in (16, 32, 64) for v in (1, 2, 4) for w in (2, 4, 8)]
    try:
        for n, k in ((4096, 4096), (28672, 4096)):
            dense = torch.randn(n, k, device="cuda", dtype=torch.bfloat16) * 0.02
            x = torch.randn(1, k, device="cuda", dtype=torch.bfloat16)
            for bits in (4, 8):
                w = quantize(dense, bits)
                ref = F.linear(x.float(), w.dequantize_reference(torch.float32))
                copies = l2_copies(w, w.nbytes, functools.partial(quantize, dense, bits))
                for bn, v, nw, st in grid:
                    tbl.GEMV_TILES = tbl.GemvTiles(bn, v, nw, st)
                    key = f"int{bits}_{n}x{k}_bn{bn}_v{v}_w{nw}_s{st}"
                    try:
                        out = tbl.block_matmul(x, w.triton_args, None, True)
                        err = ((out.float() - ref).norm() / ref.norm()).item()
                        turn = itertools.cycle(copies)

                        def run(turn: Any = turn, x: torch.Tensor = x, bits: int = bits) -> None:
                            c = next(turn)
                            tbl.block_matmul(x, c.triton_args, None, True)

                        ms = graph_ms(run, len(copies) * 2)
                        res[key] = {"us": 1e3 * ms, "GBps": w.nbytes / ms / 1e6, "rel_err": err}
                    except Exception as e:  # a tile that does not compile (registers, shared memory)
                        res[key] = {"error": f"{type(e).__name__}: {str(e)[:200]}"}
                if bits == 4:  # the library's int4 GEMM beside it: torch's tinygemm, the same codes
                    res[f"tinygemm_{n}x{k}"] = _tinygemm_case(w, x, ref, len(copies))
                del copies, w
            torch.cuda.empty_cache()
    finally:
        tbl.GEMV_TILES = shipped
    best: dict[str, Any] = {}
    for key, v in res.items():
        if isinstance(v, dict) and "us" in v and v["rel_err"] < 1e-2:
            shape = key.split("_bn")[0]
            if shape not in best or v["us"] < best[shape]["us"]:
                best[shape] = {"tiles": key.split(shape + "_")[1], **v}
    res["best"] = best
    return res


PARTS = {
    "probe": part_probe,
    "kernels": part_kernels,
    "block_kernels": part_block_kernels,
    "gemv_sweep": part_gemv_sweep,
    "kquant_kernels": part_kquant_kernels,
    "block_moe": part_block_moe,
    "gb_decode": part_gb_decode,
    "gb_decode_int4": lambda args: part_gb_decode(args, quantization="int4"),
    # --quantization fp8: per-channel E4M3 weights, the 8K prompt's rows W8A8 on FP8 tensor cores
    "gb_decode_fp8": lambda args: part_gb_decode(args, quantization="fp8"),
    # --quantization nvfp4: the linears in E2M1 with E4M3 half-block scales on the block kernels
    "gb_decode_nvfp4": lambda args: part_gb_decode(args, quantization="nvfp4"),
    "hf_decode": part_hf_decode,
    "gb_throughput": part_gb_throughput,
    # the same with each step's text work done in the step instead of during the next one
    "gb_throughput_sync": lambda args: part_gb_throughput(args, async_output=False),
    "hf_throughput": part_hf_throughput,
    "hf_cb": part_hf_cb,
}


def run_part(name: str, args: argparse.Namespace, extra: list[str], timeout: float) -> dict[str, Any]:
    cmd = [sys.executable, __file__, "--part", name, "--models", args.models, *extra, "--part-out"]
    return run_isolated(name, cmd, timeout)


def run_isolated(name: str, cmd: list[str], timeout: float) -> dict[str, Any]:
    """Run ``cmd`` + [a JSON path] in its own process (clean GPU memory); the dict it wrote there, or an
    error entry if it failed or timed out."""
    with tempfile.NamedTemporaryFile(suffix=".json", delete=False) as f:
        path = f.name
    cmd = [*cmd, path]
    t = time.perf_counter()
    try:
        proc = subprocess.run(cmd, timeout=timeout)
        ok = proc.returncode == 0
    except subprocess.TimeoutExpired:
        ok = False
    took = time.perf_counter() - t
    if ok:
        res: dict[str, Any] = json.loads(Path(path).read_text())
    else:
        res = {"error": f"part {name} failed or timed out after {took:.0f} s"}
    res["part_wall_s"] = took
    print(f"== {name} ({took:.0f} s): {json.dumps(res)[:1500]}", flush=True)
    return res


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", default="benchmarks/results")
    ap.add_argument(
        "--parts",
        default="probe,gb_decode,gb_decode_int4,block_kernels,hf_decode,gb_throughput,hf_throughput",
    )
    ap.add_argument("--models", default=str(Path(tempfile.gettempdir()) / "glassbox-bench-models"))
    ap.add_argument("--prompt-len", type=int, default=128)
    ap.add_argument("--decode-tokens", type=int, default=256)
    ap.add_argument("--requests", type=int, default=256)
    ap.add_argument("--hf-requests", type=int, default=256, help="HF runs the first N requests")
    ap.add_argument("--hf-batch", type=int, default=64)
    ap.add_argument("--hf-compile", action="store_true", help="also time HF's compiled static cache")
    ap.add_argument("--hf-cb-timeout", type=float, default=240)
    ap.add_argument("--eager", action="store_true", help="glassbox with enforce_eager (no CUDA graphs)")
    ap.add_argument("--part", help=argparse.SUPPRESS)
    ap.add_argument("--part-out", help=argparse.SUPPRESS)
    ap.add_argument("--timeout", type=float, default=400, help="seconds per part")
    ap.add_argument("--smoke", action="store_true", help="tiny shapes on the CPU: checks the script only")
    args = ap.parse_args()
    if args.smoke and not SMOKE:  # re-run with the flag in the environment (read at import, parts inherit it)
        os.environ["GLASSBOX_BENCH_SMOKE"] = "1"
        sys.exit(subprocess.call([sys.executable, __file__, *sys.argv[1:]]))
    if args.part:
        Path(args.part_out).write_text(json.dumps(PARTS[args.part](args)))
        return
    extra = [f"--prompt-len={args.prompt_len}", f"--decode-tokens={args.decode_tokens}",
             f"--requests={args.requests}", f"--hf-requests={args.hf_requests}",
             f"--hf-batch={args.hf_batch}", f"--hf-cb-timeout={args.hf_cb_timeout}"]  # fmt: skip
    extra += ["--hf-compile"] * args.hf_compile + ["--eager"] * args.eager
    parts: dict[str, dict[str, Any]] = {}
    for p in args.parts.split(","):  # the summary after each part: a run cut short keeps what it measured
        parts[p] = run_part(p, args, extra, args.timeout)
        write_summary(parts, args)


def write_summary(parts: dict[str, dict[str, Any]], args: argparse.Namespace) -> None:
    def get(part: str, key: str) -> Any:
        return parts.get(part, {}).get(key)

    bw = get("probe", "copy_GBps")
    dec = parts.get("gb_decode", {})
    bpt, tok_s = dec.get("bytes_per_token"), dec.get("tok_s")
    q4 = parts.get("gb_decode_int4", {})
    q4_bpt, q4_tok_s = q4.get("bytes_per_token"), q4.get("tok_s")
    gb_tp, hf_tp = get("gb_throughput", "tok_s"), get("hf_throughput", "tok_s")
    summary: dict[str, Any] = {
        "device": torch.cuda.get_device_name(0) if torch.cuda.is_available() else None,
        "torch": torch.__version__,
        "date": datetime.date.today().isoformat(),
        "command": " ".join(["benchmarks/gpu_bench.py", *sys.argv[1:]]),
        "smoke": SMOKE,
        "decode_b1": {
            "model": "Llama-3.1-8B shape, dummy weights, bf16",
            "tok_s": tok_s,
            "bytes_per_token": bpt,
            "bandwidth_GBps": bw,
            "roofline_tok_s": bw * 1e9 / bpt if bw and bpt else None,
            "roofline_fraction": tok_s * bpt / (bw * 1e9) if bw and bpt and tok_s else None,
            "hf_tok_s": get("hf_decode", "tok_s"),
        },
        "decode_b1_int4": {
            "model": "Llama-3.1-8B shape, dummy weights, --quantization int4 (Q4_0 layout), bf16 activations",
            "tok_s": q4_tok_s,
            "bytes_per_token": q4_bpt,
            "roofline_tok_s": bw * 1e9 / q4_bpt if bw and q4_bpt else None,
            "roofline_fraction": q4_tok_s * q4_bpt / (bw * 1e9) if bw and q4_bpt and q4_tok_s else None,
            "speedup_vs_bf16": q4_tok_s / tok_s if q4_tok_s and tok_s else None,
        },
        "throughput": {
            "model": "Qwen3-0.6B shape, dummy weights, bf16",
            "glassbox_tok_s": gb_tp,
            "hf_tok_s": hf_tp,
            "speedup": gb_tp / hf_tp if gb_tp and hf_tp else None,
            "requests": get("gb_throughput", "requests"),
            "output_tokens": get("gb_throughput", "output_tokens"),
            "hf_requests": get("hf_throughput", "requests"),
            "hf_note": "HF tok/s = its useful output tokens / its wall time on the first hf_requests requests",
        },
        "prefill": {"ttft_8k_s": dec.get("ttft_8k_s")},
        "parts": parts,
    }
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    path = out / f"gpu-{summary['date']}.json"
    path.write_text(json.dumps(summary, indent=2) + "\n")
    keys = ("device", "decode_b1", "decode_b1_int4", "throughput", "prefill")
    print(json.dumps({k: summary[k] for k in keys}, indent=1))
    print(f"wrote {path}")


if __name__ == "__main__":
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    main()
