"""Where a batch-1 MoE decode step's time goes in glassbox on the CPU (the model of benchmarks/moe_compare.py).

Timers (``time.perf_counter``; every CPU op here is synchronous) wrap, for decode steps only: the whole
forward, the linears by kind (attention q/k/v and o, the routed experts' gate_up and down, the LM head),
the router (gate linear + softmax/top-k), the logits (the LM head), the grouped experts' bookkeeping (sort, counts to the host,
gather, weighting, scatter-add: the grouped path minus its experts), each expert's activation, and the
C attention kernels. What the forward leaves over is the remaining Python and small ops (norm kernels,
embedding); what the step leaves over the forward and the logits is the engine (scheduling, sampling,
outputs). Each
weight group's bytes over its time gives the bandwidth it ran at, against the read-bandwidth probe.

    PYTHONPATH=src GLASSBOX_NUM_THREADS=2 .venv/bin/python benchmarks/moe_profile.py qwen3-30b-a3b --layers 4
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from collections import defaultdict
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
from bench_models import moe_random  # noqa: E402

from glassbox import LLM, SamplingParams  # noqa: E402
from glassbox.kernels import cpu_ops  # noqa: E402
from glassbox.models import llama_native, moe  # noqa: E402
from glassbox.models.llama import LlamaForCausalLM  # noqa: E402
from glassbox.perf.probe import measure_read_bandwidth  # noqa: E402
from glassbox.quant.dense.bf16_tiles import TiledBf16Linear  # noqa: E402
from glassbox.quant.dense.onednn import PackedLinear  # noqa: E402

SPENT: dict[str, float] = defaultdict(float)
CALLS: dict[str, int] = defaultdict(int)
ACTIVE = [False]  # timing only inside decode forwards
KINDS: dict[int, str] = {}  # id(a packed linear) -> what it is (label_linears)
DECODE = [False]  # the last forward was a batch-1 decode step (its logits are timed too)


def _timed(label: Callable[[Any], str], fn: Callable[..., Any]) -> Callable[..., Any]:
    def wrapper(self: Any, *a: Any, **k: Any) -> Any:
        if not ACTIVE[0]:
            return fn(self, *a, **k)
        t0 = time.perf_counter()
        out = fn(self, *a, **k)
        name = label(self)
        SPENT[name] += time.perf_counter() - t0
        CALLS[name] += 1
        return out

    return wrapper


def install() -> None:
    """Wrap the classes' methods (before the engine binds them)."""
    fwd = llama_native.NativeForward.__call__

    def forward(self: Any, input_ids: torch.Tensor, *a: Any) -> Any:
        ACTIVE[0] = DECODE[0] = input_ids.shape[0] == 1  # a batch-1 decode step
        try:
            return _timed(lambda _: "forward", fwd)(self, input_ids, *a)
        finally:
            ACTIVE[0] = False

    llama_native.NativeForward.__call__ = forward  # type: ignore[method-assign, assignment]
    logits = LlamaForCausalLM.compute_logits

    def compute_logits(self: Any, hidden: torch.Tensor) -> torch.Tensor:
        ACTIVE[0] = DECODE[0]
        try:
            return _timed(lambda _: "logits", logits)(self, hidden)  # type: ignore[no-any-return]
        finally:
            ACTIVE[0] = False

    LlamaForCausalLM.compute_logits = compute_logits  # type: ignore[method-assign]
    PackedLinear.forward = _timed(lambda s: KINDS.get(id(s), "linear other"), PackedLinear.forward)  # type: ignore[method-assign]
    tiled = _timed(lambda s: KINDS.get(id(s), "linear other"), TiledBf16Linear.forward)
    TiledBf16Linear.forward = tiled  # type: ignore[method-assign]
    moe.SparseMoeBlock.routing = _timed(lambda _: "router", moe.SparseMoeBlock.routing)  # type: ignore[method-assign]
    moe.MoEExperts.grouped = _timed(lambda _: "experts grouped", moe.MoEExperts.grouped)  # type: ignore[method-assign]
    moe.MoEExperts._expert = _timed(lambda _: "experts one", moe.MoEExperts._expert)  # type: ignore[method-assign]
    cpu_ops.PagedAttention.decode = _timed(lambda _: "attention decode (C)", cpu_ops.PagedAttention.decode)  # type: ignore[method-assign]
    store = _timed(lambda _: "rope + cache write (C)", cpu_ops.PagedAttention.rope_store)
    cpu_ops.PagedAttention.rope_store = store  # type: ignore[method-assign]


