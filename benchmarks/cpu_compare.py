"""CPU speed, side by side on the same machine and the same random Qwen3-0.6B-shaped bf16 weights.

glassbox vs Hugging Face transformers (and llama.cpp through llama-cpp-python when it is installed):
batch-1 prefill (128- and 1024-token prompts) and decode, and aggregate throughput at batch 16 and 64,
each also as a fraction of this machine's roofline from `glassbox hardware --probe`. glassbox runs three
ways: as shipped (its C kernels around oneDNN GEMMs), with `--quantization int8`, and with the PyTorch ops in
place of its C kernels (GLASSBOX_CPU_KERNELS=torch), so one run shows what the kernels buy. Batch-1 decode
runs last, every engine in turns for five rounds (medians reported), so that all of that row saw the same
machine: this shared machine's speed drifts by half within minutes.

    .venv/bin/python benchmarks/cpu_compare.py            # writes benchmarks/results/cpu-<date>.json
"""

from __future__ import annotations

import argparse
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
from bench_models import qwen3_0_6b_random  # noqa: E402

from glassbox.perf.hardware import cpu_name  # noqa: E402

RESULTS = Path(__file__).resolve().parent / "results"
REPEATS = 3  # prefill figures: median of this many runs
PEERS = ("glassbox", "glassbox int8", "glassbox torch-ops", "transformers", "llama.cpp")


def _prompts(n: int, length: int, seed: int) -> list[list[int]]:
    g = torch.Generator().manual_seed(seed)
    return [torch.randint(2, 150000, (length,), generator=g).tolist() for _ in range(n)]


def _median_of(out: dict[str, Any], name: str, runs: list[float]) -> None:
    """The median as the figure, every run beside it (the machine is shared: single runs swing ~30%)."""
    out[f"{name}_tok_s"] = statistics.median(runs)
    out[f"{name}_runs"] = [round(r, 2) for r in runs]


Decoder = Callable[[list[int]], float]  # one batch-1 decode of a 128-token prompt -> tok/s


