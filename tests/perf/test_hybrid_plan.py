"""The planner and trace on hybrid models: presets' parameter counts against transformers (real shapes on
the meta device), state bytes per sequence by hand, max concurrency with the states in the budget, the
simulator holding the engine's state slots, and trace's state row."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from hybrid_models import build_hybrid_model

from glassbox.config import EngineConfig
from glassbox.engine.llm_engine import LLMEngine
from glassbox.perf.engine_profiles import PROFILES
from glassbox.perf.hardware import PRESETS as HARDWARE
from glassbox.perf.load_rows import _settings
from glassbox.perf.memory_plan import plan_memory
from glassbox.perf.model_presets import PRESETS, load_model_facts
from glassbox.perf.plan_request import PlanRequest, resolve
from glassbox.perf.quant import resolve_scheme
from glassbox.trace import run_trace


@pytest.mark.parametrize("name", ["qwen3.5-122b-a10b", "qwen3-next-80b-a3b", "nemotron-3-super-120b-a12b"])
def test_preset_parameters_are_transformers(name: str) -> None:
    import transformers as tf

    cfg = dict(PRESETS[name])
    kind = {"qwen3_5_moe_text": tf.Qwen3_5MoeTextConfig, "qwen3_next": tf.Qwen3NextConfig}
    config = kind.get(cfg["model_type"], tf.NemotronHConfig)(**cfg)
    with torch.device("meta"):
        model = tf.AutoModelForCausalLM.from_config(config)
    assert load_model_facts(name).total_params == sum(p.numel() for p in model.parameters())


def test_qwen35_122b_state_and_kv_by_hand() -> None:
    """36 Gated DeltaNet layers: a conv window of 3 inputs of [q | k | v] = 2 * 16 * 128 + 64 * 128
    channels and 64 v heads' 128 x 128 matrices, all bf16 (vLLM's default for this model); 12 attention
    layers of 2 KV heads of 256."""
    f = load_model_facts("qwen3.5-122b-a10b")
    assert f.state_bytes_per_seq == 36 * (3 * (2 * 16 * 128 + 64 * 128) + 64 * 128 * 128) * 2
    assert f.kv_bytes_per_token(2) == 12 * 2 * 2 * 256 * 2
    assert f.layer_mixers.count("linear") == 36 and f.layer_mixers[3::4] == ("full",) * 12


def test_max_concurrency_counts_the_states() -> None:
    """A sequence of n tokens holds KV for n tokens in the attention layers plus one fixed state."""
    f = load_model_facts("qwen3.5-122b-a10b")
    eng = PROFILES["vllm"]
    scheme = resolve_scheme("nvfp4", f.native_quant, f.dtype, eng.gguf, eng.mixed_rest_format)
    m = plan_memory(f, scheme, HARDWARE["dgx-spark"], eng, 8192, 4, 2048, 0.85, 2.0)
    free = m.budget - m.weights - m.activations - m.runtime
    assert m.max_concurrency == int(free // (8192 * f.kv_bytes_per_token(2) + f.state_bytes_per_seq))
    assert m.state == 4 * f.state_bytes_per_seq and m.state_bytes_per_seq == f.state_bytes_per_seq


def test_speculative_decoding_holds_a_state_per_draft() -> None:
    """With k drafts a step a sequence also holds k scratch states (engine/spec_states.py): 1 + 3 states,
    by hand from the bf16 state of test_qwen35_122b_state_and_kv_by_hand."""
    f = load_model_facts("qwen3.5-122b-a10b")
    state = 36 * (3 * (2 * 16 * 128 + 64 * 128) + 64 * 128 * 128) * 2
    eng = PROFILES["vllm"]
    scheme = resolve_scheme("nvfp4", f.native_quant, f.dtype, eng.gguf, eng.mixed_rest_format)
    m = plan_memory(f, scheme, HARDWARE["dgx-spark"], eng, 8192, 4, 2048, 0.85, 2.0, spec_tokens=3)
    free = m.budget - m.weights - m.activations - m.runtime
    assert m.state_bytes_per_seq == 4 * state and m.state == 4 * 4 * state
    assert m.max_concurrency == int(free // (8192 * 12 * 2 * 2 * 256 * 2 + 4 * state))


def test_simulator_holds_the_state_slots() -> None:
    """The simulated engine's block manager holds a state slot per sequence it may run."""
    req = PlanRequest(model="nemotron-3-super-120b-a12b", hardware="dgx-spark", quant="nvfp4", engine="vllm")
    s = resolve(req)
    memory = plan_memory(s.facts, s.scheme, s.hw, s.engine, 1280, 4, 1024, 0.9, s.kv_bytes)
    prepared = _settings(req, s, memory)
    assert prepared is not None
    settings, slots = prepared
    assert settings.num_state_slots == slots == min(s.engine.max_num_seqs, memory.max_concurrency) > 0


def test_trace_shows_the_state_beside_the_kv(tmp_path: Path) -> None:
    from glassbox.trace_cli import render

    d = build_hybrid_model("nemotron_h", tmp_path)
    engine = LLMEngine(EngineConfig(model=str(d), dtype="float32", max_num_seqs=2))
    r = run_trace(engine, "def f(x):", 4, None)
    spec = engine.facts.hybrid
    assert spec is not None
    checkpoints = 2 * 2  # two per slot (engine/state_inputs.CHECKPOINTS_PER_SLOT), prefix caching on
    want = {"bytes": spec.state_bytes(4, 4), "layers": 3, "dtype": "fp32", "checkpoints": checkpoints}
    assert r["recurrent_state"] == want
    render(r)  # prints the state row beside the KV row
