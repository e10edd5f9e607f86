"""``--quantization int8|int4|int4-asym|fp8`` of a MoE checkpoint on the CPU: the routed experts are quantized
too (each expert's matrices held in blocks, models/moe.py ``quantize_experts``), checked against the formats'
own definitions (the gguf package's Q8_0 / Q4_0 / Q4_1 reference quantization; E4M3 per channel as
tests/quant/test_fp8_checkpoint.py decodes it): float32 greedy token-exact with transformers running the weights
so quantized, and the experts counted at their quantized bytes."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import torch
from gguf import GGMLQuantizationType as Q
from gguf.quants import dequantize as gguf_dequantize
from gguf.quants import quantize as gguf_quantize
from safetensors.torch import load_file
from test_fp8_checkpoint import PROMPTS, dequantized, quantize, write_checkpoint
from tiny_models import build_tiny_model, hf_greedy

from glassbox import LLM, SamplingParams
from glassbox.models.moe import MoEExperts
from glassbox.quant.held_experts import linear_bytes
from glassbox.tokenizer.hf_tokenizer import Tokenizer

PROJ = ("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj")


def _gguf(w: torch.Tensor, qtype: Q) -> torch.Tensor:
    a = w.float().numpy()
    return torch.from_numpy(
        np.asarray(gguf_dequantize(gguf_quantize(a, qtype), qtype)).reshape(a.shape).copy()
    )


def reference(w: torch.Tensor, quantization: str, table: bool) -> torch.Tensor:
    """``w`` as --quantization holds it, by the format's own definition (``table``: embedding / LM head)."""
    if quantization == "fp8":
        q, s = quantize(w, 1, w.shape[1])
        return dequantized(q, s, 1, w.shape[1])
    if quantization == "int4-asym":
        return _gguf(w, Q.Q8_0 if table else Q.Q4_1)  # token tables in 8 bits, as Q4_1 files keep them
    return _gguf(w, Q.Q8_0 if quantization == "int8" else Q.Q4_0)


@pytest.fixture(scope="module")
def base(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return build_tiny_model("qwen3_moe", tmp_path_factory.mktemp("qexperts"))


@pytest.mark.parametrize("quantization", ["int8", "int4", "int4-asym", "fp8"])
def test_quantized_experts_run_as_their_definition(base: Path, tmp_path: Path, quantization: str) -> None:
    floats = load_file(str(base / "model.safetensors"))
    dense = dict(floats)
    for key, w in floats.items():
        module = key.rpartition(".")[0]
        linear = module.endswith(PROJ)  # attention, dense MLPs and every expert; the routers (mlp.gate) stay
        table = key.startswith(("model.embed_tokens", "lm_head")) and quantization != "fp8"
        if linear or table:
            dense[key] = reference(w, quantization, table)
    ddir = write_checkpoint(base, tmp_path / "dense", dense, None)
    prompts = [Tokenizer.from_dir(base).encode(p) for p in PROMPTS]
    ref = hf_greedy(ddir, prompts, 8)
    llm = LLM(str(base), dtype="float32", device="cpu", quantization=quantization)
    experts = [m for m in llm.engine.executor.model.modules() if isinstance(m, MoEExperts)]
    assert experts and all(len(m.linears) == m.num_experts and m.gate_up_proj.numel() == 0 for m in experts)
    params = SamplingParams(temperature=0, max_tokens=8, ignore_eos=True, logprobs=1)
    for out, (toks, lps) in zip(llm.generate(prompts, params), ref, strict=True):
        assert out.token_ids == toks
        assert out.logprobs is not None
        assert max(abs(out.logprobs[j][t] - lps[j]) for j, t in enumerate(toks)) < 1e-4
    held = sum(linear_bytes(lin) for m in experts for pair in m.linears for lin in pair)
    weights = sum(t.numel() for k, t in floats.items() if ".experts." in k)
    bits = {"int8": 8.5, "int4": 4.5, "int4-asym": 5.0, "fp8": 8.0}[quantization]
    # blocks pad rows to 64 values: down_proj's 32-value rows (this tiny model's expert width) hold twice
    # their bytes, a third of the experts' weights; FP8 adds a float32 scale per row
    assert held <= weights * bits / 8 * 4 / 3 + 4 * 2 * 64 * len(experts) * experts[0].num_experts


def test_off_the_cpu_experts_stay_float(base: Path) -> None:
    """CUDA's fused MoE takes float parameters: quantize_at_load leaves the experts without ``experts``."""
    from glassbox.engine.checkpoint import open_checkpoint
    from glassbox.models.loader import build_model
    from glassbox.models.model_config import ModelConfig
    from glassbox.models.sources import resolve_model
    from glassbox.quant.at_load import quantize_at_load
    from glassbox.quant.formats import FORMATS

    ckpt = open_checkpoint(resolve_model(str(base)))
    model = build_model(ModelConfig.from_facts(ckpt.facts), None, torch.float32, torch.device("cpu"))
    quantize_at_load(model, FORMATS["q4_0"])
    assert all(
        not m.linears and m.gate_up_proj.numel() > 0 for m in model.modules() if isinstance(m, MoEExperts)
    )
