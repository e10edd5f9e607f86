"""Roofline cost of one engine step: time = max(bytes / (bandwidth x eta_bw), FLOPs / (peak x eta_flops))
+ the engine's fixed per-step overhead.

A step is a batch of sequences, each contributing (num_new_tokens, context_len_before): a decode step is
(1, ctx) per running sequence, a prefill chunk is (chunk, tokens_already_cached). Bytes are the weights
streamed once per step (MoE: only the experts the batch's tokens route to, in expectation), the KV cache
read and written, and recurrent (Mamba) state; FLOPs are 2 x active weights per token, plus attention
(quadratic in a prefill, linear in context per decoded token). The simulator (SimulatedExecutor) calls
``step_time`` once per scheduled step. With tensor parallelism (``engine.tp``) the step is one rank's:
1/N of the weights, FLOPs and (by KV heads) cache, plus its all-reduces (perf/tensor_parallel.py).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field

from glassbox.models.facts import ModelFacts
from glassbox.perf.cpu_terms import prompt_path
from glassbox.perf.engine_profiles import EngineProfile
from glassbox.perf.hardware import HardwareSpec
from glassbox.perf.quant import QuantScheme
from glassbox.perf.tensor_parallel import kv_share, step_comm_s
from glassbox.quant.formats import WeightFormat

_DENSE_GROUPS = ("attention", "mlp", "moe_shared", "mamba", "norms")


@dataclass(frozen=True)
class StepCost:
    """Time of one step and what bounds it (seconds, bytes, FLOPs)."""

    seconds: float
    memory_s: float
    compute_s: float
    overhead_s: float
    bytes_moved: float
    flops: float
    num_tokens: int
    comm_s: float = 0.0  # tensor parallelism's all-reduces (included in seconds)
    terms: dict[str, float] = field(default_factory=dict)  # what makes up ``seconds`` (see step_cost)

    @property
    def bound(self) -> str:
        return "memory" if self.memory_s >= self.compute_s else "compute"


def compute_dtype(fmt: WeightFormat, hw: HardwareSpec, engine: EngineProfile, experts: bool = False) -> str:
    """Dtype of the matmuls for weights stored in ``fmt`` (widened when no native path exists).

    FP4 (NVFP4/MXFP4) runs on the FP4 tensor cores only where the chip has them, its engines ship the
    GEMMs (``hw.fp4_engine_support``) and the engine uses them: for dense linears ``native_fp4``, for the
    routed experts' grouped GEMMs ``native_fp4_moe`` (vLLM on sm_121 runs MoE experts on Marlin's
    weight-only kernel: 4-bit weights widened to bf16). FP8 and INT8 run natively where the chip has them.
    """
    if fmt.is_16bit:
        return fmt.compute
    if engine.weight_only:
        return "bf16"  # glassbox on CUDA: the weights dequantized in registers into bf16/fp16 dots
    if engine.gguf:
        return "int8"  # ggml MMQ: activations quantized to 8 bits, int8 dot products
    if fmt.compute == "fp4":
        uses = engine.native_fp4_moe if experts else engine.native_fp4
        native = uses and hw.fp4_engine_support and hw.has("fp4")
        return "fp4" if native else "bf16"
    if fmt.compute in ("fp8", "int8"):
        return fmt.compute if hw.has(fmt.compute) else "bf16"
    return "bf16"  # int4 (AWQ/GPTQ): dequantized to bf16 inside the GEMM


def expected_distinct_experts(num_experts: int, top_k: int, num_tokens: int) -> float:
    """E[# experts hit] when each of ``num_tokens`` tokens picks ``top_k`` of ``num_experts`` uniformly."""
    if num_experts == 0 or num_tokens == 0:
        return 0.0
    return num_experts * (1.0 - (1.0 - top_k / num_experts) ** num_tokens)


def _pairs(batch: Sequence[tuple[int, int]]) -> list[tuple[int, int]]:
    pairs = [(int(n), int(c)) for n, c in batch]
    if any(n < 0 or c < 0 for n, c in pairs):
        raise ValueError(f"batch entries must be (num_new_tokens >= 0, context_len_before >= 0), got {pairs}")
    return pairs


def step_cost(
    facts: ModelFacts,
    quant: QuantScheme,
    hw: HardwareSpec,
    engine: EngineProfile,
    batch: Sequence[tuple[int, int]],
    kv_bytes_per_element: float = 2.0,
    logit_rows: int | None = None,
) -> StepCost:
    """Cost of one engine step over ``batch`` = [(num_new_tokens, context_len_before), ...]; the LM head
    runs on ``logit_rows`` rows (default one per sequence; a speculative step verifying k drafts: k + 1)."""
    work = [(n, c) for n, c in _pairs(batch) if n > 0]
    if not work:
        return StepCost(0.0, 0.0, 0.0, 0.0, 0.0, 0.0, 0)
    tokens, seqs = sum(n for n, _ in work), len(work)
    bw = hw.bandwidth_bytes_s * engine.eta_bw
    ranks = engine.tp.size  # each rank holds 1/ranks of every group but the norms

    # Bytes: weights once per step, each group at its format's kernel efficiency.
    path = prompt_path(facts, quant, engine, work, logit_rows is not None and logit_rows > len(work))
    weight_s, weight_bytes = 0.0, 0.0
    groups = {g: float(facts.params[g]) for g in (*_DENSE_GROUPS, "lm_head")}
    groups["embed"] = float(min(tokens, facts.vocab_size) * facts.embedding_row_params)  # gathered rows only
    distinct = expected_distinct_experts(facts.num_experts, facts.experts_per_token, tokens)
    groups["experts"] = facts.moe_layers * distinct * facts.params_per_expert
    for group, count in groups.items():
        fmt = quant.format_for(group)
        nbytes = count * fmt.bytes_per_weight / (1 if group == "norms" else ranks)
        weight_bytes += nbytes
        factor = fmt.decode_kernel_factor if engine.kernel_factors else 1.0
        if fmt.family == "blocks" and not path.python_layers:  # the int8 GEMV kernel (CPU decode rows)
            factor *= engine.block_gemv_factor
        weight_s += nbytes / (bw * factor)
    kv_read = sum(facts.kv_bytes(c, kv_bytes_per_element) for _, c in work)
    kv_write = sum(facts.kv_bytes(c + n, kv_bytes_per_element) for n, c in work) - kv_read
    state = 2.0 * seqs * facts.state_bytes_per_seq / ranks  # recurrent state read and written back
    other_bytes = (kv_read + max(kv_write, 0.0)) * kv_share(facts, ranks) + state
    memory_s = weight_s + other_bytes / bw
    # the prompt GEMMs' weight copies: passes of their own before the GEMMs, never overlapped with them
    prep_bytes = (path.prep_bytes + path.tail_bytes + path.activation_bytes) / ranks
    prep_s = prep_bytes / bw

    # FLOPs: linear layers at their compute dtype, scans at bf16, attention at bf16 with the engine's
    # attention efficiency (eta_attn; flash attention at long context is a GEMM, near the GEMM rate).
    def rate(fmt: WeightFormat, experts: bool = False) -> float:
        tiles = engine.tile_flops_share if path.tile_rows and fmt.is_16bit else 1.0  # glassbox's CPU tiles
        return hw.peak_flops(compute_dtype(fmt, hw, engine, experts)) * engine.eta_flops * tiles

    dense_flops = 2.0 * tokens * sum(facts.params[g] for g in _DENSE_GROUPS)
    expert_flops = 2.0 * tokens * facts.experts_per_token * facts.moe_layers * facts.params_per_expert
    head_flops = 2.0 * (seqs if logit_rows is None else logit_rows) * facts.params["lm_head"]
    attn_flops = sum(facts.attention_flops(n, c) for n, c in work)
    scan_flops = tokens * facts.mixer_flops_per_token
    bf16_rate = hw.peak_flops("bf16") * engine.eta_flops
    attn_rate = hw.peak_flops("bf16") * (engine.eta_attn or engine.eta_flops)
    parts = {  # seconds of each kind of arithmetic on one rank
        "linear_s": dense_flops / rate(quant.main) / ranks,
        "experts_s": expert_flops / (rate(quant.experts, experts=True) * engine.moe_flops_factor) / ranks,
        "lm_head_s": head_flops / rate(quant.lm_head) / ranks,
        "attention_s": attn_flops / attn_rate / ranks,
        "scan_s": scan_flops / bf16_rate / ranks,
    }
    compute_s = sum(parts.values())
    flops = (dense_flops + expert_flops + head_flops + attn_flops + scan_flops) / ranks
    op_s = hw.extra.get("op_s") if engine.host_op_s else None  # host terms at this machine's op speed
    slow = op_s / engine.host_op_s if op_s else 1.0  # (perf/cpu_clock.py)
    host = {
        "step_overhead_s": engine.step_overhead_s * slow,
        "layer_overhead_s": (
            engine.layer_overhead_s * facts.num_layers + engine.prompt_layer_overhead_s * path.python_layers
        )
        * slow,
        "seq_overhead_s": engine.seq_overhead_s * seqs * slow,
    }
    overhead = sum(host.values())
    busy = max(memory_s, compute_s) if engine.overlap else memory_s + compute_s
    comm = step_comm_s(facts, engine.tp, tokens, seqs if logit_rows is None else logit_rows)
    seconds = busy + prep_s + overhead + comm
    terms = {
        "weight_bytes": weight_bytes,
        "kv_state_bytes": other_bytes,
        "prompt_prep_bytes": prep_bytes,
        "prompt_prep_s": prep_s,
        "memory_s": memory_s,
        "linear_flops": (dense_flops + head_flops) / ranks,
        "expert_flops": expert_flops / ranks,
        "attention_flops": attn_flops / ranks,
        "compute_s": compute_s,
        **parts,
        "overlapped": 1.0 if engine.overlap else 0.0,
        **host,
        "comm_s": comm,
        "seconds": seconds,
    }
    return StepCost(
        seconds, memory_s + prep_s, compute_s, overhead, weight_bytes + other_bytes + prep_bytes, flops, tokens,
        comm, terms,
    )  # fmt: skip


def step_time(
    facts: ModelFacts,
    quant: QuantScheme,
    hw: HardwareSpec,
    engine: EngineProfile,
    batch: Sequence[tuple[int, int]],
    kv_bytes_per_element: float = 2.0,
) -> float:
    """Seconds for one engine step (the simulator's clock advance)."""
    return step_cost(facts, quant, hw, engine, batch, kv_bytes_per_element).seconds


@dataclass(frozen=True)
class PhaseCost:
    """A multi-step phase (a chunked prefill, or a run of decode steps)."""

    seconds: float
    steps: int
    memory_s: float
    compute_s: float

    @property
    def bound(self) -> str:
        return "memory" if self.memory_s >= self.compute_s else "compute"


def prefill_cost(
    facts: ModelFacts,
    quant: QuantScheme,
    hw: HardwareSpec,
    engine: EngineProfile,
    prompt_tokens: int,
    context_tokens: int = 0,
    kv_bytes_per_element: float = 2.0,
) -> PhaseCost:
    """One request's prefill of ``prompt_tokens`` after ``context_tokens`` cached, in engine-sized chunks."""
    chunk = engine.max_batched_tokens or prompt_tokens
    done, seconds, mem, comp, steps = 0, 0.0, 0.0, 0.0, 0
    while done < prompt_tokens:
        n = min(chunk, prompt_tokens - done)
        cost = step_cost(facts, quant, hw, engine, [(n, context_tokens + done)], kv_bytes_per_element)
        seconds, mem, comp, steps = (
            seconds + cost.seconds,
            mem + cost.memory_s,
            comp + cost.compute_s,
            steps + 1,
        )
        done += n
    return PhaseCost(seconds, steps, mem, comp)


def decode_cost(
    facts: ModelFacts,
    quant: QuantScheme,
    hw: HardwareSpec,
    engine: EngineProfile,
    batch_size: int,
    start_context: int,
    output_tokens: int,
    kv_bytes_per_element: float = 2.0,
) -> PhaseCost:
    """``output_tokens`` decode steps of ``batch_size`` sequences whose context starts at ``start_context``.

    Step time is (piecewise) linear in context, so four evenly spaced sample steps integrate it closely.
    """
    if output_tokens <= 0:
        return PhaseCost(0.0, 0, 0.0, 0.0)
    samples = [start_context + (output_tokens - 1) * (i + 0.5) / 4 for i in range(4)]
    costs = [
        step_cost(facts, quant, hw, engine, [(1, round(c))] * batch_size, kv_bytes_per_element)
        for c in samples
    ]
    mean = sum(c.seconds for c in costs) / len(costs)
    mem = sum(c.memory_s for c in costs) / len(costs)
    comp = sum(c.compute_s for c in costs) / len(costs)
    return PhaseCost(mean * output_tokens, output_tokens, mem * output_tokens, comp * output_tokens)
