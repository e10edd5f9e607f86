"""The one-call decode step (kernels/cpu_step.c via models/llama_step.py) against the per-op kernel forward
(models/llama_native.py) it replaces: the same kernels in the same order, so the same bits. The per-op
forward is itself held to transformers by the parity tests; this checks that the chaining adds nothing."""

from __future__ import annotations

from pathlib import Path

import pytest
from tiny_models import build_tiny_model

from glassbox import LLM, SamplingParams
from glassbox.models.llama_native import NativeForward
from glassbox.quant.dense.bf16_tiles import tiled_available

TILES = pytest.mark.skipif(not tiled_available(), reason="bf16 tiles need AVX-512 BF16 and the C kernels")

PROMPTS = ["def fibonacci(n):", "import os\nimport sys\n", "你好，世界", "class Foo:\n    def", "x = [1, 2"]


def _runs(llm: LLM, copies: int) -> tuple[list[list[int]], list[list[float]]]:
    params = SamplingParams(temperature=0, max_tokens=24, ignore_eos=True, logprobs=2)
    outs = llm.generate(PROMPTS * copies, params)
    lps = [[lp[t] for lp, t in zip(o.logprobs or [], o.token_ids, strict=True)] for o in outs]
    return [o.token_ids for o in outs], lps


@pytest.mark.parametrize(
    ("arch", "dtype", "quantization", "kv", "copies"),
    [
        ("llama", "bfloat16", "int4", "auto", 1),
        ("qwen3", "bfloat16", "int8", "auto", 1),  # q/k norms
        ("mistral", "bfloat16", "int8", "int8", 1),  # sliding window, 8-bit KV cache
        # 20 sequences at once: past KERNEL_ROWS decode rows the linears multiply dequantized weights
        ("llama", "bfloat16", "int4", "auto", 4),
        # dense bf16 in tiles (quant/dense/bf16_tiles.py): q/k/v biases, then past KERNEL_ROWS rows
        pytest.param("qwen2", "bfloat16", "none", "auto", 1, marks=TILES),
        pytest.param("llama", "bfloat16", "none", "auto", 4, marks=TILES),
    ],
)
def test_native_step_equals_the_per_op_forward(
    tmp_path: Path, arch: str, dtype: str, quantization: str, kv: str, copies: int
) -> None:
    d = build_tiny_model(arch, tmp_path)
    llm = LLM(str(d), dtype=dtype, quantization=quantization, kv_cache_dtype=kv, max_num_seqs=3 * copies + 8)
    forward = llm.engine.executor.forward
    assert isinstance(forward, NativeForward) and forward.step is not None
    native = _runs(llm, copies)
    forward.step = None  # the per-op forward for every step
    assert native == _runs(llm, copies)


@pytest.mark.parametrize(
    ("dtype", "quantization", "bf16_linear", "bound"),
    [
        pytest.param("bfloat16", "none", "tiled", True, marks=TILES),
        ("bfloat16", "none", "onednn", False),  # oneDNN's packed weights are not callable from C
        ("float32", "int8", "tiled", False),  # float32 block linears run dequantized
    ],
)
def test_step_is_bound_only_for_bf16_kernel_weights(
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    dtype: str,
    quantization: str,
    bf16_linear: str,
    bound: bool,
) -> None:
    monkeypatch.setenv("GLASSBOX_BF16_LINEAR", bf16_linear)
    d = build_tiny_model("llama", tmp_path)
    forward = LLM(str(d), dtype=dtype, quantization=quantization).engine.executor.forward
    assert isinstance(forward, NativeForward) and (forward.step is not None) == bound
