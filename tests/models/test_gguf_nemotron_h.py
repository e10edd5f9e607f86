"""GGUF files of Nemotron-H (llama.cpp's ``nemotron_h``: Mamba-2, attention and MLP blocks) and Nemotron 3
(``nemotron_h_moe``: Mamba-2, attention and latent MoE blocks), written as llama.cpp's converter writes them
(tests/helpers/nemotron_gguf_factory.py: the gguf package's name map, the converter's transforms) from tiny
random transformers models, read back by glassbox.

References: transformers on the source checkpoint (float32 files: greedy token-exact, logprobs within
LP_TOL = 1e-4, as tests/models/test_hybrid_parity.py argues; the file's transforms add at most one float32
rounding per weight: A_log through -exp and log); for quantized files transformers on each matrix as
gguf.quants quantizes and dequantizes it (nemotron_gguf_factory.quantized_hf_state), the values the engine
holds in float32, so the same bound. The models are shaped as llama.cpp can run them: MLP blocks only in
``nemotron_h`` files, MoE blocks only in ``nemotron_h_moe`` ones, one expert group.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import numpy as np
import pytest
import torch
from gguf import GGMLQuantizationType as Q
from hybrid_models import build_hybrid_model, reference
from nemotron_gguf_factory import quantized_hf_state, write_nemotron_h_gguf
from safetensors.numpy import load_file, save_file
from test_hybrid_parity import LP_TOL, prompts_of
from tiny_models import greedy_continuation

from glassbox import LLM, SamplingParams
from glassbox.kernels import native
from glassbox.models.gguf_reader import open_gguf
from glassbox.perf.model_presets import load_model_facts
from glassbox.quant.blocks.linear import BlockQuantLinear

SHAPES = {
    "dense": {"hybrid_override_pattern": "M-M*M-"},
    # Nemotron 3's latent MoE; one expert group, as Nemotron 3 routes (the converter writes no group count kept)
    "moe": {"hybrid_override_pattern": "ME*ME", "n_group": 1, "topk_group": 1, "moe_latent_size": 32},
}
# one float32 rounding per transform (A_log through -exp and log) on values <= ~3
READ_TOL = 1e-6
_RENAMES = (("backbone.embeddings.", "model.embed_tokens."), ("backbone.norm_f.", "model.norm."))


@pytest.fixture(scope="module")
def models(tmp_path_factory: pytest.TempPathFactory) -> dict[str, tuple[Path, Path]]:
    """kind -> (transformers checkpoint, its float32 GGUF file); the MoE file carries an MTP block, as
    real conversions of Nemotron 3 do."""
    root = tmp_path_factory.mktemp("gguf_nemotron_h")
    out = {}
    for kind, shape in SHAPES.items():
        d = build_hybrid_model("nemotron_h", root, **shape)
        path = root / f"nemotron-{kind}-f32.gguf"
        arch = write_nemotron_h_gguf(path, d, mtp=kind == "moe")
        assert arch == ("nemotron_h_moe" if kind == "moe" else "nemotron_h")
        out[kind] = (d, path)
    return out


def _glassbox_names(hf: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
    """The checkpoint's tensors under glassbox's names (backbone -> model), per-expert ones stacked."""
    out: dict[str, np.ndarray] = {}
    experts: dict[str, dict[int, np.ndarray]] = {}
    for name, t in hf.items():
        for old, new in _RENAMES:
            name = name.replace(old, new)
        name = name.replace("backbone.", "model.")
        stem, sep, rest = name.partition(".experts.")
        if sep and rest.split(".")[0].isdigit():
            e, proj = rest.split(".")[:2]
            experts.setdefault(f"{stem}.experts.{proj}", {})[int(e)] = t
        else:
            out[name] = t
    return out | {k: np.stack([v[e] for e in range(len(v))]) for k, v in experts.items()}


@pytest.mark.parametrize("kind", SHAPES)
def test_tensors_read_as_hugging_face_holds_them(models: dict[str, tuple[Path, Path]], kind: str) -> None:
    """Every parameter from the file equals the checkpoint's: A_log, D, conv1d and the grouped norm back in
    their shapes, q/k rows un-permuted, experts stacked; the block pattern as the config's."""
    d, path = models[kind]
    ckpt = open_gguf(path)
    assert ckpt.config["hybrid_override_pattern"] == SHAPES[kind]["hybrid_override_pattern"]
    want = _glassbox_names(load_file(d / "model.safetensors"))
    got = ckpt.state_dict()
    assert sorted(got) == sorted(want)  # the MTP block's tensors not read
    for name, values in want.items():
        assert got[name].shape == values.shape, name
        np.testing.assert_allclose(got[name], values, rtol=READ_TOL, atol=READ_TOL, err_msg=name)


