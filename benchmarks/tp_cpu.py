"""Tensor parallelism on this CPU: decode and prefill step time at TP=1 and TP=2 (gloo, local ranks) on a
random Llama-shaped model, and the share of rank 0's step spent inside the collectives (the all-reduces
after attention-out and MLP-down, the embedding's, the logits' all-gather), which includes waiting for the
slower rank. On a 2-core machine TP=2 is not expected to be faster: both ranks share the same cores.
``--quantization`` quantizes the model at load (each rank its shard); ``--gguf FILE`` runs a GGUF file
instead (e.g. SmolLM2-135M's Q4_1: 9 heads, so ``--tp 1,3``); ``--out`` writes the rows as JSON.

    PYTHONPATH=src GLASSBOX_NUM_THREADS=1 python benchmarks/tp_cpu.py [--hidden 1024 --layers 4]
    PYTHONPATH=src GLASSBOX_NUM_THREADS=1 python benchmarks/tp_cpu.py --gguf SmolLM2.Q4_1.gguf --tp 1,3
"""

from __future__ import annotations

import argparse
import json
import os
import tempfile
import time
from pathlib import Path

import torch


def build(root: Path, hidden: int, layers: int) -> Path:
    import transformers as tf

    sys_path = Path(__file__).resolve().parents[1] / "tests" / "helpers"
    import sys

    sys.path.insert(0, str(sys_path))
    from tokenizer_factory import build_tokenizer_dir

    tok = build_tokenizer_dir(root / "tokenizer")
    cfg = tf.LlamaConfig(
        vocab_size=512,
        hidden_size=hidden,
        intermediate_size=hidden * 3,
        num_hidden_layers=layers,
        num_attention_heads=hidden // 64,
        num_key_value_heads=hidden // 256,
        max_position_embeddings=4096,
    )
    out = root / "model"
    tf.AutoModelForCausalLM.from_config(cfg, dtype=torch.float32).save_pretrained(out)
    for f in tok.iterdir():
        if not (out / f.name).exists():
            (out / f.name).write_bytes(f.read_bytes())
    return out


def run(
    model: Path, tp: int, prompt: int, steps: int, dtype: str, quantization: str | None
) -> dict[str, float | int | str | None]:
    import glassbox.models.tensor_parallel as tpm
    from glassbox.engine import tp_runtime
    from glassbox.llm import LLM
    from glassbox.sampling_params import SamplingParams

    spent = [0.0]
    inner = tpm.all_reduce, tpm.all_gather_last

    def timed(fn):  # type: ignore[no-untyped-def]
        def wrapper(x: torch.Tensor) -> torch.Tensor:
            t0 = time.perf_counter()
            y = fn(x)
            spent[0] += time.perf_counter() - t0
            return y

        return wrapper

    tpm.all_reduce, tpm.all_gather_last = timed(inner[0]), timed(inner[1])
    try:
        llm = LLM(str(model), dtype=dtype, tensor_parallel_size=tp, quantization=quantization)
        params = SamplingParams(temperature=0, max_tokens=steps, ignore_eos=True)
        llm.generate([list(range(1, 17))], SamplingParams(temperature=0, max_tokens=4, ignore_eos=True))
        spent[0] = 0.0
        t0 = time.perf_counter()
        out = llm.generate([list(range(1, prompt + 1))], params)[0]
        total = time.perf_counter() - t0
        m = out.metrics
        assert m is not None
        return {
            "tp": tp,
            "dtype": dtype,
            "quantization": quantization,
            "rank_weight_mib": [round(b / 2**20, 2) for b in llm.engine.executor.rank_weight_bytes],
            "ttft_s": round(m.ttft_s, 4),
            "tpot_ms": round((m.e2e_s - m.ttft_s) / (steps - 1) * 1e3, 2),
            "collective_share": round(spent[0] / total, 3),
        }
    finally:
        tp_runtime.shutdown()
        tpm.all_reduce, tpm.all_gather_last = inner


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--hidden", type=int, default=1024)
    ap.add_argument("--layers", type=int, default=4)
    ap.add_argument("--prompt", type=int, default=256)
    ap.add_argument("--steps", type=int, default=32)
    ap.add_argument("--tp", default="1,2", help="comma-separated tensor-parallel sizes")
    ap.add_argument("--dtype", default="float32")
    ap.add_argument("--quantization", default=None, help="int8, int4, int4-asym or mxfp4")
    ap.add_argument("--gguf", type=Path, default=None, help="a GGUF file instead of the random model")
    ap.add_argument("--out", type=Path, default=None, help="write the rows (and the load) as JSON")
    a = ap.parse_args()
    rows = []
    with tempfile.TemporaryDirectory() as d:
        model = a.gguf or build(Path(d), a.hidden, a.layers)
        for tp in (int(t) for t in a.tp.split(",")):
            rows.append(run(model, tp, a.prompt, a.steps, a.dtype, a.quantization))
            print(rows[-1])
    if a.out is not None:
        shape = {"gguf": a.gguf.name} if a.gguf else {"hidden": a.hidden, "layers": a.layers}
        report = {
            "model": shape, "prompt": a.prompt, "steps": a.steps, "cpus": os.cpu_count(),
            "threads_per_rank": os.environ.get("GLASSBOX_NUM_THREADS"), "load_avg_after": os.getloadavg(),
            "rows": rows,
        }  # fmt: skip
        a.out.write_text(json.dumps(report, indent=1) + "\n")


if __name__ == "__main__":
    main()
