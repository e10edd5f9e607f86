"""FP8 checkpoints with routed experts (Qwen3-30B-A3B-FP8's layout: each expert's gate/up/down an E4M3
weight with its scale; quant/fp8/checkpoint.py): kept 8-bit as held experts on the CPU, greedy
token-exact in float32 with transformers running the weights dequantized by the format's definition
(tests/quant/test_fp8_checkpoint.py decodes E4M3 from its bits)."""

from __future__ import annotations

from collections.abc import Iterable
from pathlib import Path
from typing import Any

import pytest
import torch
from safetensors.torch import load_file, save_file
from test_fp8_checkpoint import LINEARS, PROMPTS, ct_config, dequantized, quantize, write_checkpoint
from tiny_models import build_tiny_model, hf_greedy

from glassbox import LLM, SamplingParams
from glassbox.models.moe import MoEExperts
from glassbox.quant.fp8.linear import Fp8Linear
from glassbox.tokenizer.hf_tokenizer import Tokenizer


@pytest.fixture(scope="module")
def moe_fp8(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    return fp8_moe(tmp_path_factory.mktemp("fp8moe"))


def fp8_moe(root: Path, **overrides: Any) -> tuple[Path, Path]:
    """(a tiny Qwen3-MoE whose every projection, its 8 experts' included, is FP8 with 16 x 32 blocks; the
    same weights dequantized, as a plain float32 checkpoint). Router and LM head stay float."""
    base = build_tiny_model("qwen3_moe", root, **overrides)
    floats = load_file(str(base / "model.safetensors"))
    quant, dense = dict(floats), dict(floats)
    for key in sorted(n for n in floats if n.rpartition(".")[0].endswith(LINEARS)):
        q, s = quantize(floats[key], 16, 32)
        quant[key] = q
        quant[key.replace(".weight", ".weight_scale")] = s
        dense[key] = dequantized(q, s, 16, 32)
    qc = ct_config("block", [16, 32], False, ["lm_head", "re:.*mlp.gate$"])
    return write_checkpoint(base, root / "fp8", quant, qc), write_checkpoint(
        base, root / "dense", dense, None
    )


def test_fp8_experts_run_as_their_dequantized_weights(moe_fp8: tuple[Path, Path]) -> None:
    llm, held = held_experts_run_as(*moe_fp8)
    assert all(isinstance(lin, Fp8Linear) for lin in held)
    # the experts are counted at one byte a weight (and their scales), not four
    dense = load_file(str(moe_fp8[1] / "model.safetensors"))
    in_experts = sum(t.numel() for k, t in dense.items() if ".experts." in k)
    assert llm.engine.executor.weight_bytes < sum(t.numel() * 4 for t in dense.values()) - 2.5 * in_experts


def test_missing_expert_part_is_named(moe_fp8: tuple[Path, Path], tmp_path: Path) -> None:
    qdir = moe_fp8[0]
    tensors = load_file(str(qdir / "model.safetensors"))
    name = next(k for k in tensors if k.endswith(".experts.3.up_proj.weight"))
    del tensors[name], tensors[name.replace(".weight", ".weight_scale")]
    with pytest.raises(ValueError, match=r"experts: FP8 experts \[3\] lack a gate, up or down weight"):
        LLM(str(rewritten(qdir, tensors, tmp_path / "bad")), dtype="float32", device="cpu")


def held_experts_run_as(qdir: Path, ddir: Path) -> tuple[LLM, list[torch.nn.Module]]:
    """(the engine on ``qdir``, its experts' linears): held per expert, float32 greedy token-exact with
    transformers on ``ddir`` (the same weights as the format defines them), logprobs within 1e-4."""
    prompts = [Tokenizer.from_dir(qdir).encode(p) for p in PROMPTS]
    ref = hf_greedy(ddir, prompts, 8)
    params = SamplingParams(temperature=0, max_tokens=8, ignore_eos=True, logprobs=1)
    llm = LLM(str(qdir), dtype="float32", device="cpu")
    experts = [m for m in llm.engine.executor.model.modules() if isinstance(m, MoEExperts)]
    assert experts and all(m.linears for m in experts)  # held: each expert's own linears
    held = [lin for m in experts for pair in m.linears for lin in pair]
    for out, (toks, lps) in zip(llm.generate(prompts, params), ref, strict=True):
        assert out.token_ids == toks
        assert out.logprobs is not None
        assert max(abs(out.logprobs[j][t] - lps[j]) for j, t in enumerate(toks)) < 1e-4
    return llm, held


def rewritten(qdir: Path, tensors: dict[str, torch.Tensor], out: Path) -> Path:
    """``qdir`` with ``tensors`` as its weights, at ``out``."""
    out.mkdir()
    for f in qdir.iterdir():
        if f.name != "model.safetensors":
            (out / f.name).write_bytes(f.read_bytes())
    save_file({k: v.contiguous() for k, v in tensors.items()}, str(out / "model.safetensors"))
    return out


def test_off_the_cpu_the_experts_are_widened(moe_fp8: tuple[Path, Path]) -> None:
    """For CUDA's fused MoE (float parameters): the experts come as float32 tensors, the definition's
    values; the dense FP8 layers stay 8-bit."""
    import json

    from glassbox.quant.fp8.checkpoint import read_fp8
    from glassbox.quant.fp8.config import fp8_spec
    from glassbox.quant.fp8.weights import Fp8Weights

    qdir, ddir = moe_fp8
    spec = fp8_spec(json.loads((qdir / "config.json").read_text())["quantization_config"])
    assert spec is not None
    widened_as_defined(*read_fp8(qdir, spec, cpu=False), ddir, Fp8Weights)


def widened_as_defined(
    packed: dict[str, Any], rest: Iterable[tuple[str, torch.Tensor]], ddir: Path, kind: type
) -> None:
    """A reader's output off the CPU: only dense layers packed (as ``kind``), every expert among the float
    tensors, equal to ``ddir``'s (the weights as the format defines them)."""
    assert packed and all(isinstance(w, kind) and ".experts." not in k for k, w in packed.items())
    floats, dense = dict(rest), load_file(str(ddir / "model.safetensors"))
    experts = [k for k in dense if ".experts." in k]
    assert experts and all(torch.equal(floats[k], dense[k]) for k in experts)


def test_tensor_parallel_splits_fp8_experts(tmp_path: Path) -> None:
    """TP=2: each expert's gate/up rows (32 of 64: whole 16-row scale blocks) and down's input columns (32:
    one 32-column scale block) cut from the FP8 weights with their scales, held per expert; TP=1's tokens."""
    tp2_matches_tp1(fp8_moe(tmp_path, moe_intermediate_size=64)[0])


def tp2_matches_tp1(qdir: Path) -> None:
    """The checkpoint's float32 greedy tokens and logprobs at TP=2 are TP=1's; rank 0 holds its experts."""
    from test_tensor_parallel import GREEDY, _check

    from glassbox.engine import tp_runtime

    prompts = [[1, 5, 9, 20, 33], list(range(3, 60))]
    one = LLM(str(qdir), dtype="float32", max_num_seqs=2)
    ref = [
        (o.token_ids, [o.logprobs[j][t] for j, t in enumerate(o.token_ids)])
        for o in one.generate(prompts, GREEDY)
    ]
    try:
        llm = LLM(str(qdir), dtype="float32", tensor_parallel_size=2, max_num_seqs=2)
        _check(llm.generate(prompts, GREEDY), ref, 1e-5)
        experts = [m for m in llm.engine.executor.model.modules() if isinstance(m, MoEExperts)]
        assert experts and all(m.linears for m in experts)
    finally:
        tp_runtime.shutdown()
