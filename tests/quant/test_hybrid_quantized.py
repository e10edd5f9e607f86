"""Quantized checkpoints of the hybrid families (Nemotron-H, Qwen3-Next, Qwen3.5, Qwen3.5-MoE) through the
readers every family shares (quant/): ModelOpt NVFP4 (as NVIDIA ships Nemotron 3) and Hugging Face's
block-scaled FP8 (128 x 128 blocks, as Qwen3-Next-80B-A3B-Instruct-FP8 ships), written here from the tiny
models of tests/helpers/hybrid_models.py with the formats' own definitions (tests/quant/test_fp4.py,
tests/quant/test_fp8_checkpoint.py). Quantized, as those releases leave them: every linear of the mixers
(Mamba-2 in_proj/out_proj, Gated DeltaNet's input projections and out_proj, attention), MLPs, routed and
shared experts; float: embeddings, LM head, routers and the shared-expert gate, conv1d, A_log, D, dt_bias,
norms. glassbox runs each in float32 token for token like transformers runs the same weights dequantized
(a plain checkpoint written beside it), with the quantized linears kept in their format."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import torch
from hybrid_models import build_hybrid_model
from safetensors.torch import load_file
from test_fp4 import nvfp4_dequantize
from test_fp4_models import modelopt_qc
from test_fp8_checkpoint import HF_FP8, ct_config, dequantized, quantize, write_checkpoint
from tiny_models import hf_greedy

from glassbox import LLM, SamplingParams
from glassbox.quant.fp4.linear import FP4Linear
from glassbox.quant.fp4.quantize import quantize_nvfp4
from glassbox.quant.fp8.linear import Fp8Linear

# float32 on both sides: the two engines differ only in summation order (~1e-6 relative per logit at these
# widths, seen <= 3e-5 in logprobs over 8 steps), as tests/models/test_hybrid_parity.py bounds the same
LP_TOL = 1e-4
PROMPTS = [list(range(3, 40)), [9, 8, 7], [5]]  # 37 tokens: past two of Nemotron-H's 16-token scan chunks
MAX_NEW = 8
FLOAT_2D = (
    "mlp.gate.weight",
    "mixer.gate.weight",
    "shared_expert_gate.weight",
)  # routers, as the tools leave them
FP8_BLOCK = 128

Quantize = Callable[[torch.Tensor], tuple[dict[str, torch.Tensor], torch.Tensor]]


def _nvfp4(w: torch.Tensor) -> tuple[dict[str, torch.Tensor], torch.Tensor]:
    """One matrix as ModelOpt stores it and as ModelOpt's definition dequantizes it."""
    weight, scale, scale_2 = quantize_nvfp4(w)
    stored = {
        "weight": weight,
        "weight_scale": scale,
        "weight_scale_2": scale_2,
        "input_scale": torch.tensor(0.02),
    }
    return stored, nvfp4_dequantize(weight, scale, scale_2)


def _fp8(w: torch.Tensor) -> tuple[dict[str, torch.Tensor], torch.Tensor]:
    """One matrix as HF's fp8 (128 x 128 blocks, ``weight_scale_inv``) stores it, and dequantized."""
    q, s = quantize(w, FP8_BLOCK, FP8_BLOCK)
    return {"weight": q, "weight_scale_inv": s}, dequantized(q, s, FP8_BLOCK, FP8_BLOCK)


def _ct_fp8(w: torch.Tensor) -> tuple[dict[str, torch.Tensor], torch.Tensor]:
    """One matrix as compressed-tensors stores FP8 per channel (``weight_scale`` (N, 1)), and dequantized."""
    n, k = w.shape
    q, s = quantize(w, 1, k)
    return {"weight": q, "weight_scale": s.reshape(n, 1)}, dequantized(q, s, 1, k)


# format -> (quantize one matrix, config.json's quantization_config, the linear glassbox keeps it in)
FORMATS: dict[str, tuple[Quantize, dict[str, Any], type]] = {
    "nvfp4": (_nvfp4, modelopt_qc(ignore=["lm_head", "*mlp.gate", "*mixer.gate", "*shared_expert_gate"]), FP4Linear),
    "fp8": (_fp8, HF_FP8 | {"modules_to_not_convert": ["lm_head", "mlp.gate", "mixer.gate", "shared_expert_gate"]}, Fp8Linear),
    "ct-fp8": (_ct_fp8, ct_config("channel", None, False, ["lm_head", "re:.*mlp.gate$", "re:.*mixer.gate$", "re:.*shared_expert_gate$"]), Fp8Linear),
}  # fmt: skip


