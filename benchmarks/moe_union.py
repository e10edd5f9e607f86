"""Batched MoE decode on this CPU against the planner's expected union of experts.

A random Qwen3-MoE-shaped model (Qwen3-30B-A3B's routing: 128 experts, top-8, renormalized; narrower
matrices and few layers so that a batch of 16 decodes in seconds on a shared 2-core machine) decodes B
sequences together, B = 1, 4, 16. For each decode step of all B rows the engine's own counters
(models/moe.py ``experts_read``: every expert a forward ran, once per forward and layer) give the experts
read per layer, held against perf/cost_model.expected_distinct_experts(E, k, B) = E (1 - (1 - k/E)^B)
(uniform, independent picks). Random router weights on random prompts route close to uniformly, so this
checks the union's arithmetic and the engine's grouped path (each chosen expert read once a step however
many rows chose it), not real routing (a trained router concentrates; benchmarks/results/planner-fit-*.md
holds the union against llama-batched-bench). Each step's time, in CPU time and wall time, is held against
the cost model's step for the same batch on a probe taken in the same run (perf/cpu_clock.py).

    PYTHONPATH=src python benchmarks/moe_union.py [--batches 1,4,16] [--steps 24] [--out FILE.json]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))
from bench_models import moe_random  # noqa: E402

from glassbox.perf.cpu_clock import loadavg as load  # noqa: E402
from glassbox.perf.cpu_clock import probe  # noqa: E402

RESULTS = Path(__file__).resolve().parent / "results"
# Qwen3-30B-A3B's experts and routing (bench_models.QWEN3_30B_A3B); hidden 1024 and width 256 instead of
# 2048 and 768, 4 layers of 48: one expert is 0.79 M weights, a layer's 128 experts 201 MB in bf16.
SHAPE = dict(
    hidden_size=1024,
    moe_intermediate_size=256,
    num_attention_heads=16,
    num_key_value_heads=4,
    head_dim=64,
    vocab_size=1024,
    tie_word_embeddings=True,
)
LAYERS, PROMPT = 4, 32


def run_batch(model: str, batch: int, steps: int, seed: int) -> dict[str, Any]:
    """Decode ``batch`` sequences ``steps`` tokens each; per all-decode step: experts read per layer, time."""
    import torch

    from glassbox import LLM, SamplingParams
    from glassbox.models.moe import MoEExperts

    llm = LLM(model, enable_prefix_caching=False, max_num_seqs=batch, max_num_batched_tokens=4096, seed=seed)
    eng = llm.engine
    blocks = [m for m in eng.executor.model.modules() if isinstance(m, MoEExperts)]
    g = torch.Generator().manual_seed(seed)
    params = SamplingParams(temperature=1.0, max_tokens=steps, ignore_eos=True)  # sampled: rows apart
    for i in range(batch):
        eng.add_request(f"r{i}", torch.randint(3, 1000, (PROMPT,), generator=g).tolist(), params)
    per_step: list[dict[str, float]] = []
    while eng.has_unfinished_requests():
        before = sum(m.experts_read for m in blocks)
        n_rec = len(eng.step_records)
        w0, c0 = time.perf_counter(), time.process_time()
        eng.step()
        wall, cpu = time.perf_counter() - w0, time.process_time() - c0
        recs = list(eng.step_records)[n_rec:]  # (a deque far from its 100,000-record bound here)
        if (
            len(recs) == 1
            and recs[0].phase == "decode"
            and recs[0].num_decode_tokens == batch * recs[0].passes
        ):
            per_step.append(
                {
                    "experts_per_layer": (sum(m.experts_read for m in blocks) - before)
                    / len(blocks)
                    / recs[0].passes,
                    "step_s": recs[0].duration_s / recs[0].passes,
                    "step_cpu_s": recs[0].duration_s / recs[0].passes * cpu / wall,
                }
            )
    return {
        "batch": batch,
        "decode_steps": len(per_step),
        "experts_per_layer": statistics.mean(s["experts_per_layer"] for s in per_step),
        "experts_per_layer_min": min(s["experts_per_layer"] for s in per_step),
        "experts_per_layer_max": max(s["experts_per_layer"] for s in per_step),
        "step_s": statistics.median(s["step_s"] for s in per_step),
        "step_cpu_s": statistics.median(s["step_cpu_s"] for s in per_step),
        "context": PROMPT + steps // 2,
    }


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--batches", default="1,4,16")
    ap.add_argument("--steps", type=int, default=24)
    ap.add_argument("--out", default="")
    ap.add_argument("--report", default="", help="print the markdown table of an earlier run's JSON and exit")
    args = ap.parse_args()
    if args.report:
        sys.stdout.write(report(json.loads(Path(args.report).read_text())))
        return 0
    os.environ["GLASSBOX_NUM_THREADS"] = "1"
    import torch

    torch.set_num_threads(1)
    from glassbox.perf.hardware import cpu_name

    model = moe_random("qwen3-30b-a3b", LAYERS, **SHAPE)  # type: ignore[arg-type]
    runs = []
    for b in (int(x) for x in args.batches.split(",")):
        p = probe()
        t0 = time.time()
        row = {**run_batch(str(model), b, args.steps, seed=b), "probe": p, "load_after": load()}
        row["wall_s"] = round(time.time() - t0, 1)
        runs.append(row)
        print(json.dumps(row), flush=True)
    result = {
        "date": time.strftime("%Y-%m-%d %H:%M"),
        "machine": f"{cpu_name()}, {os.cpu_count()} CPUs shared with other jobs; 1 engine thread",
        "model": {"path": str(model), "shape": "qwen3-30b-a3b", "layers": LAYERS, **SHAPE},
        "runs": runs,
    }
    out = Path(args.out) if args.out else RESULTS / f"moe-union-{time.strftime('%Y-%m-%d')}.json"
    out.write_text(json.dumps(result, indent=2) + "\n")
    print(report(result))
    print(f"wrote {out}")
    return 0


def report(result: dict[str, Any]) -> str:
    """Markdown: experts read per layer and step vs the uniform union, and each step's time vs the plan
    (glassbox-cpu on the run's own probe, CPU time and wall time)."""
    from glassbox.perf.cost_model import expected_distinct_experts, step_cost
    from glassbox.perf.cpu_clock import spec
    from glassbox.perf.engine_profiles import PROFILES
    from glassbox.perf.model_presets import load_model_facts
    from glassbox.perf.quant import resolve_scheme

    facts = load_model_facts(result["model"]["path"])
    scheme = resolve_scheme("native", facts.native_quant, facts.dtype, False, None)
    eng = PROFILES["glassbox-cpu"]
    lines = [
        "| B | experts read / layer / step (min-max) | uniform union E(1-(1-k/E)^B) | error | step ms CPU: measured / plan | "
        "wall: measured / plan | load | probe read GB/s (CPU) |",
        "|---:|---|---:|---:|---|---|---:|---:|",
    ]
    for r in result["runs"]:
        b = r["batch"]
        want = expected_distinct_experts(facts.num_experts, facts.experts_per_token, b)
        plan = {
            c: step_cost(facts, scheme, spec([r["probe"]], c), eng, [(1, r["context"])] * b).seconds
            for c in ("cpu", "wall")
        }
        lines.append(
            f"| {b} | {r['experts_per_layer']:.2f} ({r['experts_per_layer_min']:.2f}-{r['experts_per_layer_max']:.2f}) "
            f"| {want:.2f} | {r['experts_per_layer'] / want - 1:+.1%} | {r['step_cpu_s'] * 1e3:.1f} / {plan['cpu'] * 1e3:.1f} "
            f"| {r['step_s'] * 1e3:.1f} / {plan['wall'] * 1e3:.1f} | {r['probe']['load']:.1f} | {r['probe']['read_gbs_cpu']:.1f} |"
        )
    return "\n".join(lines) + "\n"


if __name__ == "__main__":
    sys.exit(main())
