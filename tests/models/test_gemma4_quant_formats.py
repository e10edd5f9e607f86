"""Gemma 4 checkpoints in the 4- and 8-bit formats other families read through quant/'s shared readers:
compressed-tensors integer (llm-compressor's pack-quantized W4A16 / W8A16 and int-quantized W8A8, written
by the compressed-tensors package's own compressors: tests/quant/test_ct_int.py) and ModelOpt NVFP4 (its
layout and dequantization as ModelOpt defines them: tests/quant/test_fp4.py), of the tiny models of
tests/helpers/gemma4_models.py. Every linear of the text model is quantized (attention, dense MLP, the
per-layer inputs' gate, projection and model projection, each routed expert stored one tensor group per
projection as quantized MoE releases store them); embeddings, the MoE router and the LM head stay float, as
the formats' tools leave them. glassbox runs each in float32 token for token like transformers runs the
same weights dequantized (a plain checkpoint written beside it; tests/models/test_gemma4_quantized.py does
the same for FP8)."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import torch
from gemma4_models import build_gemma4
from safetensors.torch import load_file
from test_fp4 import nvfp4_dequantize
from test_fp4_models import modelopt_qc
from test_fp8_checkpoint import write_checkpoint
from tiny_models import hf_greedy

from glassbox import LLM, SamplingParams
from glassbox.models.gemma4_layers import Gemma4DecoderLayer
from glassbox.quant.blocks.linear import BlockQuantLinear
from glassbox.quant.fp4.linear import FP4Linear
from glassbox.quant.fp4.quantize import quantize_nvfp4

pytest.importorskip("compressed_tensors")
from test_ct_int import compress, quant_config  # noqa: E402  (needs compressed_tensors)

LP_TOL = 1e-4  # float32 on both sides, as tests/models/test_gemma4.py derives it
PROMPTS = [list(range(3, 80)), [9, 8, 7], [5]]
# Real Gemma 4 checkpoints have 256-wide per-layer inputs; the tiny dense model's default (8) is narrower
# than one scale group of either format (32 input channels for CT int g32, 16 for NVFP4): 32 here.
PER_LAYER = {"dense": {"hidden_size_per_layer_input": 32}, "moe": {}}

NVFP4_QC = modelopt_qc(ignore=["lm_head", "*router*"])  # as ModelOpt exports it: LM head and routers excluded

Quantize = Callable[[torch.Tensor, int], tuple[dict[str, torch.Tensor], torch.Tensor]]


def _nvfp4(w: torch.Tensor, seed: int) -> tuple[dict[str, torch.Tensor], torch.Tensor]:
    """One matrix as ModelOpt stores it (weight, weight_scale, weight_scale_2, input_scale) and as ModelOpt's
    definition dequantizes it."""
    weight, scale, scale_2 = quantize_nvfp4(w)
    stored = {
        "weight": weight,
        "weight_scale": scale,
        "weight_scale_2": scale_2,
        "input_scale": torch.tensor(0.02),
    }
    return stored, nvfp4_dequantize(weight, scale, scale_2)


def _ct(case: str) -> Quantize:
    return lambda w, seed: compress(w.float(), case, seed)


def quantized_gemma4(
    root: Path, kind: str, tag: str, quantize: Quantize, qc: dict[str, Any]
) -> tuple[Path, Path]:
    """(a ``kind`` tiny Gemma 4 with every linear of the text model quantized by ``quantize`` and config.json's
    ``qc``, the same weights dequantized as a plain float32 checkpoint). The routed experts (stored by
    transformers as fused (E, 2I, H) / (E, H, I) tensors) are written one tensor group per expert and
    projection (``experts.N.gate_proj.*``)."""
    out = root / f"{kind}-{tag}"
    if (out / "config.json").is_file():
        return out, root / f"{kind}-{tag}-dense"
    base = build_gemma4(kind, root, **PER_LAYER[kind])
    floats = load_file(str(base / "model.safetensors"))
    quant, dense = dict(floats), dict(floats)
    seed = 0
    for key, w in sorted(floats.items()):
        if key.endswith(("experts.gate_up_proj", "experts.down_proj")):
            del quant[key]
            module, inter = key.rpartition(".")[0], w.shape[1] // 2
            for e in range(w.shape[0]):
                parts = {"gate_proj": w[e, :inter], "up_proj": w[e, inter:]} if "gate_up" in key else {
                    "down_proj": w[e]
                }  # fmt: skip
                rows = []
                for proj, m in parts.items():
                    stored, back = quantize(m, seed := seed + 1)
                    quant.update({f"{module}.{e}.{proj}.{p}": t for p, t in stored.items()})
                    rows.append(back)
                dense[key][e] = torch.cat(rows)
        elif w.dim() == 2 and "embed" not in key and "router" not in key:
            stored, back = quantize(w, seed := seed + 1)
            del quant[key]
            prefix = key.removesuffix(".weight")
            quant.update({f"{prefix}.{p}": t for p, t in stored.items()})
            dense[key] = back
    return write_checkpoint(base, out, quant, qc), write_checkpoint(
        base, root / f"{kind}-{tag}-dense", dense, None
    )


def _kept_everywhere(model: torch.nn.Module, kept: type) -> None:
    """Every linear of the text model but the router runs ``kept`` (glassbox's fused q/k/v and gate/up
    included), the per-layer inputs' three among them; each expert's gate/up (stacked by rows, or side by
    side: ``parts``) and down too. Only the LM head and the router stay float."""
    names = {n for n, m in model.named_modules() if isinstance(m, kept)}
    floats = {
        n for n, m in model.named_modules() if isinstance(m, torch.nn.Linear) and not isinstance(m, kept)
    }
    assert floats <= {"lm_head"} | {n for n in floats if ".router." in n}, sorted(floats)
    layers = [(n, m) for n, m in model.named_modules() if isinstance(m, Gemma4DecoderLayer)]
    assert layers
    for name, layer in layers:
        assert {f"{name}.self_attn.o_proj", f"{name}.mlp.down_proj"} <= names
        if layer.per_layer_input_size:
            assert {f"{name}.per_layer_input_gate", f"{name}.per_layer_projection"} <= names
            assert "model.per_layer_model_projection" in names
        if layer.experts is not None:
            assert len(layer.experts.linears) == layer.experts.num_experts
            for pair in layer.experts.linears:
                for m in pair:
                    parts = [m] if isinstance(m, kept) else list(getattr(m, "parts", []))
                    assert parts and all(isinstance(p, kept) for p in parts), type(m).__name__


def _runs_as(qdir: Path, ddir: Path, kept: type) -> LLM:
    ref = hf_greedy(ddir, PROMPTS, 8)
    llm = LLM(str(qdir), dtype="float32", device="cpu")
    _kept_everywhere(llm.engine.executor.model, kept)
    outs = llm.generate(PROMPTS, SamplingParams(temperature=0, max_tokens=8, ignore_eos=True, logprobs=1))
    for out, (toks, lps) in zip(outs, ref, strict=True):
        assert out.token_ids == toks
        assert out.logprobs is not None
        assert max(abs(out.logprobs[j][t] - lps[j]) for j, t in enumerate(toks)) < LP_TOL
    return llm


@pytest.fixture(scope="module")
def root(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """One folder for the module: each tiny model is built once, each checkpoint written once."""
    return tmp_path_factory.mktemp("g4-quant")


# W4A16 in groups of 32 on both models; W8A16 per channel on the MoE; W8A8's int8 weights on the dense one
CT_CASES = [("dense", "w4a16-g32-asym"), ("moe", "w4a16-g32-asym"), ("moe", "w8a16-channel-asym"),
            ("dense", "w8a8-int")]  # fmt: skip


@pytest.mark.parametrize(("kind", "case"), CT_CASES)
def test_compressed_tensors_int_runs_as_its_decompressed_weights(root: Path, kind: str, case: str) -> None:
    qc = quant_config(case, ignore=["lm_head", "re:.*router.*"])
    qdir, ddir = quantized_gemma4(root, kind, case, _ct(case), qc)
    llm = _runs_as(qdir, ddir, BlockQuantLinear)
    bits = 4 if case.startswith("w4") else 8
    assert all(f.startswith(f"CT int{bits} ") for f in llm.engine.executor.block_formats)


@pytest.mark.parametrize("kind", ["dense", "moe"])
def test_modelopt_nvfp4_runs_as_its_dequantized_weights(root: Path, kind: str) -> None:
    qdir, ddir = quantized_gemma4(root, kind, "nvfp4", _nvfp4, NVFP4_QC)
    llm = _runs_as(qdir, ddir, FP4Linear)
    assert llm.engine.executor.block_formats == ["NVFP4"]


def test_nvfp4_experts_refused_under_tensor_parallelism(root: Path) -> None:
    """A rank's shard reader has no cut of NVFP4 experts yet: the load stops naming the first expert."""
    from glassbox.engine.checkpoint import open_checkpoint
    from glassbox.models.model_config import ModelConfig
    from glassbox.models.sources import resolve_model
    from glassbox.quant.fp4.shards import sharded_fp4

    qdir, _ = quantized_gemma4(root, "moe", "nvfp4", _nvfp4, NVFP4_QC)
    ckpt = open_checkpoint(resolve_model(str(qdir)))
    match = r"size 2: model\.layers\.0\.experts\.0\.down_proj: NVFP4 routed experts are not read under tensor"
    with pytest.raises(ValueError, match=match):
        sharded_fp4(qdir, ckpt.facts.quantization_config, ModelConfig.from_facts(ckpt.facts), 0, 2)
