"""Weight-only int8: close to the unquantized model, through the real engine."""

from __future__ import annotations

import pytest
import torch
from tiny_models import build_tiny_model

from glassbox import LLM, SamplingParams
from glassbox.layers.quantization import Int8Linear, quantize_int8


def test_int8_linear_matches_dequantized_reference() -> None:
    torch.manual_seed(0)
    lin = torch.nn.Linear(64, 48, bias=True)
    q = Int8Linear(lin)
    x = torch.randn(5, 64)
    ref = x @ (q.weight.float() * q.scale[:, None]).t() + lin.bias
    assert torch.allclose(q(x), ref, atol=1e-4)
    # and the quantization error itself is small against the float weights
    err = (q(x) - lin(x)).norm() / lin(x).norm()
    assert err < 0.02


def test_quantize_replaces_every_linear() -> None:
    model = torch.nn.Sequential(torch.nn.Linear(8, 8), torch.nn.ReLU(), torch.nn.Linear(8, 4))
    assert quantize_int8(model) == 2
    assert all(not isinstance(m, torch.nn.Linear) for m in model.modules())


@pytest.mark.parametrize("arch", ["llama", "qwen3"])
def test_int8_greedy_stays_close_to_full_precision(tmp_path, arch: str) -> None:  # type: ignore[no-untyped-def]
    d = build_tiny_model(arch, tmp_path)
    prompts = ["def fibonacci(n):", "import os\nimport sys\n", "你好，世界", "class Foo:\n    def"]
    params = SamplingParams(temperature=0, max_tokens=8, ignore_eos=True, logprobs=0)
    full = LLM(str(d), dtype="float32").generate(prompts, params)
    q = LLM(str(d), dtype="float32", quantization="int8")
    assert isinstance(q.engine.executor.model.lm_head, Int8Linear)
    quant = q.generate(prompts, params)
    # the first token agrees everywhere and most continuations agree token for token
    assert all(a.token_ids[0] == b.token_ids[0] for a, b in zip(full, quant, strict=True))
    same = sum(a.token_ids == b.token_ids for a, b in zip(full, quant, strict=True))
    assert same >= len(prompts) - 1
    # the quantized model's logprob of the full-precision first token stays close
    for a, b in zip(full, quant, strict=True):
        t = a.token_ids[0]
        assert b.logprobs is not None and a.logprobs is not None
        assert abs(b.logprobs[0][t] - a.logprobs[0][t]) < 0.1


def test_int8_keeps_the_demo_models_greedy_output() -> None:
    """On a trained model (the demo), int8 weights leave greedy continuations almost unchanged vs bf16."""
    prompts = [
        "def fibonacci(n):",
        "import os\nimport sys\n",
        "class Stack:\n    def push(self, item):\n",
        "    for i in range(len(items)):\n",
    ]
    params = SamplingParams(temperature=0, max_tokens=16, ignore_eos=True)
    ref = LLM("glassbox-demo", dtype="bfloat16").generate(prompts, params)
    quant = LLM("glassbox-demo", dtype="bfloat16", quantization="int8").generate(prompts, params)
    same = sum(
        a == b for r, q in zip(ref, quant, strict=True) for a, b in zip(r.token_ids, q.token_ids, strict=True)
    )
    assert all(r.token_ids[0] == q.token_ids[0] for r, q in zip(ref, quant, strict=True))
    assert same >= 0.75 * 16 * len(prompts)
