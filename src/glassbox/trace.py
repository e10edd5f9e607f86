"""The anatomy of one request, phase by phase, held against this machine's roofline."""

from __future__ import annotations

import time
import uuid
from dataclasses import dataclass, replace
from typing import Any

from glassbox.anatomy import RequestMetrics
from glassbox.distributed import CollectiveTime, collective_time
from glassbox.dtypes import kv_element_bytes
from glassbox.engine.draft_model import DraftModelProposer
from glassbox.engine.llm_engine import LLMEngine
from glassbox.engine.state_inputs import STATE_BYTES
from glassbox.models.model_config import dtype_name
from glassbox.models.moe import MoEExperts
from glassbox.models.moe_triton import experts_read
from glassbox.outputs import RequestOutput
from glassbox.perf.cost_model import expected_distinct_experts
from glassbox.perf.hardware import HardwareSpec
from glassbox.perf.quant import resolve_scheme
from glassbox.perf.request_roofline import PROBE_WRONG, RequestRoofline
from glassbox.perf.simulator import percentile
from glassbox.sampling_params import SamplingParams


def run_trace(
    engine: LLMEngine,
    prompt: str,
    max_tokens: int,
    roofline: HardwareSpec | None,
    chat: bool = False,
    params: SamplingParams | None = None,
) -> dict[str, Any]:
    """Run one request alone through ``engine`` and return its anatomy (stable JSON-ready dict).

    ``roofline`` is a perf.hardware.HardwareSpec (probed) or None to skip the ceilings; ``chat`` sends
    the prompt as one user message through the model's chat template (timed as tokenization);
    ``params`` replaces the greedy ``max_tokens`` sampling.
    """
    rid = f"trace-{uuid.uuid4().hex[:8]}"
    params = params or SamplingParams(temperature=0.0, max_tokens=max_tokens)
    t0 = time.perf_counter()
    if chat:
        ids = engine.tokenizer.encode_chat([{"role": "user", "content": prompt}], add_generation_prompt=True)
    else:
        ids = engine.tokenizer.encode(prompt)
    engine.add_request(rid, ids, params, tokenize_s=time.perf_counter() - t0)
    proposer = engine.scheduler.proposer
    draft = proposer if isinstance(proposer, DraftModelProposer) else None  # what the draft model did
    draft_before = replace(draft.stats) if draft is not None else None
    run = _run_alone(engine, rid)
    m = run.final.metrics
    assert m is not None
    result: dict[str, Any] = {
        "model": engine.model_name,
        "device": str(engine.executor.device),
        "dtype": dtype_name(engine.executor.dtype),
        "weight_blocks": engine.executor.block_formats,  # formats kept in blocks ("Q4_1", "GPTQ int4 g128")
        "prompt": prompt,
        "chat_template": chat,
        "text": run.final.text,
        "output_tokens": m.output_tokens,
        "finish_reason": run.final.finish_reason,
        "phases": _phases(m),
        "kv_cache": _kv_cache(engine, run.growth, m),
        "e2e_ms": m.e2e_s * 1e3,
    }
    hybrid, bm = engine.facts.hybrid, engine.block_manager
    if hybrid is not None:  # a hybrid model's recurrent layers: a fixed state beside the growing KV
        result["recurrent_state"] = {
            "bytes": hybrid.state_bytes(STATE_BYTES, STATE_BYTES),
            "layers": hybrid.state_layers(),
            "dtype": "fp32",
            "checkpoints": bm.num_checkpoints if bm.checkpoints is not None else 0,
        }
    if engine.executor.tp is not None:
        result["tensor_parallel"] = {
            "ranks": engine.executor.tp.world,
            "rank_weight_bytes": engine.executor.rank_weight_bytes,
            **{ph: t.to_dict() for ph, t in run.tp.items()},
        }
    if run.experts:
        prefill_tokens = m.prompt_tokens - m.cached_prompt_tokens
        decode_tokens = max(0, m.output_tokens - 1)
        result["moe"] = _moe_reads(engine, run.experts, run.reads, prefill_tokens, decode_tokens)
    spec = engine.config.speculative
    if spec is not None:  # speculative decoding: what the drafts bought this request
        result["speculative"] = _speculative(spec.to_dict(), m, draft, draft_before)
    if roofline is not None:
        _add_roofline(result, engine, roofline, m)
    return result


@dataclass
class TraceRun:
    """What stepping one request alone recorded: its final output, the KV cache's growth (step, tokens,
    blocks, bytes), the expert weights each phase read, rank 0's collectives per phase."""

    final: RequestOutput
    growth: list[dict[str, int]]
    experts: list[MoEExperts]
    reads: dict[str, int]
    tp: dict[str, TPPhase]


