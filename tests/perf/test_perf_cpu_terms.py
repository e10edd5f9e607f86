"""glassbox's CPU prompt path in the cost model (perf/cpu_terms.py), on hand-computed cases."""

from __future__ import annotations

from dataclasses import replace

import pytest

from glassbox.models.facts import ModelFacts
from glassbox.perf.cost_model import step_cost
from glassbox.perf.cpu_terms import for_this_cpu, prompt_path, tail, tail_values
from glassbox.perf.engine_profiles import PROFILES
from glassbox.perf.hardware import HardwareSpec
from glassbox.perf.model_presets import load_model_facts
from glassbox.perf.quant import QuantScheme, resolve_scheme
from glassbox.quant.formats import FORMATS

CPU = PROFILES["glassbox-cpu"]
HW = HardwareSpec("cpu", 64.0, 10.0, {"bf16": 0.5}, True)


def _smollm2_shape() -> ModelFacts:
    """SmolLM2-135M's widths (hidden 576, 9 heads / 3 KV of 64, MLP 1536, 30 layers) from the Llama preset."""
    f = load_model_facts("llama-3.1-8b")
    return replace(
        f, hidden_size=576, num_heads=9, num_kv_heads=3, head_dim=64, intermediate_size=1536, num_layers=30
    )


def test_tail_is_what_the_vector_loop_leaves() -> None:
    # whole 512-value chunks run vectorized; the rest of a row, or a row with no whole chunk, in scalar C
    assert (tail(576), tail(1536), tail(1024), tail(300), tail(1100)) == (64, 0, 0, 300, 76)


def test_tail_values_of_smollm2_by_hand() -> None:
    # per layer: q/k/v (576 + 2 x 192 = 960 rows) and o (576 rows) read 576-wide rows: 64 each; gate/up
    # (2 x 1536 rows) 576-wide: 64 each; down reads 1536-wide rows: none. (960 + 576 + 3072) x 64 x 30.
    assert tail_values(_smollm2_shape()) == 960 * 64 * 30 + 576 * 64 * 30 + 3072 * 64 * 30 == 8_847_360


def _blocks(f: ModelFacts) -> QuantScheme:
    q = FORMATS["q4_1"]
    return QuantScheme("q4_1", q, q, q, q)


def test_block_prompt_step_adds_the_copies_the_tail_and_the_activations() -> None:
    f = _smollm2_shape()
    s = _blocks(f)
    eng = replace(
        CPU, dequant_tail_bytes_per_value=100.0, activation_passes=3.0, prompt_layer_overhead_s=1e-3
    )
    dense = sum(f.params[g] for g in ("attention", "mlp", "moe_shared", "mamba"))
    path = prompt_path(f, s, eng, [(16, 0)])
    assert path.prep_bytes == pytest.approx(8.0 * dense)  # dequantized (q read, 2 written), reordered (4)
    assert path.tail_bytes == pytest.approx(100.0 * 8_847_360)
    assert path.activation_bytes == pytest.approx(3.0 * 16 * 30 * (576 + 1536) * 2)
    assert path.python_layers == 30 and not path.tile_rows
    # the step: those bytes at eta_bw, a pass of their own, plus Python per layer
    on, off = step_cost(f, s, HW, eng, [(16, 0)]), step_cost(f, s, HW, replace(eng, prompt_prep_bytes_per_weight=0.0,
                                                                                dequant_tail_bytes_per_value=0.0,
                                                                                activation_passes=0.0), [(16, 0)])  # fmt: skip
    bw = HW.bandwidth_bytes_s * eng.eta_bw
    extra = (8.0 * dense + 100.0 * 8_847_360 + 3.0 * 16 * 30 * 2112 * 2) / bw
    assert on.terms["prompt_prep_s"] == pytest.approx(extra)
    assert on.seconds - off.seconds == pytest.approx(extra, rel=1e-9)


