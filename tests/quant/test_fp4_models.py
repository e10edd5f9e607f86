"""4-bit float weights through the engine: a ModelOpt NVFP4 checkpoint of a tiny Llama and ``--quantization
mxfp4`` of a tiny Qwen3-MoE, each token-exact in float32 with transformers running the same weights
dequantized by the format's own definition (ModelOpt's, written out in test_fp4.py; transformers'
convert_moe_packed_tensors for MXFP4) and saved as a plain checkpoint."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
import torch
from safetensors.torch import load_file, save_file
from test_fp4 import nvfp4_dequantize
from tiny_models import build_tiny_model, hf_greedy
from transformers.integrations.mxfp4 import convert_moe_packed_tensors

from glassbox import LLM, SamplingParams
from glassbox.models.config_reader import read_config
from glassbox.models.moe import MoEExperts
from glassbox.quant.fp4.checkpoint import nvfp4_spec
from glassbox.quant.fp4.linear import FP4Linear
from glassbox.quant.fp4.quantize import quantize_mxfp4, quantize_nvfp4
from glassbox.quant.held_experts import HeldExperts
from glassbox.tokenizer.hf_tokenizer import Tokenizer

LINEARS = ("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj")
PROMPTS = ["def fibonacci(n):", "你好，世界", "class Foo:\n    def"]
MAX_NEW = 6
BF16_LOGPROB = 0.25  # as for GPTQ/AWQ checkpoints (test_gptq_awq.py): int8 activations on random models


def _write(
    src: Path, out: Path, tensors: dict[str, torch.Tensor], qc: dict | None, hf_quant: bool = False
) -> Path:
    out.mkdir(parents=True)
    for f in src.iterdir():
        if f.suffix != ".safetensors" and f.name != "config.json":
            (out / f.name).write_bytes(f.read_bytes())
    cfg = json.loads((src / "config.json").read_text())
    if qc is not None and hf_quant:  # ModelOpt's older export: the settings beside config.json
        (out / "hf_quant_config.json").write_text(
            json.dumps({"producer": {"name": "modelopt"}, "quantization": qc})
        )
    elif qc is not None:
        cfg["quantization_config"] = qc
    (out / "config.json").write_text(json.dumps(cfg))
    save_file({k: v.contiguous() for k, v in tensors.items()}, str(out / "model.safetensors"))
    return out


def _is_linear(name: str) -> bool:
    return name.endswith(".weight") and name.rpartition(".")[0].endswith(LINEARS)


def modelopt_qc(**override: Any) -> dict[str, Any]:
    """config.json's quantization_config as ModelOpt writes it for NVFP4 (lm_head left in bf16)."""
    return {"quant_method": "modelopt", "quant_algo": "NVFP4", "group_size": 16, "ignore": ["lm_head"],
            "producer": {"name": "modelopt", "version": "0.37.0"}} | override  # fmt: skip


