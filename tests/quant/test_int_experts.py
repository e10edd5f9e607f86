"""Integer-quantized mixture-of-experts checkpoints (Qwen3-30B-A3B's GPTQ-Int4 and w4a16 releases: each
expert's gate/up/down stored as its own GPTQ or compressed-tensors layer; quant/expert_parts.py): kept in
blocks as held experts on the CPU, float32 greedy token-exact with transformers running the weights as the
format defines them (tests/quant/test_gptq_awq.py's formula; the compressed-tensors package's decompression)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import torch
from safetensors.torch import load_file
from test_fp8_experts import held_experts_run_as, rewritten, tp2_matches_tp1
from test_gptq_awq import LINEARS, Layer, _write, pack_gptq
from test_gptq_awq import quant_config as gptq_config
from tiny_models import build_tiny_model

from glassbox import LLM
from glassbox.quant.blocks.linear import BlockQuantLinear
from glassbox.quant.held_experts import linear_bytes

FORMATS = ("gptq", "compressed-tensors")


def _quantize(fmt: str, w: torch.Tensor, seed: int) -> tuple[dict[str, torch.Tensor], torch.Tensor]:
    """(the layer's stored tensors, its weight as the format defines it, float32), groups of 32."""
    if fmt == "gptq":
        layer = Layer(w.shape[1], w.shape[0], 32, 4, act_order=False, zmin=1, seed=seed)
        return pack_gptq(layer, v1=True), layer.weight()
    from test_ct_int import compress

    return compress(w.float(), "w4a16-g32-asym", seed)


def _config(fmt: str) -> dict[str, Any]:
    if fmt == "gptq":
        return gptq_config("gptq", 4, 32, True, False)
    from test_ct_int import quant_config

    return quant_config("w4a16-g32-asym", ignore=["lm_head", "re:.*mlp.gate$"])


def moe_checkpoint(fmt: str, root: Path, **overrides: Any) -> tuple[Path, Path]:
    """(a tiny Qwen3-MoE whose every projection, its 8 experts' included, is 4-bit in groups of 32; the same
    weights as the format defines them, as a float32 checkpoint). Router and LM head stay float."""
    base = build_tiny_model("qwen3_moe", root, **overrides)
    floats = load_file(str(base / "model.safetensors"))
    quant, dense = dict(floats), dict(floats)
    for i, key in enumerate(sorted(n for n in floats if n.rpartition(".")[0].endswith(LINEARS))):
        stored, weight = _quantize(fmt, floats[key], seed=i)
        prefix = key.removesuffix(".weight")
        del quant[key]
        quant.update({f"{prefix}.{p}": t for p, t in stored.items()})
        dense[key] = weight
    return _write(base, root / fmt, quant, _config(fmt)), _write(base, root / "dense", dense, None)


@pytest.fixture(scope="module", params=FORMATS)
def moe_int4(
    request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory
) -> tuple[Path, Path, str]:
    """``moe_checkpoint`` of each format, and the format."""
    fmt = str(request.param)
    return (*moe_checkpoint(fmt, tmp_path_factory.mktemp(f"moe-{fmt}")), fmt)


def test_int4_experts_run_as_their_weights(moe_int4: tuple[Path, Path, str]) -> None:
    qdir, ddir, _ = moe_int4
    llm, held = held_experts_run_as(qdir, ddir)
    assert all(isinstance(lin, BlockQuantLinear) or hasattr(lin, "parts") for lin in held)
    # the experts are counted at their stored bytes (4-bit codes, a scale and a zero per 32), not four a weight
    dense = load_file(str(ddir / "model.safetensors"))
    in_experts = sum(t.numel() for k, t in dense.items() if ".experts." in k)
    assert sum(linear_bytes(lin) for lin in held) < in_experts
    assert llm.engine.executor.weight_bytes < sum(t.numel() * 4 for t in dense.values()) - 3 * in_experts


def test_missing_expert_part_is_named(moe_int4: tuple[Path, Path, str], tmp_path: Path) -> None:
    qdir, _, fmt = moe_int4
    tensors = load_file(str(qdir / "model.safetensors"))
    prefix = next(k for k in tensors if ".experts.3.up_proj." in k).rpartition(".")[0]
    for k in [k for k in tensors if k.startswith(prefix + ".")]:
        del tensors[k]
    with pytest.raises(ValueError, match=r"experts \[3\] lack a gate, up or down weight"):
        LLM(str(rewritten(qdir, tensors, tmp_path / "bad")), dtype="float32", device="cpu")


def test_off_the_cpu_the_experts_are_held_for_the_block_moe(moe_int4: tuple[Path, Path, str]) -> None:
    """For CUDA's fused block MoE the experts are held as on the CPU (the same blocks); act-order experts
    (the block MoE has no input permutation) are widened to float32 instead, every one."""
    import json

    from glassbox.quant.blocks.ct_int import read_ct_int
    from glassbox.quant.blocks.ct_int_config import ct_int_spec
    from glassbox.quant.blocks.gptq_awq import read_group_quant, with_experts
    from glassbox.quant.blocks.quantize import quantize
    from glassbox.quant.blocks.weights import BlockWeights
    from glassbox.quant.config import group_quant
    from glassbox.quant.held_experts import HeldExperts

    qdir, _, fmt = moe_int4
    qc = json.loads((qdir / "config.json").read_text())["quantization_config"]
    read: dict[bool, dict[str, Any]] = {}
    for cpu in (True, False):
        if fmt == "gptq":
            spec = group_quant(qc)
            assert spec is not None
            read[cpu] = read_group_quant(qdir, spec, cpu=cpu)[0]
        else:
            ct = ct_int_spec(qc)
            assert ct is not None
            read[cpu] = read_ct_int(qdir, ct, cpu=cpu)[0]
    assert read[False].keys() == read[True].keys()
    held = [v for v in read[False].values() if isinstance(v, HeldExperts)]
    assert held and all(h.gate_up is not None and h.down is not None for h in held)
    w = quantize(torch.randn(64, 64), 4)
    ordered = BlockWeights(**{**w.__dict__, "perm": torch.arange(63, -1, -1)})
    blocks = {"model.layers.0.mlp.experts.0.gate_proj": ordered, "model.layers.0.mlp.experts.0.up_proj": w}
    packed, rest = with_experts(blocks, False, "GPTQ", qdir, set())
    assert packed == {}
    assert [n for n, _ in rest][:2] == [f"{p}.weight" for p in blocks]


def test_tensor_parallel_splits_quantized_experts(tmp_path: Path) -> None:
    """TP=2 (GPTQ; compressed-tensors layers take the same path once decoded): each rank cuts every
    expert's gate/up rows and down's input columns (32 of 64: whole blocks) from the decoded codes and holds
    them per expert; TP=1's tokens."""
    tp2_matches_tp1(moe_checkpoint("gptq", tmp_path, moe_intermediate_size=64)[0])
