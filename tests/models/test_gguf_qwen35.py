"""GGUF files of Qwen3.5 and Qwen3.5-MoE (llama.cpp's ``qwen35`` / ``qwen35moe``), written as llama.cpp's
converter writes them (tests/helpers/hybrid_gguf_factory.py: the gguf package's name map; the converter's
norm, A_log, dt_bias and conv transforms; its grouped-to-tiled v-head reorder, out_proj's columns included)
from tiny random transformers models, read back by glassbox with the v heads kept in the file's order.

References: transformers on the source checkpoint (float32 files: greedy token-exact, logprobs within
LP_TOL = 1e-4, as tests/models/test_hybrid_parity.py argues; the file's transforms add at most one float32
rounding per weight, ~1e-7 relative); for quantized files transformers on the file's matrices as
gguf.quants quantizes and dequantizes them in the file's layout, put back in Hugging Face's order
(hybrid_gguf_factory.quantized_hf_state): the engine holds those very values in float32, so the same bound.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import numpy as np
import pytest
import torch
from gguf import GGMLQuantizationType as Q
from hybrid_gguf_factory import quantized_hf_state, tiled_v_heads, write_qwen3next_gguf
from hybrid_models import build_hybrid_model, reference
from safetensors.numpy import load_file, save_file
from test_hybrid_parity import LP_TOL, prompts_of
from tiny_models import greedy_continuation

from glassbox import LLM, SamplingParams
from glassbox.kernels import native
from glassbox.models.config_reader import facts_from_gguf
from glassbox.models.gguf_reader import open_gguf
from glassbox.perf.model_presets import load_model_facts
from glassbox.quant.blocks.linear import BlockQuantLinear

HF_TYPES = {"qwen35": "qwen3_5", "qwen35moe": "qwen3_5_moe"}
# one float32 rounding per transform (A_log through -exp and log, norms + 1 - 1) on values <= ~3
READ_TOL = 1e-6


@pytest.fixture(scope="module")
def models(tmp_path_factory: pytest.TempPathFactory) -> dict[str, tuple[Path, Path]]:
    """arch -> (transformers checkpoint, its float32 GGUF file); the MoE file carries an MTP block, as
    real conversions of Qwen3.5 do."""
    root = tmp_path_factory.mktemp("gguf_qwen35")
    out = {}
    for arch, hf in HF_TYPES.items():
        d = build_hybrid_model(hf, root)
        path = root / f"{arch}-f32.gguf"
        write_qwen3next_gguf(path, d, arch=arch, mtp=arch == "qwen35moe")
        out[arch] = (d, path)
    return out


_REFS: dict[Path, list[tuple[list[int], list[float]]]] = {}


def _reference(d: Path) -> tuple[list[list[int]], list[tuple[list[int], list[float]]]]:
    """Four prompts (1-70 tokens) and transformers' greedy continuations, computed once per model."""
    prompts = prompts_of(d)[:4]
    if d not in _REFS:
        _REFS[d] = reference(d, prompts, 8)
    return prompts, _REFS[d]


@pytest.mark.parametrize("arch", HF_TYPES)
def test_tensors_held_in_the_files_tiled_v_head_order(
    models: dict[str, tuple[Path, Path]], arch: str
) -> None:
    """Every parameter read equals the checkpoint's with the converter's v-head reorder applied (nothing is
    undone: out_proj's columns stay tiled), and the model is told so."""
    d, path = models[arch]
    ckpt = open_gguf(path)
    cfg = json.loads((d / "config.json").read_text())
    hf = tiled_v_heads(load_file(d / "model.safetensors"), cfg)
    got = ckpt.state_dict()
    for name in [k for k in got if ".experts." in k and ".shared_expert" not in k]:
        stem, _, proj = name.rpartition(".experts.")
        per = [hf.pop(f"{stem}.experts.{e}.{proj}") for e in range(cfg["num_experts"])]
        np.testing.assert_array_equal(got.pop(name), np.stack(per))
    assert sorted(got) == sorted(hf)  # the MTP block's tensors not read
    for name, values in hf.items():
        np.testing.assert_allclose(got[name], values, rtol=READ_TOL, atol=READ_TOL, err_msg=name)
    grouped = load_file(d / "model.safetensors")["model.layers.0.linear_attn.out_proj.weight"]
    assert not np.array_equal(got["model.layers.0.linear_attn.out_proj.weight"], grouped)
    facts = facts_from_gguf(ckpt, arch)
    assert facts.num_layers == cfg["num_hidden_layers"]
    assert facts.hybrid is not None and facts.hybrid.gdn is not None and facts.hybrid.gdn.tiled_v_heads


