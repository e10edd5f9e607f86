"""Cost model: BRIEF's decode ceilings, MoE expert coverage, batching, compute dtypes, by hand."""

from __future__ import annotations

import random
from dataclasses import replace

import pytest

from glassbox.models.facts import ModelFacts
from glassbox.perf.cost_model import (
    compute_dtype,
    decode_cost,
    expected_distinct_experts,
    prefill_cost,
    step_cost,
    step_time,
)
from glassbox.perf.engine_profiles import PROFILES, EngineProfile
from glassbox.perf.hardware import PRESETS
from glassbox.perf.model_presets import load_model_facts
from glassbox.perf.quant import QuantScheme, resolve_scheme
from glassbox.quant.formats import FORMATS, WeightFormat

SPARK = PRESETS["dgx-spark"]
IDEAL = PROFILES["ideal"]


def _setup(model: str, quant: str, engine: EngineProfile = IDEAL) -> tuple[ModelFacts, QuantScheme]:
    f = load_model_facts(model)
    return f, resolve_scheme(quant, f.native_quant, f.dtype, engine.gguf, engine.mixed_rest_format)


def _ceiling(model: str, quant: str) -> tuple[float, float]:
    """(decode tok/s, bytes read) of one token at empty context on the Spark's roofline."""
    f, scheme = _setup(model, quant)
    cost = step_cost(f, scheme, SPARK, IDEAL, [(1, 0)])
    return 1.0 / cost.seconds, cost.bytes_moved


def test_brief_formula_with_brief_bytes() -> None:
    # BRIEF's table: ceiling = 273 GB/s / bytes read per token.
    for gb, tok_s in ((4.5, 61), (3.6, 75), (40, 6.8), (6, 45)):
        assert SPARK.bandwidth_bytes_s / (gb * 1e9) == pytest.approx(tok_s, rel=0.02)


@pytest.mark.parametrize(
    "model,quant,brief_gb,brief_tok_s",
    [
        ("llama-3.1-8b", "q4_k_m", 4.5, 61),  # dense: every weight but the embedding gather
        ("gpt-oss-20b", "mxfp4", 3.6, 75),  # MoE: 4 of 32 experts + attention + lm_head (bf16)
        ("llama-3.3-70b", "nvfp4", 40, 6.8),  # NVFP4 linear layers, lm_head kept bf16
    ],
)
def test_brief_decode_ceilings(model: str, quant: str, brief_gb: float, brief_tok_s: float) -> None:
    tok_s, nbytes = _ceiling(model, quant)
    assert nbytes / 1e9 == pytest.approx(brief_gb, rel=0.04)
    assert tok_s == pytest.approx(brief_tok_s, rel=0.04)


def test_brief_nemotron_ceiling() -> None:
    # BRIEF's ~45 tok/s is 12B active x 4 bits = 6 GB. The same arithmetic on our facts (4.0 bits for
    # every active weight, state ignored) reproduces it; the realistic NVFP4 read adds the FP8 scales
    # (+0.5 bit/weight), a bf16 lm_head and the fp32 Mamba state, which lowers the ceiling to ~34 tok/s.
    f, _ = _setup("nemotron-3-super-120b-a12b", "nvfp4")
    four_bit = WeightFormat("w4", "blocks", 4.0, "bf16", "4 bits, no scales")
    flat = QuantScheme("4-bit", four_bit, four_bit, four_bit, four_bit)
    no_state = replace(f, state_bytes_per_seq=0)
    tok_s = 1.0 / step_cost(no_state, flat, SPARK, IDEAL, [(1, 0)]).seconds
    assert tok_s == pytest.approx(45, rel=0.03)
    realistic, nbytes = _ceiling("nemotron-3-super-120b-a12b", "nvfp4")
    active = f.active_params - f.params["lm_head"]
    expected = active * 4.5 / 8 + f.params["lm_head"] * 2 + 2 * f.state_bytes_per_seq
    assert nbytes == pytest.approx(expected, rel=0.001)
    assert realistic == pytest.approx(SPARK.bandwidth_bytes_s / expected, rel=0.001)


def test_expected_distinct_experts() -> None:
    assert expected_distinct_experts(32, 4, 1) == pytest.approx(4)
    assert expected_distinct_experts(32, 4, 10_000) == pytest.approx(32)
    assert expected_distinct_experts(0, 0, 5) == 0.0
    rng = random.Random(0)  # Monte Carlo check of the closed form for a small batch
    trials = [len({e for _ in range(6) for e in rng.sample(range(32), 4)}) for _ in range(4000)]
    assert sum(trials) / len(trials) == pytest.approx(expected_distinct_experts(32, 4, 6), rel=0.02)