def bench_glassbox(
    model_dir: Path, batches: list[int], decode_tokens: int, kernels: str = "native", **engine: Any
) -> tuple[dict[str, Any], Decoder]:
    from glassbox import LLM, SamplingParams

    os.environ["GLASSBOX_CPU_KERNELS"] = kernels  # "torch": the PyTorch-ops reference path, for contrast
    # a KV cache sized to the workload (16-token blocks), not to free memory: several engines stay loaded
    # at once for the batch-1 decode rounds
    blocks = max(max(batches, default=1) * -(-(128 + decode_tokens) // 16), -(-(1024 + 16) // 16)) + 16
    llm = LLM(
        str(model_dir),
        dtype="bfloat16",
        max_num_seqs=max(batches, default=1),
        enable_prefix_caching=False,
        num_kv_blocks=blocks,
        **engine,
    )
    os.environ.pop("GLASSBOX_CPU_KERNELS")
    one = SamplingParams(temperature=0, max_tokens=1, ignore_eos=True)
    llm.generate(_prompts(1, 32, 99), SamplingParams(temperature=0, max_tokens=4, ignore_eos=True))  # warm-up
    out: dict[str, Any] = {"cpu_kernels": llm.engine.executor.attn_backend}
    for length in (128, 1024):
        rates = []
        for rep in range(REPEATS):  # fresh prompts each time (no prefix-cache hits); median of the runs
            m = llm.generate(_prompts(1, length, length + rep), one)[0].metrics
            assert m is not None
            rates.append(m.prefill_tok_s)
        out[f"prefill_{length}_tok_s"] = statistics.median(rates)
    decode = SamplingParams(temperature=0, max_tokens=decode_tokens, ignore_eos=True)

    def decode_b1(prompt: list[int]) -> float:
        m = llm.generate([prompt], decode)[0].metrics
        assert m is not None
        return m.decode_tok_s

    for b in batches:
        prompts = _prompts(b, 128, 1000 + b)
        t0 = time.perf_counter()
        res = llm.generate(prompts, SamplingParams(temperature=0, max_tokens=decode_tokens, ignore_eos=True))
        dt = time.perf_counter() - t0
        out[f"batch{b}_tok_s"] = sum(len(r.token_ids) for r in res) / dt
    return out, decode_b1


def bench_hf(model_dir: Path, batches: list[int], decode_tokens: int) -> tuple[dict[str, Any], Decoder]:
    import transformers as tf

    model = tf.AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.bfloat16)
    model.eval()
    out: dict[str, Any] = {}

    def gen(prompts: list[list[int]], n: int) -> float:
        ids = torch.tensor(prompts)
        t0 = time.perf_counter()
        with torch.inference_mode():
            model.generate(
                ids,
                attention_mask=torch.ones_like(ids),
                max_new_tokens=n,
                min_new_tokens=n,
                do_sample=False,
                pad_token_id=0,
            )
        return time.perf_counter() - t0

    gen(_prompts(1, 32, 99), 4)  # warm-up
    for length in (128, 1024):
        out[f"prefill_{length}_tok_s"] = statistics.median(
            length / gen(_prompts(1, length, length + rep), 1) for rep in range(REPEATS)
        )

    def decode_b1(prompt: list[int]) -> float:
        t_first = gen([prompt], 1)
        return (decode_tokens - 1) / (gen([prompt], decode_tokens) - t_first)

    for b in batches:
        dt = gen(_prompts(b, 128, 1000 + b), decode_tokens)
        out[f"batch{b}_tok_s"] = b * decode_tokens / dt
    return out, decode_b1


def bench_llamacpp(
    model_dir: Path, decode_tokens: int, threads: int
) -> tuple[dict[str, Any], Decoder | None]:
    try:
        from gguf_export import export_gguf
        from llamacpp_peer import llamacpp_version, measure_llamacpp, measure_llamacpp_prefill
    except ImportError as e:
        return {"error": f"llama.cpp peer unavailable: {e}"}, None
    gguf = model_dir / "model-bf16.gguf"
    if not gguf.is_file():
        export_gguf(model_dir, gguf)
    out: dict[str, Any] = {}
    for length in (128, 1024):
        out[f"prefill_{length}_tok_s"] = statistics.median(
            measure_llamacpp_prefill(gguf, length, threads) for _ in range(REPEATS)
        )
    out["version"] = llamacpp_version()

    def decode_b1(prompt: list[int]) -> float:
        return float(measure_llamacpp(gguf, prompt, decode_tokens, threads)["decode_tok_s"])

    return out, decode_b1


def decode_in_turns(decoders: dict[str, Decoder], rounds: int = 5) -> dict[str, list[float]]:
    """Batch-1 decode of every engine in turns, ``rounds`` times over (A B C ... A B C ...), each round on a
    fresh 128-token prompt: on a shared machine whose speed drifts, engines compared within a round saw
    the same machine, which separate medians taken minutes apart do not."""
    runs: dict[str, list[float]] = {name: [] for name in decoders}
    for i in range(rounds):
        prompt = _prompts(1, 128, 500 + i)[0]
        for name, decode in decoders.items():
            runs[name].append(decode(prompt))
    return runs


def roofline(model_dir: Path) -> dict[str, Any]:
    from glassbox.models.config_reader import facts_from_dir
    from glassbox.perf.probe import probe_local

    hw = probe_local("cpu", "bf16", force=True)  # measured now, beside the engines, not an old cache
    facts = facts_from_dir(model_dir)
    weight_bytes = facts.total_params * 2  # bf16, tied embedding read once (as the LM head)
    kv = facts.kv_bytes_per_token(2.0) * (128 + 32)
    return {
        "bandwidth_gbs": hw.bandwidth_gbs,
        "bf16_tflops": hw.peak_flops("bf16") / 1e12,
        "decode_bytes_per_token": weight_bytes + kv,
        "decode_ceiling_tok_s": hw.bandwidth_bytes_s / (weight_bytes + kv),
        # a prompt token runs every matmul but the LM head (logits only for the last token)
        "prefill_ceiling_tok_s": hw.peak_flops("bf16")
        / (2 * (facts.total_params - facts.vocab_size * facts.hidden_size)),
        "probe": hw.source,
    }


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0] if __doc__ else None)
    ap.add_argument("--batches", default="16,64")
    ap.add_argument("--decode-tokens", type=int, default=64)
    ap.add_argument("--threads", type=int, default=torch.get_num_threads())
    ap.add_argument("--skip", default="", help="comma list of peers to skip: hf,llamacpp")
    ap.add_argument("--out", type=Path, default=None)
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    batches = [int(b) for b in args.batches.split(",") if b]
    skip = set(args.skip.split(","))
    model_dir = qwen3_0_6b_random()
    result: dict[str, Any] = {
        "date": time.strftime("%Y-%m-%d"),
        "machine": {
            "cpu": cpu_name(),
            "cores": torch.get_num_threads(),
            "platform": platform.platform(),
            "torch": torch.__version__,
            "capability": torch.backends.cpu.get_cpu_capability(),
        },
        "model": "Qwen3-0.6B-shaped, random weights, bfloat16",
        "workload": {"decode_prompt_tokens": 128, "decode_tokens": args.decode_tokens, "batches": batches},
        "roofline": roofline(model_dir),
    }
    decoders: dict[str, Decoder] = {}
    result["glassbox"], decoders["glassbox"] = bench_glassbox(model_dir, batches, args.decode_tokens)
    # weight-only int8 (--quantization int8): batch 1 only
    result["glassbox int8"], decoders["glassbox int8"] = bench_glassbox(
        model_dir, [], args.decode_tokens, quantization="int8"
    )
    # the same engine with the PyTorch ops in place of glassbox's C kernels: what the kernels buy
    result["glassbox torch-ops"], decoders["glassbox torch-ops"] = bench_glassbox(
        model_dir, batches, args.decode_tokens, kernels="torch"
    )
    if "hf" not in skip:
        result["transformers"], decoders["transformers"] = bench_hf(model_dir, batches, args.decode_tokens)
    if "llamacpp" not in skip:
        result["llama.cpp"], llama_decode = bench_llamacpp(model_dir, args.decode_tokens, args.threads)
        if llama_decode is not None:
            decoders["llama.cpp"] = llama_decode
    runs = decode_in_turns(decoders)
    for name, rates in runs.items():
        _median_of(result[name], "decode_b1", rates)
    if "llama.cpp" in runs:
        ratios = [a / b for a, b in zip(runs["glassbox"], runs["llama.cpp"], strict=True)]
        result["decode_b1_paired"] = {
            "ratio_per_round": [round(r, 3) for r in ratios],
            "median_ratio": statistics.median(ratios),
        }
    from glassbox.perf.probe import measure_read_bandwidth

    # the machine drifts: the read probe again at the end shows by how much during this run
    result["roofline"]["read_gbs_at_end"] = measure_read_bandwidth("cpu")
    rf = result["roofline"]
    for peer in PEERS:
        r = result.get(peer)
        if r and "decode_b1_tok_s" in r:
            r["decode_b1_roofline_fraction"] = r["decode_b1_tok_s"] / rf["decode_ceiling_tok_s"]
            r["prefill_1024_roofline_fraction"] = r["prefill_1024_tok_s"] / rf["prefill_ceiling_tok_s"]
    out = args.out or RESULTS / f"cpu-{result['date']}.json"
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(result, indent=2) + "\n")
    print_table(result)
    print(f"wrote {out}")
    return 0