def label_linears(model: torch.nn.Module) -> dict[str, int]:
    """Name each packed linear's kind; the bytes each kind holds."""
    held: dict[str, int] = defaultdict(int)
    for name, mod in model.named_modules():
        if isinstance(mod, PackedLinear | TiledBf16Linear):  # oneDNN's layout or glassbox's tiles
            kind = (
                "lm_head"
                if name == "lm_head"
                else "linear attention"
                if "self_attn" in name
                else "linear other"
            )
            KINDS[id(mod)] = kind
            held[kind] += mod.nbytes
        if isinstance(mod, moe.MoEExperts):
            for gu, dn in mod.linears:
                KINDS[id(gu)], KINDS[id(dn)] = "expert gate_up", "expert down"
                held["expert gate_up"] += gu.nbytes
                held["expert down"] += dn.nbytes
    return held


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0] if __doc__ else None)
    ap.add_argument("shape")
    ap.add_argument("--layers", type=int, required=True)
    ap.add_argument("--steps", type=int, default=32)
    ap.add_argument("--prompt-tokens", type=int, default=32)
    args = ap.parse_args()
    install()
    model_dir = moe_random(args.shape, args.layers)
    cfg = json.loads((model_dir / "config.json").read_text())
    llm = LLM(str(model_dir), dtype="bfloat16", max_num_seqs=1, enable_prefix_caching=False, num_kv_blocks=32,
              max_model_len=512)  # fmt: skip
    held = label_linears(llm.engine.executor.model)
    vocab = cfg["vocab_size"]
    prompt = torch.randint(
        2, vocab, (args.prompt_tokens,), generator=torch.Generator().manual_seed(7)
    ).tolist()
    llm.generate([prompt[:8]], SamplingParams(temperature=0, max_tokens=8, ignore_eos=True))  # warm-up
    SPENT.clear()
    CALLS.clear()
    read_gbs = measure_read_bandwidth("cpu")
    m = llm.generate([prompt], SamplingParams(temperature=0, max_tokens=args.steps + 1, ignore_eos=True))[
        0
    ].metrics
    assert m is not None
    steps = CALLS["forward"]
    step_ms = 1e3 * m.decode_s / args.steps
    per = {k: 1e3 * v / steps for k, v in SPENT.items()}
    e = int(cfg.get("num_experts") or cfg["num_local_experts"])
    k = int(cfg["num_experts_per_tok"])
    # bytes a step reads per kind: all of the attention and LM head, k of E experts per layer
    read = {kind: b * (k / e if kind.startswith("expert") else 1) for kind, b in held.items()}
    rows = {
        "step (engine, decode_s / steps)": step_ms,
        "forward": per["forward"],
        "  linear attention (qkv, o)": per.get("linear attention", 0.0),
        "  rope + cache write (C)": per.get("rope + cache write (C)", 0.0),
        "  attention decode (C)": per.get("attention decode (C)", 0.0),
        "  router (gate linear, softmax, top-k)": per.get("router", 0.0),
        "  expert gate_up GEMVs": per.get("expert gate_up", 0.0),
        "  expert down GEMVs": per.get("expert down", 0.0),
        "  expert activation + call overhead": per.get("experts one", 0.0)
        - per.get("expert gate_up", 0.0)
        - per.get("expert down", 0.0),
        "  grouped bookkeeping (sort, counts, gather, scatter)": per.get("experts grouped", 0.0)
        - per.get("experts one", 0.0),
    }
    named = sum(v for key, v in rows.items() if key.startswith("  "))
    rows["  the rest of the forward (norms, embedding, Python)"] = per["forward"] - named
    rows["logits (the LM head GEMV, to float32)"] = per.get("logits", 0.0)
    rows["  of which the LM head GEMV"] = per.get("lm_head", 0.0)
    rows["engine: the rest (schedule, sample, outputs)"] = step_ms - per["forward"] - per.get("logits", 0.0)
    bw = {
        kind: read[kind] / (per[kind] / 1e3) / 1e9
        for kind in ("expert gate_up", "expert down", "lm_head", "linear attention")
        if per.get(kind)
    }
    res = {
        "shape": args.shape,
        "layers": args.layers,
        "threads": torch.get_num_threads(),
        "decode_steps_timed": steps,
        "decode_tok_s": m.decode_tok_s,
        "read_gbs_probe": read_gbs,
        "ms_per_step": {key: round(v, 3) for key, v in rows.items()},
        "calls_per_step": {key: CALLS[key] / steps for key in CALLS},
        "bytes_read_per_step_mib": {kind: round(v / 2**20, 1) for kind, v in read.items()},
        "achieved_gbs": {kind: round(v, 2) for kind, v in bw.items()},
    }
    print(json.dumps(res, indent=2))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