def test_moe_short_prefill_reads_most_experts() -> None:
    # Nemotron: 58 tokens x top-22 of 512 touch ~92% of experts, so a short prompt costs ~ a full weight
    # read; that is why BRIEF's 58-token prompt prefills at 140 tok/s.
    assert expected_distinct_experts(512, 22, 58) / 512 == pytest.approx(1 - (1 - 22 / 512) ** 58)
    f, scheme = _setup("nemotron-3-super-120b-a12b", "nvfp4")
    short = step_cost(f, scheme, SPARK, IDEAL, [(58, 0)])
    one = step_cost(f, scheme, SPARK, IDEAL, [(1, 0)])
    assert short.bound == "memory" and short.bytes_moved > 7 * one.bytes_moved


def test_batching_shares_the_weight_read() -> None:
    f, scheme = _setup("llama-3.1-8b", "bf16")
    eng = PROFILES["vllm"]
    one = step_time(f, scheme, SPARK, eng, [(1, 1000)])
    many = step_time(f, scheme, SPARK, eng, [(1, 1000)] * 16)
    assert many < 2 * one  # 16x the tokens for < 2x the time (KV grows, weights do not)
    assert 16 / many > 8 / one  # aggregate rises almost linearly
    # Far beyond the compute ridge, prefill is compute bound and time is linear in tokens.
    a = step_cost(f, scheme, SPARK, eng, [(4096, 0)])
    assert a.bound == "compute"


def test_prefill_chunks_and_attention() -> None:
    f, scheme = _setup("llama-3.1-8b", "bf16")
    eng = PROFILES["vllm"]
    whole = prefill_cost(f, scheme, SPARK, eng, 16384)
    assert whole.steps == 2  # max_batched_tokens 8192
    deep = prefill_cost(f, scheme, SPARK, eng, 2048, context_tokens=32768)
    flat = prefill_cost(f, scheme, SPARK, eng, 2048)
    assert deep.seconds > flat.seconds  # attention over the cached depth


def test_decode_integrates_context_growth() -> None:
    f, scheme = _setup("llama-3.1-8b", "bf16")
    eng = PROFILES["vllm"]
    run = decode_cost(f, scheme, SPARK, eng, 1, 1000, 101)
    mid = step_time(f, scheme, SPARK, eng, [(1, 1050)])
    assert run.seconds == pytest.approx(101 * mid, rel=1e-3)  # step time is linear in context


def test_compute_dtype_rules() -> None:
    vllm, cpp = PROFILES["vllm"], PROFILES["llama.cpp"]
    # DGX Spark: vLLM's dense NVFP4 linears on FP4 tensor cores, its MoE experts widened (Marlin);
    # an engine without the FP4 path widens both; B200 runs NVFP4 natively.
    assert compute_dtype(FORMATS["nvfp4"], SPARK, vllm) == "fp4"
    assert compute_dtype(FORMATS["nvfp4"], SPARK, vllm, experts=True) == "bf16"
    assert compute_dtype(FORMATS["nvfp4"], SPARK, PROFILES["trt-llm"], experts=True) == "fp4"
    assert compute_dtype(FORMATS["nvfp4"], SPARK, replace(vllm, native_fp4=False)) == "bf16"
    assert compute_dtype(FORMATS["nvfp4"], replace(SPARK, fp4_engine_support=False), vllm) == "bf16"
    assert compute_dtype(FORMATS["nvfp4"], PRESETS["b200"], vllm) == "fp4"
    assert compute_dtype(FORMATS["fp8"], PRESETS["a100-80g"], vllm) == "bf16"  # no FP8 on Ampere
    assert compute_dtype(FORMATS["fp8"], PRESETS["h100-sxm"], vllm) == "fp8"
    assert compute_dtype(FORMATS["q4_k_m"], SPARK, cpp) == "int8"  # ggml MMQ
    assert compute_dtype(FORMATS["bf16"], SPARK, cpp) == "bf16"
    glassbox = PROFILES["glassbox"]  # Triton kernels: weight-only, every format in 16-bit dots
    for fmt in ("q4_0", "q8_0", "fp8", "w4a16"):
        assert compute_dtype(FORMATS[fmt], PRESETS["h100-sxm"], glassbox) == "bf16"
    assert SPARK.peak_flops("fp4") == 500e12  # 1 PFLOP sparse halved
    assert PRESETS["m4-max"].peak_flops("int8") == PRESETS["m4-max"].peak_flops("bf16")


