"""What the loader hands the engine: parameters that never require grad."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from tiny_models import build_tiny_model

from glassbox import LLM


@pytest.mark.parametrize("arch", ["llama", "gemma3"])
def test_no_parameter_requires_grad(tmp_path: Path, arch: str) -> None:
    """An inference tensor (a CUDA graph's output, say) through the LM head outside inference mode: with a
    parameter requiring grad, autograd would try to save it for backward and fail."""
    llm = LLM(str(build_tiny_model(arch, tmp_path)), dtype="float32", num_kv_blocks=8)
    model = llm.engine.executor.model
    assert not [n for n, p in model.named_parameters() if p.requires_grad]
    with torch.inference_mode():
        hidden = torch.randn(2, model.config.hidden_size)
    logits = model.compute_logits(hidden)  # outside inference mode, as benchmarks/gpu_bench.py times it
    assert logits.shape == (2, model.config.vocab_size) and not logits.requires_grad