@pytest.mark.parametrize("kind", SHAPES)
def test_float32_file_greedy_like_transformers(models: dict[str, tuple[Path, Path]], kind: str) -> None:
    d, path = models[kind]
    prompts = prompts_of(d)[:4]
    ref = reference(d, prompts, 8)
    llm = LLM(model=str(path), dtype="float32", max_num_batched_tokens=32)  # chunked prefill of the longer
    params = SamplingParams(temperature=0, max_tokens=8, ignore_eos=True, logprobs=0)
    for out, (toks, lps) in zip(llm.generate(prompts, params), ref, strict=True):
        assert out.token_ids == toks
        assert out.logprobs is not None
        ours = [step[t] for step, t in zip(out.logprobs, out.token_ids, strict=True)]
        assert ours == pytest.approx(lps, abs=LP_TOL)


@pytest.mark.parametrize(("kind", "qtype"), [("dense", Q.Q8_0), ("moe", Q.Q4_0)])
def test_quantized_file_like_transformers_on_its_dequantized_weights(
    models: dict[str, tuple[Path, Path]], tmp_path: Path, kind: str, qtype: Q
) -> None:
    import transformers as tf

    d, _ = models[kind]
    path = tmp_path / f"nemotron-{kind}-{qtype.name}.gguf"
    write_nemotron_h_gguf(path, d, qtype)
    types = open_gguf(path).tensor_types
    assert types["model.layers.0.mixer.in_proj.weight"] == qtype.name
    assert types["model.layers.0.mixer.A_log"] == "F32"
    ref_dir = tmp_path / "dequantized"
    ref_dir.mkdir()
    shutil.copy(d / "config.json", ref_dir / "config.json")
    save_file(quantized_hf_state(d, qtype), ref_dir / "model.safetensors", metadata={"format": "pt"})
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
def test_bf16_runs_the_quantized_moe_file(models: dict[str, tuple[Path, Path]], tmp_path: Path) -> None:
    """bf16 (the engine's packed mode, the default dtype of a quantized file): the Mamba-2, attention and
    latent projections stay in the file's Q8_0 blocks (q/k rows un-permuted as blocks); the stacked experts,
    which NemotronHExperts holds as parameters, are dequantized into them; the model generates."""
    d, _ = models["moe"]
    path = tmp_path / "nemotron-moe-q8_0.gguf"
    write_nemotron_h_gguf(path, d, Q.Q8_0)
    llm = LLM(model=str(path))
    model = llm.engine.executor.model
    for name in ("0.mixer.in_proj", "0.mixer.out_proj", "1.mixer.fc1_latent_proj", "2.mixer.k_proj"):
        assert isinstance(model.get_submodule(f"model.layers.{name}"), BlockQuantLinear), name
    assert model.get_submodule("model.layers.1.mixer.experts").up_proj.dtype == torch.bfloat16
    out = llm.generate([[5, 6, 7]], SamplingParams(temperature=0, max_tokens=4, ignore_eos=True))
    assert len(out[0].token_ids) == 4


@pytest.mark.parametrize("kind", SHAPES)
def test_plan_facts_of_the_file_are_the_checkpoints(models: dict[str, tuple[Path, Path]], kind: str) -> None:
    """What ``glassbox plan FILE.gguf`` reads: the parameter count (transformers' own count of the
    checkpoint's parameters, the router's correction bias a buffer there) and the state bytes per
    sequence of the config.json."""
    import transformers as tf

    d, path = models[kind]
    facts = load_model_facts(str(path))
    model = tf.AutoModelForCausalLM.from_pretrained(d, dtype=torch.float32)
    assert facts.total_params == sum(p.numel() for p in model.parameters())
    assert facts.state_bytes_per_seq == load_model_facts(str(d)).state_bytes_per_seq
    assert facts.layer_mixers == load_model_facts(str(d)).layer_mixers


@pytest.mark.parametrize(
    ("shape", "drop", "message"),
    [
        # transformers' default tiny pattern: an MLP block in an MoE model, which llama.cpp cannot lay out
        ({"hybrid_override_pattern": "M-M*ME"}, (), r"block 1 is a Mamba-2 block by its metadata.*no ssm_in"),
        ({"hybrid_override_pattern": "ME*ME"}, (), r"expert_group_used_count"),  # routed over 2 groups
        ({"hybrid_override_pattern": "M-M*M-"}, ("blk.3.attn_q",), r"block 3 is a attention block.*attn_q"),
    ],
)
def test_unsupported_nemotron_h_variants_refused(
    tmp_path: Path, shape: dict[str, str], drop: tuple[str, ...], message: str
) -> None:
    d = build_hybrid_model("nemotron_h", tmp_path, **shape)
    path = tmp_path / "variant.gguf"
    write_nemotron_h_gguf(path, d, drop=drop)
    with pytest.raises(ValueError, match=message):
        LLM(model=str(path), dtype="float32")
    assert json.loads((d / "config.json").read_text())["model_type"] == "nemotron_h"
