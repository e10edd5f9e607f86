"""Memory plan: BRIEF's KV figures exactly, and the budget arithmetic by hand."""

from __future__ import annotations

import pytest

from glassbox.models.facts import ModelFacts
from glassbox.perf.engine_profiles import PROFILES
from glassbox.perf.hardware import GIB, PRESETS
from glassbox.perf.memory_plan import MemoryPlan, kv_bytes_per_element, plan_memory, weight_bytes
from glassbox.perf.model_presets import load_model_facts
from glassbox.perf.quant import QuantScheme, resolve_scheme


@pytest.mark.parametrize("tokens,gib", [(4096, 1.25), (32768, 10.0), (131072, 40.0)])
def test_brief_llama_70b_kv_cache(tokens: int, gib: float) -> None:
    # BRIEF: 80 layers x 2 x 8 KV heads x 128 x tokens x 2 bytes = 1.25 / 10 / 40 GiB.
    assert load_model_facts("llama-3.3-70b").kv_bytes(tokens) / GIB == gib


def test_kv_dtype_fp8_halves_the_cache() -> None:
    f = load_model_facts("llama-3.3-70b")
    assert f.kv_bytes(32768, kv_bytes_per_element("fp8", "bf16")) / GIB == 5.0
    with pytest.raises(ValueError, match="--kv-cache-dtype"):
        kv_bytes_per_element("int3", "bf16")


def _plan(
    model: str, quant: str, hw: str, seq_len: int, conc: int, util: float = 0.85
) -> tuple[ModelFacts, QuantScheme, MemoryPlan]:
    f = load_model_facts(model)
    eng = PROFILES["vllm"]
    scheme = resolve_scheme(quant, f.native_quant, f.dtype, eng.gguf, eng.mixed_rest_format)
    return f, scheme, plan_memory(f, scheme, PRESETS[hw], eng, seq_len, conc, 2048, util, 2.0)


def test_budget_arithmetic() -> None:
    f, scheme, m = _plan("llama-3.3-70b", "nvfp4", "dgx-spark", 131072, 4)
    assert m.weights == weight_bytes(f, scheme)
    assert m.kv_cache == 4 * 40 * GIB
    assert m.budget == pytest.approx(119.7 * GIB * 0.85)
    assert m.total == pytest.approx(m.weights + m.kv_cache + m.activations + m.runtime + m.state)
    assert not m.fits  # 4 x 40 GiB of KV alone exceed the Spark
    # max concurrency at 128K: floor(free / 40 GiB); max context at 4 sequences: free / 4 / bytes per token.
    free = m.budget - m.weights - m.activations - m.runtime
    assert m.max_concurrency == int(free // (40 * GIB))
    assert m.max_context_tokens == int(free / 4 // f.kv_bytes_per_token())


def test_fits_on_h100_not_on_4090() -> None:
    assert _plan("llama-3.1-8b", "bf16", "h100-sxm", 8192, 8)[2].fits
    assert not _plan("llama-3.1-8b", "bf16", "rtx-4090", 8192, 64)[2].fits
    assert _plan("llama-3.1-8b", "bf16", "rtx-4090", 8192, 1)[2].fits


def test_recurrent_state_counts_per_sequence() -> None:
    f, _, m = _plan("nemotron-3-super-120b-a12b", "nvfp4", "dgx-spark", 8192, 4)
    # 40 Mamba layers x 128 heads x 64 x 128 state x fp32, plus the bf16 conv window.
    ssm = 40 * 128 * 64 * 128 * 4
    assert f.state_bytes_per_seq == ssm + 40 * (8192 + 2 * 8 * 128) * 3 * 2
    assert m.state == 4 * f.state_bytes_per_seq
    # Sliding-window / hybrid models: the cache is tiny, so the context limit is the model's.
    _, _, oss = _plan("gpt-oss-20b", "mxfp4", "dgx-spark", 4096, 1)
    assert oss.max_context_tokens == 131072
