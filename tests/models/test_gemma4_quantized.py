"""Quantized Gemma 4 checkpoints through the readers every family shares (quant/): compressed-tensors FP8 per
channel, written here from the tiny models (tests/helpers/gemma4_models.py) with tests/quant/test_fp8_checkpoint.py's
quantizer and decoder (the format's definition): every linear of the text model in FP8 (the per-layer
inputs' ones too; the MoE router stays float, as llm-compressor leaves it), the routed experts one tensor per
expert as quantized MoE checkpoints store them. glassbox runs each in float32 token for token like
transformers runs the same weights dequantized (a plain checkpoint written beside it)."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from gemma4_models import KINDS, build_gemma4
from safetensors.torch import load_file
from test_fp8_checkpoint import ct_config, dequantized, quantize, write_checkpoint
from tiny_models import hf_greedy

from glassbox import LLM, SamplingParams
from glassbox.models.gemma4_layers import Gemma4DecoderLayer
from glassbox.quant.fp8.linear import Fp8Linear

LP_TOL = 1e-4  # float32 on both sides, as tests/models/test_gemma4.py derives it
PROMPTS = [list(range(3, 80)), [9, 8, 7], [5]]


def _channel(w: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """(E4M3 codes, per-row scales (N, 1), the dequantized weight) of one matrix, per channel."""
    n, k = w.shape
    q, s = quantize(w, 1, k)
    return q, s.reshape(n, 1), dequantized(q, s, 1, k)


def fp8_checkpoint(root: Path, kind: str) -> tuple[Path, Path]:
    """(the FP8 checkpoint, its weights dequantized as a plain float32 checkpoint)."""
    out = root / f"{kind}-fp8"
    if (out / "config.json").is_file():
        return out, root / f"{kind}-fp8-dense"
    base = build_gemma4(kind, root)
    floats = load_file(str(base / "model.safetensors"))
    quant, dense = dict(floats), dict(floats)
    for key, w in floats.items():
        prefix = key.removesuffix(".weight")
        if key.endswith("experts.gate_up_proj") or key.endswith("experts.down_proj"):
            del quant[key]
            for e in range(w.shape[0]):  # one tensor per expert: gate and up apart
                inter = w.shape[1] // 2
                parts = {"gate_proj": w[e, :inter], "up_proj": w[e, inter:]} if "gate_up" in key else {
                    "down_proj": w[e]
                }  # fmt: skip
                rows = []
                for proj, m in parts.items():
                    q, s, back = _channel(m)
                    name = f"{key.rpartition('.')[0]}.{e}.{proj}"
                    quant[f"{name}.weight"], quant[f"{name}.weight_scale"] = q, s
                    rows.append(back)
                dense[key][e] = torch.cat(rows)
        elif w.dim() == 2 and "embed" not in key and "router" not in key:
            q, s, back = _channel(w)
            quant[key], quant[f"{prefix}.weight_scale"], dense[key] = q, s, back
    qc = ct_config("channel", None, False, ["lm_head", "re:.*router.*"])
    return write_checkpoint(base, out, quant, qc), write_checkpoint(
        base, root / f"{kind}-fp8-dense", dense, None
    )


@pytest.mark.parametrize("kind", KINDS)
def test_fp8_checkpoint_runs_as_its_dequantized_weights(
    tmp_path_factory: pytest.TempPathFactory, kind: str
) -> None:
    qdir, ddir = fp8_checkpoint(tmp_path_factory.mktemp(f"g4-fp8-{kind}"), kind)
    ref = hf_greedy(ddir, PROMPTS, 8)
    llm = LLM(str(qdir), dtype="float32")
    model = llm.engine.executor.model
    assert sum(isinstance(m, Fp8Linear) for m in model.modules()) > 0
    for layer in (m for m in model.modules() if isinstance(m, Gemma4DecoderLayer)):
        if layer.experts is not None:  # each expert's two matrices kept 8-bit
            assert all(isinstance(m, Fp8Linear) for pair in layer.experts.linears for m in pair)
        assert isinstance(layer.mlp.down_proj, Fp8Linear)
    outs = llm.generate(PROMPTS, SamplingParams(temperature=0, max_tokens=8, ignore_eos=True, logprobs=1))
    for out, (toks, lps) in zip(outs, ref, strict=True):
        assert out.token_ids == toks
        assert out.logprobs is not None
        assert max(abs(out.logprobs[j][t] - lps[j]) for j, t in enumerate(toks)) < LP_TOL


def test_experts_stored_one_tensor_each(tmp_path: Path) -> None:
    """A float checkpoint storing each expert's gate, up and down apart (``experts.N.gate_proj.weight``: the
    layout quantized ones use, and what the engine widens them to off the CPU) fills the same rows of the
    fused parameters: transformers' tokens on the checkpoint it was split from."""
    base = build_gemma4("moe", tmp_path)
    floats = load_file(str(base / "model.safetensors"))
    split = {}
    for key, w in floats.items():
        if not key.endswith(("experts.gate_up_proj", "experts.down_proj")):
            split[key] = w
            continue
        module, inter = key.rpartition(".")[0], w.shape[1] // 2
        for e in range(w.shape[0]):
            if "gate_up" in key:
                split[f"{module}.{e}.gate_proj.weight"] = w[e, :inter]
                split[f"{module}.{e}.up_proj.weight"] = w[e, inter:]
            else:
                split[f"{module}.{e}.down_proj.weight"] = w[e]
    out = write_checkpoint(base, tmp_path / "per-expert", split, None)
    ref = hf_greedy(base, PROMPTS, 8)
    outs = LLM(str(out), dtype="float32").generate(
        PROMPTS, SamplingParams(temperature=0, max_tokens=8, ignore_eos=True)
    )
    assert [o.token_ids for o in outs] == [toks for toks, _ in ref]
