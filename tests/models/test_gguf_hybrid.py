"""GGUF files of Qwen3-Next (llama.cpp's ``qwen3next``), written as llama.cpp's converter writes them
(tests/helpers/hybrid_gguf_factory.py: the gguf package's own name map, the converter's transforms) from a tiny
random transformers model, read back by glassbox: greedy token-exact with transformers on the source model
(float32), the tensors equal to the Hugging Face parameters; unsupported variants refused with one message.

Logprobs within 1e-4, as tests/test_hybrid_parity.py argues (float32 both sides, sums in other orders);
the file's transforms add at most one rounding per weight (A_log through -exp and log, norms through + 1 and
- 1: ~1e-7 relative), far below it.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
from gguf import GGMLQuantizationType as Q
from hybrid_gguf_factory import write_qwen3next_gguf
from hybrid_models import build_hybrid_model, reference
from safetensors.numpy import load_file
from test_hybrid_parity import LP_TOL, prompts_of

from glassbox import LLM, SamplingParams
from glassbox.models.gguf_reader import open_gguf

# llama.cpp runs every qwen3next layer as MoE and reads head_v_dim = ssm.state_size: a model it can run
SHAPE = {"mlp_only_layers": [], "linear_value_head_dim": 16}
# one rounding of float32 per transform (see the module docstring), on values of magnitude <= ~3
READ_TOL = 1e-6


@pytest.fixture(scope="module")
def model(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    root = tmp_path_factory.mktemp("gguf_hybrid")
    d = build_hybrid_model("qwen3_next", root, **SHAPE)
    path = root / "qwen3next-f32.gguf"
    write_qwen3next_gguf(path, d)
    return d, path


def test_qwen3next_tensors_read_as_hugging_face_holds_them(model: tuple[Path, Path]) -> None:
    """Every parameter of the split-projection model from the file equals the checkpoint's (in_proj_qkvz
    and in_proj_ba cut as Qwen3.5 holds them)."""
    d, path = model
    hf = load_file(d / "model.safetensors")
    ckpt = open_gguf(path)
    assert ckpt.config["architectures"] == ["Qwen3NextForCausalLM"]
    got = ckpt.state_dict()
    cfg = ckpt.config
    nk, nv = cfg["linear_num_key_heads"], cfg["linear_num_value_heads"]
    dk, dv = cfg["linear_key_head_dim"], cfg["linear_value_head_dim"]
    for i in range(cfg["num_hidden_layers"]):
        p = f"model.layers.{i}.linear_attn."
        if p + "in_proj_qkvz.weight" not in hf:
            continue
        qkvz = hf.pop(p + "in_proj_qkvz.weight").reshape(nk, 2 * dk + 2 * nv // nk * dv, -1)
        q, k = qkvz[:, :dk], qkvz[:, dk : 2 * dk]
        v, z = qkvz[:, 2 * dk : 2 * dk + nv // nk * dv], qkvz[:, 2 * dk + nv // nk * dv :]
        hf[p + "in_proj_qkv.weight"] = np.concatenate([x.reshape(-1, q.shape[-1]) for x in (q, k, v)])
        hf[p + "in_proj_z.weight"] = z.reshape(-1, q.shape[-1])
        ba = hf.pop(p + "in_proj_ba.weight").reshape(nk, 2, nv // nk, -1)
        hf[p + "in_proj_b.weight"] = ba[:, 0].reshape(nv, -1)
        hf[p + "in_proj_a.weight"] = ba[:, 1].reshape(nv, -1)
    stacked = {k for k in got if ".experts." in k}
    assert len(stacked) == 3 * cfg["num_hidden_layers"]
    for name in stacked:
        stem, _, proj = name.rpartition(".experts.")
        per = [hf.pop(f"{stem}.experts.{e}.{proj}") for e in range(cfg["num_experts"])]
        np.testing.assert_array_equal(got.pop(name), np.stack(per))
    assert sorted(got) == sorted(hf)
    for name, values in hf.items():
        np.testing.assert_allclose(got[name], values, rtol=READ_TOL, atol=READ_TOL, err_msg=name)


def test_qwen3next_gguf_greedy_like_transformers(model: tuple[Path, Path]) -> None:
    d, path = model
    prompts = prompts_of(d)[:4]
    ref = reference(d, prompts, 8)
    llm = LLM(model=str(path), dtype="float32", max_num_batched_tokens=32)  # chunked prefill of the longer
    params = SamplingParams(temperature=0, max_tokens=8, ignore_eos=True, logprobs=0)
    for out, (toks, lps) in zip(llm.generate(prompts, params), ref, strict=True):
        assert out.token_ids == toks
        assert out.logprobs is not None
        ours = [step[t] for step, t in zip(out.logprobs, out.token_ids, strict=True)]
        assert ours == pytest.approx(lps, abs=LP_TOL)


def test_qwen3next_q8_0_gguf_runs(model: tuple[Path, Path], tmp_path: Path) -> None:
    """A Q8_0 file (2-D weights quantized) loads, holds the file's types and generates."""
    d, _ = model
    path = tmp_path / "qwen3next-q8_0.gguf"
    write_qwen3next_gguf(path, d, Q.Q8_0)
    ckpt = open_gguf(path)
    assert ckpt.tensor_types["model.layers.0.linear_attn.in_proj_b.weight"] == "Q8_0"
    assert ckpt.tensor_types["model.layers.0.linear_attn.conv1d.weight"] == "F32"
    out = LLM(model=str(path), dtype="float32").generate(
        [[5, 6, 7]], SamplingParams(temperature=0, max_tokens=4)
    )
    assert len(out[0].token_ids) == 4


@pytest.mark.parametrize(
    ("drop", "message"),
    [
        ("blk.1.ffn_gate_inp", r"no router \(ffn_gate_inp\) in layers \[1\]"),
        ("blk.0.attn_gate", r"blk\.0\.attn_gate|in_proj_z"),
    ],
)
def test_unsupported_qwen3next_variants_refused(
    model: tuple[Path, Path], tmp_path: Path, drop: str, message: str
) -> None:
    d, _ = model
    path = tmp_path / "variant.gguf"
    write_qwen3next_gguf(path, d, drop=(drop,))
    with pytest.raises(ValueError, match=message):
        LLM(model=str(path), dtype="float32")


def test_legacy_fused_qwen3next_layout_refused() -> None:
    """Files of early llama.cpp conversions hold in_proj_qkvz whole as ssm_in: one message naming it."""
    from glassbox.models.gguf_names import hf_tensor_name

    with pytest.raises(ValueError, match=r"blk\.0\.ssm_in\.weight.*legacy fused in_proj_qkvz"):
        hf_tensor_name("blk.0.ssm_in.weight", "qwen3next")