@pytest.mark.parametrize("kernels", ["native", "torch"])
@pytest.mark.parametrize("arch", HF_TYPES)
def test_float32_file_greedy_like_transformers(
    models: dict[str, tuple[Path, Path]], arch: str, kernels: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Both CPU paths (the decode recurrence in C, the PyTorch ops) read the tiled v heads."""
    monkeypatch.setenv("GLASSBOX_CPU_KERNELS", kernels)
    d, path = models[arch]
    prompts, ref = _reference(d)
    llm = LLM(model=str(path), dtype="float32", max_num_batched_tokens=32)  # chunked prefill of the longer
    params = SamplingParams(temperature=0, max_tokens=8, ignore_eos=True, logprobs=0)
    for out, (toks, lps) in zip(llm.generate(prompts, params), ref, strict=True):
        assert out.token_ids == toks
        assert out.logprobs is not None
        ours = [step[t] for step, t in zip(out.logprobs, out.token_ids, strict=True)]
        assert ours == pytest.approx(lps, abs=LP_TOL)


@pytest.mark.parametrize(("arch", "qtype"), [("qwen35", Q.Q8_0), ("qwen35moe", Q.Q4_0)])
def test_quantized_file_like_transformers_on_its_dequantized_weights(
    models: dict[str, tuple[Path, Path]], tmp_path: Path, arch: str, qtype: Q
) -> None:
    """float32: each matrix dequantized as gguf.quants does, in the file's tiled order, so the run is
    token-exact with transformers on those values (untiled)."""
    import transformers as tf

    d, _ = models[arch]
    path = tmp_path / f"{arch}-{qtype.name}.gguf"
    write_qwen3next_gguf(path, d, qtype, arch=arch)
    types = open_gguf(path).tensor_types
    assert types["model.layers.0.linear_attn.out_proj.weight"] == qtype.name
    assert types["model.layers.0.linear_attn.A_log"] == "F32"
    ref_dir = tmp_path / "dequantized"  # per-expert names: transformers fuses the experts as it reads them
    ref_dir.mkdir()
    shutil.copy(d / "config.json", ref_dir / "config.json")
    save_file(quantized_hf_state(d, arch, qtype), ref_dir / "model.safetensors", metadata={"format": "pt"})
    ref = tf.AutoModelForCausalLM.from_pretrained(ref_dir, dtype=torch.float32).eval()
    prompts = prompts_of(d)[:3]
    llm = LLM(model=str(path), dtype="float32")
    params = SamplingParams(temperature=0, max_tokens=8, ignore_eos=True, logprobs=0)
    for prompt, out in zip(prompts, llm.generate(prompts, params), strict=True):
        toks, lps = greedy_continuation(ref, prompt, 8)
        assert out.token_ids == toks
        assert out.logprobs is not None
        assert max(abs(out.logprobs[j][t] - lps[j]) for j, t in enumerate(toks)) < LP_TOL


@pytest.mark.skipif(not native.compiler(), reason="the block kernels need a C compiler")
def test_bf16_holds_the_tiled_blocks_as_stored(models: dict[str, tuple[Path, Path]], tmp_path: Path) -> None:
    """bf16 (the engine's packed mode): out_proj stays in the file's Q8_0 blocks (its columns tiled, which
    no row permutation of blocks could undo) and the model generates."""
    d, _ = models["qwen35"]
    path = tmp_path / "qwen35-q8_0.gguf"
    write_qwen3next_gguf(path, d, Q.Q8_0, arch="qwen35")
    llm = LLM(model=str(path), dtype="bfloat16")
    model = llm.engine.executor.model
    out_proj = model.get_submodule("model.layers.0.linear_attn.out_proj")
    assert isinstance(out_proj, BlockQuantLinear)
    out = llm.generate([[5, 6, 7]], SamplingParams(temperature=0, max_tokens=4, ignore_eos=True))
    assert len(out[0].token_ids) == 4


def test_a_missing_metadata_key_is_named(models: dict[str, tuple[Path, Path]], tmp_path: Path) -> None:
    """A key the model needs (the linear attention's key-head count) left out of the file: one message
    naming it."""
    d, _ = models["qwen35"]
    path = tmp_path / "no-group-count.gguf"
    write_qwen3next_gguf(path, d, arch="qwen35", drop_keys=("qwen35.ssm.group_count",))
    with pytest.raises(ValueError, match=r"GGUF metadata lacks qwen35\.ssm\.group_count"):
        LLM(model=str(path), dtype="float32")


@pytest.mark.parametrize(
    ("arch", "drop", "message"),
    [
        ("qwen35moe", "blk.2.ffn_gate_inp", r"no router \(ffn_gate_inp\) in layers \[2\]"),
        ("qwen35", "blk.0.ssm_beta", r"blk\.0\.ssm_beta|in_proj_b"),
    ],
)
def test_unsupported_qwen35_variants_refused(
    models: dict[str, tuple[Path, Path]], tmp_path: Path, arch: str, drop: str, message: str
) -> None:
    d, _ = models[arch]
    path = tmp_path / "variant.gguf"
    write_qwen3next_gguf(path, d, drop=(drop,), arch=arch)
    with pytest.raises(ValueError, match=message):
        LLM(model=str(path), dtype="float32")


@pytest.mark.parametrize("arch", HF_TYPES)
def test_plan_facts_of_the_file_are_the_checkpoints(models: dict[str, tuple[Path, Path]], arch: str) -> None:
    """What ``glassbox plan FILE.gguf`` reads: transformers' own parameter count of the checkpoint, and the
    layer kinds and state bytes per sequence of its config.json."""
    import transformers as tf

    d, path = models[arch]
    facts, from_config = load_model_facts(str(path)), load_model_facts(str(d))
    model = tf.AutoModelForCausalLM.from_pretrained(d, dtype=torch.float32)
    assert facts.total_params == sum(p.numel() for p in model.parameters())
    assert facts.state_bytes_per_seq == from_config.state_bytes_per_seq
    assert facts.layer_mixers == from_config.layer_mixers
