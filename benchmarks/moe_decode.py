"""Batch-1 decode of a small random MoE against its dense equivalents, on the CPU in bf16 (rough).

Three random 8-layer models (hidden 512, 8 heads / 4 KV, tied embeddings, the shared test tokenizer):
Qwen3-MoE with 8 experts of width 512, top-2; a dense Qwen3 of width 1024 (the MoE's active FFN
parameters: 2 x 512); a dense Qwen3 of width 4096 (its total: 8 x 512). Each decodes 128 tokens after a
32-token prompt, the engines in turns for ``--rounds`` rounds; the median decode tok/s of each is kept.
Tiny matrices: the step is host overhead and GEMV calls more than bandwidth, so this measures the grouped
path's cost per layer (routing, sorting, two GEMVs per chosen expert), not an MoE's bandwidth advantage.

    PYTHONPATH=src GLASSBOX_NUM_THREADS=1 python benchmarks/moe_decode.py [--rounds 3] [--out FILE.json]
"""

from __future__ import annotations

import argparse
import json
import shutil
import statistics
import sys
import tempfile
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "tests" / "helpers"))

from tokenizer_factory import build_tokenizer_dir  # noqa: E402

from glassbox import LLM, SamplingParams  # noqa: E402


def _models(root: Path) -> dict[str, Path]:
    import transformers as tf

    tok = build_tokenizer_dir(root / "tokenizer")
    vocab = json.loads((tok / "tokenizer.json").read_text())
    base = dict(hidden_size=512, num_hidden_layers=8, num_attention_heads=8, num_key_value_heads=4,
                head_dim=64, vocab_size=len(vocab["model"]["vocab"]) + 64, max_position_embeddings=2048,
                tie_word_embeddings=True)  # fmt: skip
    configs = {
        "moe_8x512_top2": tf.Qwen3MoeConfig(
            **base, num_experts=8, num_experts_per_tok=2, moe_intermediate_size=512, norm_topk_prob=True
        ),
        "dense_1024_active_equal": tf.Qwen3Config(**base, intermediate_size=1024),
        "dense_4096_total_equal": tf.Qwen3Config(**base, intermediate_size=4096),
    }
    dirs = {}
    for name, cfg in configs.items():
        torch.manual_seed(0)
        d = root / name
        tf.AutoModelForCausalLM.from_config(cfg, dtype=torch.bfloat16).save_pretrained(d)
        for f in tok.iterdir():
            if not (d / f.name).exists():
                shutil.copy(f, d / f.name)
        dirs[name] = d
    return dirs


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--out", help="write the results here as JSON")
    args = ap.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        dirs = _models(Path(tmp))
        engines = {name: LLM(str(d), dtype="bfloat16", max_num_seqs=1) for name, d in dirs.items()}
        sp = SamplingParams(temperature=0, max_tokens=128, ignore_eos=True)
        for llm in engines.values():  # warm up
            llm.generate([[5, 6, 7]], SamplingParams(temperature=0, max_tokens=16, ignore_eos=True))
        runs: dict[str, list[float]] = {name: [] for name in engines}
        for _ in range(args.rounds):
            for name, llm in engines.items():
                metrics = llm.generate([list(range(10, 42))], sp)[0].metrics
                assert metrics is not None
                runs[name].append(metrics.decode_tok_s)
        res = {
            "threads": torch.get_num_threads(),
            "backend": {name: llm.engine.executor.attn_backend for name, llm in engines.items()},
            "weight_mib": {name: llm.engine.executor.weight_bytes / 2**20 for name, llm in engines.items()},
            "decode_tok_s_runs": runs,
            "decode_tok_s_median": {name: statistics.median(v) for name, v in runs.items()},
        }
    print(json.dumps(res, indent=2))
    if args.out:
        with open(args.out, "w") as f:
            json.dump(res, f, indent=2)


if __name__ == "__main__":
    main()