def test_nvfp4_lifts_decode_not_prefill_of_an_moe_on_spark() -> None:
    # BRIEF: on a 26B MoE served by vLLM, NVFP4 lifted decode 22-92% over BF16 but barely moved prefill:
    # vLLM runs MoE experts on Marlin (4-bit widened to bf16), so the experts' prompt GEMMs keep the bf16
    # rate; the dense attention linears gain. A dense model's prompt GEMMs move to the FP4 rate.
    eng = PROFILES["vllm"]
    f, bf16 = _setup("qwen3-30b-a3b", "bf16", eng)
    _, fp4 = _setup("qwen3-30b-a3b", "nvfp4", eng)
    costs = [step_cost(f, s, SPARK, eng, [(1, 4096)]) for s in (bf16, fp4)]
    pre = [2048 / prefill_cost(f, s, SPARK, eng, 2048).seconds for s in (bf16, fp4)]
    lift = costs[0].seconds / costs[1].seconds
    assert 1.22 <= lift <= costs[0].bytes_moved / costs[1].bytes_moved  # never beyond the bytes saved
    assert pre[1] / pre[0] < 1.5
    d, dense_bf16 = _setup("llama-3.1-8b", "bf16", eng)
    _, dense_fp4 = _setup("llama-3.1-8b", "nvfp4", eng)
    dense = [2048 / prefill_cost(d, s, SPARK, eng, 2048).seconds for s in (dense_bf16, dense_fp4)]
    assert dense[1] / dense[0] > 2.5  # linears at 4x the rate, attention (bf16) unchanged


def test_fp4_prompt_gemms_by_hand() -> None:
    # Llama 3.1 8B NVFP4, 2,048 tokens, one step, the vLLM profile with overheads off: linears at the FP4
    # peak x eta_flops, the LM head (bf16) and attention at the bf16 peak x eta_flops.
    eng = replace(PROFILES["vllm"], step_overhead_s=0.0, overlap=True)
    f, s = _setup("llama-3.1-8b", "nvfp4", eng)
    cost = step_cost(f, s, SPARK, eng, [(2048, 0)])
    dense = sum(f.params[g] for g in ("attention", "mlp", "moe_shared", "mamba", "norms"))
    want = (
        2 * 2048 * dense / (500e12 * eng.eta_flops)
        + 2 * f.params["lm_head"] / (125e12 * eng.eta_flops)
        + f.attention_flops(2048, 0) / (125e12 * eng.eta_flops)
    )
    assert cost.compute_s == pytest.approx(want, rel=1e-9)


def test_bad_batch_raises() -> None:
    f, scheme = _setup("qwen3-0.6b", "bf16")
    with pytest.raises(ValueError, match="num_new_tokens"):
        step_cost(f, scheme, SPARK, IDEAL, [(-1, 0)])
    assert step_time(f, scheme, SPARK, IDEAL, []) == 0.0


def test_prompt_prep_pass_by_hand() -> None:
    # glassbox-cpu with tiles that stop at 32 rows (GLASSBOX_BF16_AMX=off on an AMX CPU): a step with more
    # than 32 prompt rows also moves 8 bytes per dense linear weight (bf16 tiles untiled for oneDNN, read 2 +
    # write 2, and oneDNN's reorder, 4; not the LM head, which runs on the sampled rows) at eta_bw; 32 rows
    # or fewer, and decode, do not (perf/cpu_terms.py)
    eng = replace(PROFILES["glassbox-cpu"], prompt_prep_rows=32)
    f, s = _setup("qwen3-0.6b", "bf16", eng)
    off = replace(eng, prompt_prep_bytes_per_weight=0.0)
    dense = sum(f.params[g] for g in ("attention", "mlp", "moe_shared", "mamba"))
    bw = SPARK.bandwidth_bytes_s * eng.eta_bw
    for rows, extra in ((33, 8.0 * dense / bw), (32, 0.0), (1, 0.0)):
        diff = (
            step_cost(f, s, SPARK, eng, [(rows, 0)]).seconds
            - step_cost(f, s, SPARK, off, [(rows, 0)]).seconds
        )
        assert diff == pytest.approx(extra, rel=1e-9, abs=1e-15)