def _run_alone(engine: LLMEngine, rid: str) -> TraceRun:
    """Step the engine until request ``rid`` finishes, recording per step what the anatomy reports."""
    seq = engine.get_sequences(rid)[0]
    per_block = engine.executor.kv_plan.bytes_per_block
    growth: list[dict[str, int]] = []
    final = None
    step = 0
    experts = [m for m in engine.executor.model.modules() if isinstance(m, MoEExperts)]
    # expert weight reads (over all MoE layers) by the steps of each phase: experts run, bytes read
    reads = {"prefill": 0, "decode": 0, "prefill_bytes": 0, "decode_bytes": 0}
    tp = {ph: TPPhase() for ph in ("prefill", "decode")}  # tensor parallelism: rank 0's collectives
    while final is None:
        phase = "decode" if seq.num_output_tokens else "prefill"
        before = [experts_read(m) for m in experts]
        c0, t_step = collective_time(), time.perf_counter()
        outs = engine.step()
        tp[phase].add(time.perf_counter() - t_step, c0, collective_time())
        for block, (count, nbytes) in zip(experts, before, strict=True):
            now = experts_read(block)
            reads[phase] += now[0] - count
            reads[f"{phase}_bytes"] += now[1] - nbytes
        step += 1
        if not seq.is_finished and (not growth or growth[-1]["blocks"] != len(seq.block_table)):
            growth.append(
                {
                    "step": step,
                    "tokens": seq.num_computed_tokens,
                    "blocks": len(seq.block_table),
                    "bytes": len(seq.block_table) * per_block,
                }
            )
        final = next((o for o in outs if o.request_id == rid and o.finished), None)
    return TraceRun(final, growth, experts, reads, tp)


def _phases(m: RequestMetrics) -> dict[str, Any]:
    """The anatomy's phases: tokenize, queue, prefill, first token, decode (with its ITLs), detokenize."""
    itl = [b - a for a, b in zip(m.token_times, m.token_times[1:], strict=False)]
    return {
        "tokenize": {"tokens": m.prompt_tokens, "ms": m.tokenize_s * 1e3},
        "queue": {"ms": m.queue_s * 1e3},
        "prefill": {
            "tokens": m.prompt_tokens - m.cached_prompt_tokens,
            "cached_tokens": m.cached_prompt_tokens,
            "ms": m.prefill_s * 1e3,
            "tok_s": m.prefill_tok_s,
        },
        "first_token": {"ttft_ms": m.ttft_s * 1e3},
        "decode": {
            "tokens": max(0, m.output_tokens - 1),
            "ms": m.decode_s * 1e3,
            "tok_s": m.decode_tok_s,
            "itl_ms_p50": (percentile(itl, 0.5) if itl else 0.0) * 1e3,
            "itl_ms_p99": (percentile(itl, 0.99) if itl else 0.0) * 1e3,
            # engine steps the decode took: fewer than its tokens when greedy bursts (engine/bursts.py)
            # or accepted drafts gave several tokens a step (their ITLs are 0)
            "steps": sum(1 for gap in itl if gap > 0),
        },
        "detokenize": {"ms": m.detokenize_s * 1e3},
    }