def test_decode_and_speculative_rows_take_the_kernels() -> None:
    f = _smollm2_shape()
    s = _blocks(f)
    for batch, verify in (([(1, 100)] * 4, False), ([(5, 100)], True)):
        path = prompt_path(f, s, CPU, batch, verify)
        assert (path.prep_bytes, path.tail_bytes, path.activation_bytes, path.python_layers) == (0, 0, 0, 0)
    # a decode step's block weights stream at block_gemv_factor x eta_bw; a prompt step's are read as stored
    one = step_cost(f, s, HW, CPU, [(1, 0)])
    bw = HW.bandwidth_bytes_s * CPU.eta_bw
    weights = one.terms["weight_bytes"]
    assert one.memory_s == pytest.approx(
        weights / (bw * CPU.block_gemv_factor) + one.terms["kv_state_bytes"] / bw
    )


def test_bf16_tiles_run_every_prompt_at_the_tile_share_without_a_copy() -> None:
    """The tiles multiply on AMX and run prompts of any length (quant/dense/bf16_tiles.onednn_prompts)."""
    f = load_model_facts("qwen3-0.6b")
    s = resolve_scheme("bf16", None, "bf16", False, None)
    for rows in (16, 33, 512, 2048):
        path = prompt_path(f, s, CPU, [(rows, 0)])
        assert path.tile_rows and path.prep_bytes == 0.0, rows
        dense = sum(f.params[g] for g in ("attention", "mlp", "moe_shared", "mamba", "norms"))
        rate = HW.peak_flops("bf16") * CPU.eta_flops * CPU.tile_flops_share
        t = step_cost(f, s, HW, CPU, [(rows, 0)]).terms
        assert t["linear_s"] == pytest.approx(2.0 * rows * dense / rate, rel=1e-9)


def test_bf16_tiles_that_stop_at_32_rows_charge_the_copy_past_them() -> None:
    """A profile whose tiles stop at ``prompt_prep_rows`` (dot-product tiles beside oneDNN's AMX GEMM)."""
    f = load_model_facts("qwen3-0.6b")
    s = resolve_scheme("bf16", None, "bf16", False, None)
    cpu = replace(CPU, prompt_prep_rows=32, tile_flops_share=0.15)
    copied = sum(f.params[g] for g in ("attention", "mlp", "moe_shared", "mamba"))  # not norms, not the head
    assert prompt_path(f, s, cpu, [(33, 0)]).prep_bytes == copied * cpu.prompt_prep_bytes_per_weight
    assert prompt_path(f, s, cpu, [(32, 0)]).prep_bytes == 0.0
    for rows, share in ((16, cpu.tile_flops_share), (32, cpu.tile_flops_share), (33, 1.0)):
        t = step_cost(f, s, HW, cpu, [(rows, 0)]).terms
        dense = sum(f.params[g] for g in ("attention", "mlp", "moe_shared", "mamba", "norms"))
        rate = HW.peak_flops("bf16") * cpu.eta_flops * share
        assert t["linear_s"] == pytest.approx(2.0 * rows * dense / rate, rel=1e-9)
        assert t["lm_head_s"] == pytest.approx(2.0 * f.params["lm_head"] / rate, rel=1e-9)  # one sampled row


def test_without_amx_bf16_prompts_stay_on_the_tiles() -> None:
    f = load_model_facts("qwen3-0.6b")
    s = resolve_scheme("bf16", None, "bf16", False, None)
    plain = for_this_cpu(CPU, amx=False)
    assert for_this_cpu(CPU, amx=True) is CPU
    path = prompt_path(f, s, plain, [(512, 0)])
    assert path.prep_bytes == 0.0 and path.tile_rows  # no copy; the tiles' arithmetic, at the probe's rate
    assert plain.tile_flops_share == 1.0
    q = _blocks(f)
    assert prompt_path(f, q, plain, [(512, 0)]).prep_bytes > 0  # block weights still dequantize
