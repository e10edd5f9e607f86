"""Prefix-cache hit rate of a hybrid model on an agent's growing conversation (engine/state_checkpoints.py).

Each turn's prompt is the whole conversation so far (a system prompt with tool definitions, then every
user message and answer) plus a new user message; the engine (a tiny random Qwen3.5 built with
transformers, real scheduling and bookkeeping) answers it. Reports, per turn, the prompt tokens served
from the cache, with the tail checkpoint (kept at the end of each answer) and without it (only the prompt
checkpoint, vLLM's "align" mode keeps one per prompt), and the state memory the checkpoints cost.

    PYTHONPATH=src python benchmarks/hybrid_prefix_hits.py [--turns 8] [--system 2000] [--user 60] [--answer 200]
"""

from __future__ import annotations

import argparse
import json
import random
import tempfile
from pathlib import Path
from typing import Any

from glassbox import SamplingParams
from glassbox.config import EngineConfig
from glassbox.engine.llm_engine import LLMEngine
from glassbox.engine.state_checkpoints import StateCheckpoints
from glassbox.tokenizer import training


class PromptOnly(StateCheckpoints):
    """Checkpoints at prompt boundaries only (no tail), as vLLM's "align" mode keeps them."""

    def save(self, seq_id: int, slot: int, block_hash: int, tail: bool) -> None:
        if not tail:
            super().save(seq_id, slot, block_hash, tail)


def build_model(root: Path) -> Path:
    """A tiny Qwen3.5 (4 layers, 3 Gated DeltaNet + 1 attention) with a trained byte-level tokenizer."""
    import transformers as tf

    tok = training.train_bpe(training.iter_texts(training.stdlib_python_files(60)), 512)
    training.save_hf_tokenizer(tok, root)
    cfg = tf.Qwen3_5TextConfig(
        vocab_size=512, hidden_size=64, intermediate_size=96, num_hidden_layers=4, num_attention_heads=4,
        num_key_value_heads=2, head_dim=16, linear_num_key_heads=2, linear_num_value_heads=4,
        linear_key_head_dim=16, linear_value_head_dim=8, max_position_embeddings=8192,
    )  # fmt: skip
    tf.AutoModelForCausalLM.from_config(cfg).save_pretrained(root)
    return root


def conversation(engine: LLMEngine, args: argparse.Namespace) -> list[dict[str, Any]]:
    rng = random.Random(0)
    history = [rng.randrange(3, 500) for _ in range(args.system)]
    rows = []
    for turn in range(args.turns):
        prompt = history + [rng.randrange(3, 500) for _ in range(args.user)]
        params = SamplingParams(temperature=0, max_tokens=args.answer, ignore_eos=True)
        engine.add_request(f"t{turn}", prompt, params)
        out = None
        while engine.has_unfinished_requests():
            for o in engine.step():
                out = o if o.finished else out
            engine.check_integrity()
        assert out is not None and out.metrics is not None
        rows.append({"turn": turn, "prompt": len(prompt), "cached": out.metrics.cached_prompt_tokens})
        history = prompt + out.outputs[0].token_ids
    return rows


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--turns", type=int, default=8)
    ap.add_argument("--system", type=int, default=2000, help="system prompt + tool definitions, tokens")
    ap.add_argument("--user", type=int, default=60, help="each user message, tokens")
    ap.add_argument("--answer", type=int, default=200, help="each answer, tokens")
    ap.add_argument("--out", type=Path, default=None)
    args = ap.parse_args()
    results: dict[str, Any] = {"settings": vars(args) | {"out": None}}
    with tempfile.TemporaryDirectory() as tmp:
        d = build_model(Path(tmp))
        for mode in ("prompt+tail", "prompt only"):
            engine = LLMEngine(EngineConfig(model=str(d), dtype="float32", max_num_seqs=4))
            bm = engine.block_manager
            if mode == "prompt only":
                bm.checkpoints = PromptOnly(bm.num_state_slots, bm.num_checkpoints)
            rows = conversation(engine, args)
            prompt = sum(r["prompt"] for r in rows[1:])
            cached = sum(r["cached"] for r in rows[1:])
            results[mode] = {"turns": rows, "hit_rate_after_turn_0": round(cached / prompt, 4)}
            print(mode, json.dumps(results[mode]["hit_rate_after_turn_0"]), [r["cached"] for r in rows])
        plan = engine.executor.kv_plan
        results["state_memory"] = {
            "bytes_per_slot_with_checkpoints": plan.bytes_per_state,
            "slots": plan.num_state_slots,
            "checkpoint_rows": engine.block_manager.num_checkpoints,
        }
    print(json.dumps(results["state_memory"]))
    if args.out:
        args.out.write_text(json.dumps(results, indent=1) + "\n")


if __name__ == "__main__":
    main()