def _kv_cache(engine: LLMEngine, growth: list[dict[str, int]], m: RequestMetrics) -> dict[str, Any]:
    """The request's KV cache: its blocks and bytes at the end and how it grew."""
    bs, per_block = engine.block_manager.block_size, engine.executor.kv_plan.bytes_per_block
    if not growth:  # ended in its first step (an immediate EOS), whose blocks were freed with it
        cached = m.prompt_tokens + m.output_tokens - 1  # the last token's K/V is never written
        blocks = -(-cached // bs)
        growth.append({"step": 1, "tokens": cached, "blocks": blocks, "bytes": blocks * per_block})
    return {
        "dtype": dtype_name(engine.executor.kv_dtype),
        "block_size": bs,
        "blocks": growth[-1]["blocks"],
        "bytes": growth[-1]["bytes"],
        "growth": growth,
    }


def _speculative(
    config: dict[str, Any], m: RequestMetrics, draft: DraftModelProposer | None, before: Any
) -> dict[str, Any]:
    """What speculative decoding bought the request: its verify steps, drafts and acceptance, and the
    draft model's own passes while it ran."""
    out = {
        **config,
        "verify_steps": m.spec_drafts,
        "draft_tokens": m.spec_draft_tokens,
        "accepted_tokens": m.spec_accepted_tokens,
        "acceptance_rate": m.spec_acceptance_rate,
        "mean_acceptance_length": m.spec_mean_acceptance_length,
    }
    if draft is not None and before is not None:
        ds = draft.stats
        out["draft_passes"] = ds.passes - before.passes
        out["draft_rows"] = ds.rows - before.rows
        out["draft_ms"] = (ds.seconds - before.seconds) * 1e3
    return out


@dataclass
class TPPhase:
    """A phase's engine steps on rank 0 and the part of them inside collectives (waiting for the other
    ranks included): the forward's all-reduces / all-gathers, and the step broadcasts to the workers."""

    step_s: float = 0.0
    collective_s: float = 0.0
    collectives: int = 0
    broadcast_s: float = 0.0

    def add(self, step_s: float, before: CollectiveTime, after: CollectiveTime) -> None:
        self.step_s += step_s
        self.collective_s += after.seconds - before.seconds
        self.collectives += after.count - before.count
        self.broadcast_s += after.broadcast_s - before.broadcast_s

    def to_dict(self) -> dict[str, float | int]:
        share = (self.collective_s + self.broadcast_s) / self.step_s if self.step_s else 0.0
        return {"step_ms": self.step_s * 1e3, "collective_ms": self.collective_s * 1e3,
                "collectives": self.collectives, "broadcast_ms": self.broadcast_s * 1e3, "share": share}  # fmt: skip


def _moe_reads(
    engine: LLMEngine,
    experts: list[MoEExperts],
    reads: dict[str, int],
    prefill_tokens: int,
    decode_tokens: int,
) -> dict[str, Any]:
    """The expert weights the request's steps actually read (each chosen expert once per step and layer, its
    bytes as held: a GGUF file's types, FP4, bf16), beside what the planner expects of uniform routing
    (perf/cost_model.expected_distinct_experts)."""
    facts, layers = engine.facts, len(experts)
    per_expert = sum(m.expert_bytes() for m in experts) // layers  # a layer's experts share their types
    decode_steps = max(1, decode_tokens)
    return {
        "layers": layers,
        "experts": facts.num_experts,
        "top_k": facts.experts_per_token,
        "expert_bytes": per_expert,
        "prefill": {
            "experts_read_per_layer": reads["prefill"] / layers,
            "expected_per_layer": expected_distinct_experts(
                facts.num_experts, facts.experts_per_token, prefill_tokens
            ),
            "bytes": reads["prefill_bytes"],
        },
        "decode": {
            "experts_read_per_layer_per_token": reads["decode"] / layers / decode_steps,
            "expert_bytes_per_token": reads["decode_bytes"] / decode_steps,
        },
    }


def weight_quant(engine: LLMEngine) -> str:
    """The planner's --quant for the weights this engine reads: its dtype, a GGUF file's own blocks
    ("native"), or the format --quantization made (one name for both: quant/formats.py; q4_1's 8-bit token
    tables counted as q4_1, fp8's and fp4's 16-bit ones as the planner keeps them)."""
    at_load = engine.config.quantized_at_load
    if at_load is not None:
        return at_load.name
    if engine.executor.block_formats and engine.facts.native_quant is not None:
        return "native"
    return dtype_name(engine.executor.dtype)


def engine_roofline(engine: LLMEngine, hw: HardwareSpec) -> RequestRoofline:
    """The ceilings of the engine's model, weights and KV cache on ``hw`` (perf/request_roofline.py)."""
    key = dtype_name(engine.executor.dtype)
    facts = engine.facts
    return RequestRoofline(
        facts,
        resolve_scheme(weight_quant(engine), facts.native_quant, key, False, None),
        hw,
        key,
        kv_element_bytes(dtype_name(engine.executor.kv_dtype), facts.head_dim),
    )


def _add_roofline(result: dict[str, Any], engine: LLMEngine, hw: HardwareSpec, m: RequestMetrics) -> None:
    """Ceilings from the planner's own cost model under the ``ideal`` profile, so that `trace` and
    `plan --hardware local` hold a run against one and the same roofline."""
    rl = engine_roofline(engine, hw)
    phases = rl.phases(
        m.prompt_tokens, m.cached_prompt_tokens, m.output_tokens, m.prefill_tok_s, m.decode_tok_s
    )
    for name, figures in phases.items():
        result["phases"][name].update(figures)
    warnings = list(hw.extra.get("warnings", []))
    if any(ph.get("probe_wrong") for ph in phases.values()):
        warnings.append(PROBE_WRONG)
    result["roofline"] = {
        "bandwidth_gbs": hw.bandwidth_gbs,
        "tflops": hw.peak_flops(rl.dtype) / 1e12,
        "dtype": rl.dtype,
        "weights": rl.scheme.label,
        "source": hw.source,
        "warnings": warnings,
    }