@pytest.fixture(scope="module")
def root(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("fp4")


@pytest.fixture(scope="module")
def nvfp4_llama(root: Path) -> tuple[Path, Path]:
    return write_nvfp4_llama(root)


def write_nvfp4_llama(root: Path) -> tuple[Path, Path]:
    """(a ModelOpt NVFP4 checkpoint of a tiny Llama, its weights dequantized as a float32 checkpoint)."""
    # K = 96 and 160: 3 and 5 blocks, a partial 16-block chunk each
    base = build_tiny_model("llama", root, hidden_size=96, intermediate_size=160)
    floats = load_file(str(base / "model.safetensors"))
    quant, dense = dict(floats), dict(floats)
    for name in [n for n in floats if _is_linear(n)]:
        prefix = name.removesuffix(".weight")
        weight, scale, scale_2 = quantize_nvfp4(floats[name])
        quant.update({name: weight, f"{prefix}.weight_scale": scale, f"{prefix}.weight_scale_2": scale_2,
                      f"{prefix}.input_scale": torch.tensor(0.02)})  # fmt: skip
        dense[name] = nvfp4_dequantize(weight, scale, scale_2)
    return _write(base, root / "nvfp4", quant, modelopt_qc()), _write(base, root / "nvfp4-dense", dense, None)


def _greedy_matches(llm: LLM, prompts: list[list[int]], ref: list, lp_tol: float) -> None:
    params = SamplingParams(temperature=0, max_tokens=MAX_NEW, ignore_eos=True, logprobs=1)
    for out, (toks, lps) in zip(llm.generate(prompts, params), ref, strict=True):
        assert out.token_ids == toks
        assert out.logprobs is not None
        assert max(abs(out.logprobs[j][t] - lps[j]) for j, t in enumerate(toks)) < lp_tol


def _bf16_top_choices(llm: LLM, prompts: list[list[int]], ref_dir: Path) -> None:
    """bf16 (prompt rows multiply the dequantized weight, decode rows run the int8-activation kernel): each
    greedy pick is a top choice of transformers in float32 on ``ref_dir`` (the dequantized weights, or a
    checkpoint it dequantizes itself), teacher-forced on the engine's tokens, its logprob within
    BF16_LOGPROB (random tiny models' distributions are nearly flat, so bf16 rounding may swap near-equal
    picks)."""
    import transformers as tf

    model = tf.AutoModelForCausalLM.from_pretrained(ref_dir, dtype=torch.float32)
    params = SamplingParams(temperature=0, max_tokens=MAX_NEW, ignore_eos=True, logprobs=0)
    for prompt, out in zip(prompts, llm.generate(prompts, params), strict=True):
        with torch.no_grad():
            logits = model(torch.tensor([prompt + out.token_ids])).logits[0].float()
        ref = torch.log_softmax(logits, -1)[len(prompt) - 1 : -1]
        assert out.logprobs is not None
        for j, t in enumerate(out.token_ids):
            assert ref[j, t] >= ref[j].max() - BF16_LOGPROB, f"token {j}: bf16 pick is not a top choice"
            assert abs(out.logprobs[j][t] - float(ref[j, t])) < BF16_LOGPROB


def test_nvfp4_checkpoint_runs_as_its_dequantized_weights(nvfp4_llama: tuple[Path, Path]) -> None:
    qdir, ddir = nvfp4_llama
    prompts = [Tokenizer.from_dir(qdir).encode(p) for p in PROMPTS]
    ref = hf_greedy(ddir, prompts, MAX_NEW)
    llm = LLM(str(qdir), dtype="float32", device="cpu")
    ex = llm.engine.executor
    layers = [m for m in ex.model.modules() if isinstance(m, FP4Linear)]
    assert len(layers) == 2 * 4 and all(m.w.kind == "nvfp4" for m in layers)  # fused q/k/v, gate/up; o; down
    assert ex.block_formats == ["NVFP4"]
    _greedy_matches(llm, prompts, ref, 1e-4)
    _bf16_top_choices(LLM(str(qdir), dtype="bfloat16", device="cpu"), prompts, ddir)


def test_nvfp4_settings(root: Path, nvfp4_llama: tuple[Path, Path]) -> None:
    """hf_quant_config.json (ModelOpt's older export) is read as config.json's quantization_config is; a
    group size other than 16, another FP4 algorithm, or a device other than the CPU is one clear error."""
    qdir, _ = nvfp4_llama
    tensors = load_file(str(qdir / "model.safetensors"))
    legacy = {
        "quant_algo": "NVFP4",
        "group_size": 16,
        "exclude_modules": ["lm_head"],
        "kv_cache_quant_algo": None,
    }
    old = _write(qdir, root / "nvfp4-legacy", tensors, legacy, hf_quant=True)
    spec = nvfp4_spec(read_config(old)["quantization_config"])
    assert spec is not None and spec.algo == "NVFP4" and spec.exclude == ("lm_head",)
    assert nvfp4_spec(modelopt_qc(quant_algo="FP8")) is None  # not this loader's
    for override, match in [({"group_size": 32}, "quantization_config group_size=32"),
                            ({"quant_algo": "NVFP4_AWQ"}, "quantization_config quant_algo='NVFP4_AWQ'")]:  # fmt: skip
        with pytest.raises(ValueError, match=match):
            nvfp4_spec(modelopt_qc(**override))
    bad = _write(qdir, root / "nvfp4-g32", tensors, modelopt_qc(group_size=32))
    with pytest.raises(ValueError, match="quantization_config group_size=32"):
        LLM(str(bad), dtype="float32", device="cpu")
    with pytest.raises(
        ValueError, match="NVFP4 weights run on the CPU in bf16 or float32, and on CUDA with triton"
    ):
        LLM(str(qdir), dtype="float16", device="cpu")


def _dequantized(w: torch.Tensor, kind: str) -> torch.Tensor:
    """A weight (N, K) quantized in ``kind``, dequantized by the format's own definition: transformers'
    for gpt-oss's MXFP4 layout, ModelOpt's (test_fp4.py) for NVFP4."""
    if kind == "mxfp4":
        blocks, scales = quantize_mxfp4(w)
        return convert_moe_packed_tensors(blocks[None], scales[None], dtype=torch.float32)[0].t()
    return nvfp4_dequantize(*quantize_nvfp4(w))


def _fused_groups(names: list[str]) -> list[list[str]]:
    """The checkpoint's linear weights as glassbox holds them: q/k/v fused, gate/up fused (dense MLPs and
    each expert), the others alone (NVFP4's per-tensor scale spans a fused matrix)."""
    groups = []
    for n in names:
        if n.endswith(("k_proj.weight", "v_proj.weight", "up_proj.weight")):
            continue
        if n.endswith("q_proj.weight"):
            groups.append([n, n.replace("q_proj", "k_proj"), n.replace("q_proj", "v_proj")])
        elif n.endswith("gate_proj.weight"):
            groups.append([n, n.replace("gate_proj", "up_proj")])
        else:
            groups.append([n])
    return groups


@pytest.mark.parametrize("kind", ["mxfp4", "nvfp4"])
def test_quantized_moe_runs_as_its_dequantized_weights(root: Path, kind: str) -> None:
    """``--quantization mxfp4|nvfp4``: attention, dense MLP and every expert (router, embeddings and the
    LM head stay); the experts are held packed (their 3-D tensors freed) and run grouped."""
    base = build_tiny_model("qwen3_moe", root)
    floats = load_file(str(base / "model.safetensors"))
    dense = dict(floats)
    for group in _fused_groups(sorted(n for n in floats if _is_linear(n))):
        rows = [floats[n].shape[0] for n in group]
        for n, part in zip(
            group, _dequantized(torch.cat([floats[n] for n in group]), kind).split(rows), strict=True
        ):
            dense[n] = part
    ddir = _write(base, root / f"qwen3-moe-{kind}-dense", dense, None)
    prompts = [Tokenizer.from_dir(base).encode(p) for p in PROMPTS]
    ref = hf_greedy(ddir, prompts, MAX_NEW)
    llm = LLM(str(base), dtype="float32", device="cpu", quantization=kind)
    ex = llm.engine.executor
    experts = [m for m in ex.model.modules() if isinstance(m, MoEExperts)]
    assert experts and all(len(m.linears) == m.num_experts and m.gate_up_proj.numel() == 0 for m in experts)
    assert ex.block_formats == [kind]
    held = sum(p.numel() * p.element_size() for p in ex.model.parameters())
    quantized = sum(t.numel() for n, t in floats.items() if _is_linear(n))
    if kind == "mxfp4":
        assert ex.weight_bytes - held == quantized * 17 // 32  # 4.25 bits a weight
    _greedy_matches(llm, prompts, ref, 1e-4)
    _bf16_top_choices(LLM(str(base), dtype="bfloat16", device="cpu", quantization=kind), prompts, ddir)


def write_gpt_oss_mxfp4(base: Path, out: Path) -> Path:
    """A gpt-oss checkpoint in its own MXFP4 release's layout (experts' ``*_blocks`` / ``*_scales``)."""
    tensors = load_file(str(base / "model.safetensors"))
    for name in [n for n in tensors if n.endswith((".experts.gate_up_proj", ".experts.down_proj"))]:
        w = tensors.pop(name).transpose(1, 2)  # stored (E, K, N): as MXFP4, one (N, K) matrix per expert
        parts = [quantize_mxfp4(w[e]) for e in range(w.shape[0])]
        tensors[f"{name}_blocks"] = torch.stack([b for b, _ in parts])
        tensors[f"{name}_scales"] = torch.stack([s for _, s in parts])
    qc = {"quant_method": "mxfp4", "modules_to_not_convert": ["model.layers.*.self_attn", "model.layers.*.mlp.router",
                                                               "model.embed_tokens", "lm_head"]}  # fmt: skip
    return _write(base, out, tensors, qc)


def test_gpt_oss_mxfp4_checkpoint_runs_as_transformers_loads_it(root: Path) -> None:
    """gpt-oss's own MXFP4 format (experts' ``*_blocks`` / ``*_scales``, the rest float): transformers
    loads the checkpoint itself (on the CPU it dequantizes the experts), glassbox keeps the experts packed;
    token-exact in float32."""
    qdir = write_gpt_oss_mxfp4(build_tiny_model("gpt_oss", root), root / "gpt-oss-mxfp4")
    prompts = [Tokenizer.from_dir(qdir).encode(p) for p in PROMPTS]
    ref = hf_greedy(qdir, prompts, MAX_NEW)
    llm = LLM(str(qdir), dtype="float32", device="cpu")
    experts = [m for m in llm.engine.executor.model.modules() if isinstance(m, MoEExperts)]
    assert experts and all(len(m.linears) == m.num_experts and m.gate_up_proj.numel() == 0 for m in experts)
    assert all(m.gate_up_proj_bias is not None for m in experts)  # biases load as float tensors
    assert llm.engine.executor.block_formats == ["MXFP4"]
    _greedy_matches(llm, prompts, ref, 1e-4)
    _bf16_top_choices(LLM(str(qdir), dtype="bfloat16", device="cpu"), prompts, qdir)


def test_gpt_oss_mxfp4_experts_held_on_cuda(root: Path) -> None:
    """On CUDA the reader holds gpt-oss's MXFP4 experts too (for the fused block MoE): each expert's matrix
    dequantizes to transformers' dequantization of the checkpoint's blocks."""
    from glassbox.quant.fp4.checkpoint import read_fp4

    base = build_tiny_model("gpt_oss", root / "widen")
    tensors = load_file(str(base / "model.safetensors"))
    packed: dict[str, torch.Tensor] = {}
    for name in [n for n in tensors if n.endswith((".experts.gate_up_proj", ".experts.down_proj"))]:
        w = tensors.pop(name).transpose(1, 2)
        parts = [quantize_mxfp4(w[e]) for e in range(w.shape[0])]
        tensors[f"{name}_blocks"] = packed[f"{name}_blocks"] = torch.stack([b for b, _ in parts])
        tensors[f"{name}_scales"] = packed[f"{name}_scales"] = torch.stack([s for _, s in parts])
    qc = {"quant_method": "mxfp4"}
    qdir = _write(base, root / "gpt-oss-mxfp4-widen", tensors, qc)
    got = read_fp4(qdir, qc, torch.device("cuda"), torch.bfloat16)
    assert got is not None
    held, rest = got
    assert not any(n.endswith(("_blocks", "_scales")) for n, _ in rest)
    for name in [n.removesuffix("_blocks") for n in packed if n.endswith("_blocks")]:
        ref = convert_moe_packed_tensors(
            packed[f"{name}_blocks"], packed[f"{name}_scales"], dtype=torch.float32
        )
        module, _, proj = name.rpartition(".")
        experts = held[module]
        assert isinstance(experts, HeldExperts) and experts.gate_up is not None and experts.down is not None
        mats = [p[0] for p in experts.gate_up] if proj == "gate_up_proj" else list(experts.down)
        got_w = torch.stack([w.dequantize(torch.float32).t() for w in mats])
        assert got_w.shape == ref.shape and torch.equal(got_w, ref), name