def print_table(result: dict[str, Any]) -> None:
    keys = ["prefill_128_tok_s", "prefill_1024_tok_s", "decode_b1_tok_s"] + [
        f"batch{b}_tok_s" for b in result["workload"]["batches"]
    ]
    peers = [p for p in PEERS if isinstance(result.get(p), dict)]
    print(f"{'figure':22s}" + "".join(f"{p:>19s}" for p in peers))
    for k in keys:
        row = []
        for p in peers:
            v = result[p].get(k)
            row.append(f"{v:19.1f}" if isinstance(v, (int, float)) else f"{'-':>19s}")
        print(f"{k:22s}" + "".join(row))
    pair = result.get("decode_b1_paired")
    if pair:
        print(
            f"batch-1 decode, glassbox / llama.cpp within each round: median {pair['median_ratio']:.2f} "
            f"(rounds {', '.join(f'{r:.2f}' for r in pair['ratio_per_round'])})"
        )
    rf = result["roofline"]
    print(
        f"roofline (probed at the start): decode {rf['decode_ceiling_tok_s']:.1f} tok/s "
        f"({rf['bandwidth_gbs']:.1f} GB/s; read probe at the end {rf.get('read_gbs_at_end', 0):.1f} GB/s), "
        f"prefill {rf['prefill_ceiling_tok_s']:.0f} tok/s ({rf['bf16_tflops']:.2f} TFLOP/s bf16)"
    )


if __name__ == "__main__":
    sys.exit(main())