def quantized_hybrid(root: Path, arch: str, fmt: str, also: tuple[str, ...] = ()) -> tuple[Path, Path]:
    """(``arch``'s tiny model with its linears stored in ``fmt``, the same weights dequantized as a plain
    float32 checkpoint). ``also``: float tensors (name suffixes) quantized too, against the config."""
    tag = f"{arch}-{fmt}" + "".join(f"-{a}" for a in also)
    out, dense_dir = root / tag, root / f"{tag}-dense"
    if (out / "config.json").is_file():
        return out, dense_dir
    base = build_hybrid_model(arch, root)
    quant_fn, qc, _ = FORMATS[fmt]
    if also:  # the config then lists them as quantized (no longer among its exclusions)
        qc = {k: [p for p in v if not p.endswith(tuple(a.removesuffix(".weight") for a in also))]
              if k in ("ignore", "modules_to_not_convert") else v for k, v in qc.items()}  # fmt: skip
    floats = load_file(str(base / "model.safetensors"))
    quant, dense = dict(floats), dict(floats)
    for key, w in sorted(floats.items()):
        linear = w.dim() == 2 and key.endswith(".weight") and not key.endswith(FLOAT_2D)
        if (linear and "embed" not in key and not key.startswith("lm_head")) or key.endswith(also):
            stored, back = quant_fn(w)
            del quant[key]
            quant.update({f"{key.removesuffix('.weight')}.{p}": t for p, t in stored.items()})
            dense[key] = back
    return write_checkpoint(base, out, quant, qc), write_checkpoint(base, dense_dir, dense, None)


def _kept_everywhere(model: torch.nn.Module, kept: type) -> int:
    """Every linear but the LM head and the routers runs ``kept``, each routed expert's too; returns how
    many kept linears the model holds."""
    floats = [
        n
        for n, m in model.named_modules()
        if isinstance(m, torch.nn.Linear) and not isinstance(m, kept) and n != "lm_head"
    ]
    assert all(n.endswith(("mlp.gate", "shared_expert_gate")) for n in floats), floats
    for name, m in model.named_modules():
        if name.endswith((".in_proj", ".out_proj", ".o_proj", ".down_proj", "in_proj_qkvz", "in_proj_qkv")):
            assert isinstance(m, kept), (name, type(m).__name__)
        if name.endswith(".experts"):  # routed experts: each expert's matrices held in the format
            linears = getattr(m, "kept", None) or [x for pair in getattr(m, "linears", []) for x in pair]
            parts = [p for x in linears for p in ([x] if isinstance(x, kept) else getattr(x, "parts", [x]))]
            assert parts and all(isinstance(p, kept) for p in parts), name
    return sum(isinstance(m, kept) for m in model.modules())


@pytest.fixture(scope="module")
def root(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("hybrid-quant")


@pytest.mark.parametrize(
    ("arch", "fmt"),
    [("nemotron_h", "nvfp4"), ("qwen3_next", "nvfp4"), ("qwen3_5", "nvfp4"), ("qwen3_5_moe", "nvfp4"),
     ("nemotron_h", "fp8"), ("qwen3_next", "fp8"), ("qwen3_5_moe", "ct-fp8")],
)  # fmt: skip
def test_checkpoint_runs_as_its_dequantized_weights(root: Path, arch: str, fmt: str) -> None:
    qdir, ddir = quantized_hybrid(root, arch, fmt)
    ref = hf_greedy(ddir, PROMPTS, MAX_NEW)
    llm = LLM(str(qdir), dtype="float32", device="cpu")
    assert _kept_everywhere(llm.engine.executor.model, FORMATS[fmt][2]) > 0
    params = SamplingParams(temperature=0, max_tokens=MAX_NEW, ignore_eos=True, logprobs=1)
    for out, (toks, lps) in zip(llm.generate(PROMPTS, params), ref, strict=True):
        assert out.token_ids == toks
        assert out.logprobs is not None
        assert max(abs(out.logprobs[j][t] - lps[j]) for j, t in enumerate(toks)) < LP_TOL


@pytest.mark.parametrize("fmt", ["nvfp4", "fp8"])
def test_quantized_tensor_without_a_linear_is_one_error(root: Path, fmt: str) -> None:
    """Nemotron-H's router (a sigmoid-scored weight, no linear layer) stored quantized: one error naming it."""
    qdir, _ = quantized_hybrid(root, "nemotron_h", fmt, also=("mixer.gate.weight",))
    with pytest.raises(ValueError, match=r"layers\.5\.mixer\.gate\.weight: .*NemotronHRouter"):
        LLM(str(qdir), dtype="float32", device="cpu")


def test_nvfp4_at_load_runs_as_the_definition(root: Path) -> None:
    """``quantization="nvfp4"`` on a float Nemotron-H: every linear and each routed expert quantized at
    load as ModelOpt's tools quantize them, so transformers on the NVFP4 checkpoint's dequantized weights
    (the same quantizer, the same definition) is the reference."""
    _, ddir = quantized_hybrid(root, "nemotron_h", "nvfp4")
    ref = hf_greedy(ddir, PROMPTS, MAX_NEW)
    llm = LLM(
        str(build_hybrid_model("nemotron_h", root)), dtype="float32", device="cpu", quantization="nvfp4"
    )
    _kept_everywhere(llm.engine.executor.model, FP4Linear)
    params = SamplingParams(temperature=0, max_tokens=MAX_NEW, ignore_eos=True, logprobs=1)
    for out, (toks, lps) in zip(llm.generate(PROMPTS, params), ref, strict=True):
        assert out.token_ids == toks
        assert out.logprobs is not None
        assert max(abs(out.logprobs[j][t] - lps[j]) for j, t in enumerate(toks)) < LP_TOL
