"""The GGUF reader against transformers reading the same files (a real SmolLM2 Q4_1 file and synthetic ones)."""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

import gguf
import numpy as np
import pytest
from gguf import GGMLQuantizationType as Q
from gguf_factory import QUANTIZABLE, RANDOM_BLOCK_SCALES, Spec, smollm2_path, write_model

from glassbox.models.gguf_config import build_config, llama3_divisors
from glassbox.models.gguf_reader import dequantize_tensor, gguf_shard_paths, is_gguf, open_gguf

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")

CONFIG_FIELDS = (
    "hidden_size",
    "num_hidden_layers",
    "num_attention_heads",
    "num_key_value_heads",
    "intermediate_size",
    "vocab_size",
    "max_position_embeddings",
    "tie_word_embeddings",
)


def hf_model(path: Path) -> tuple[dict[str, Any], dict[str, np.ndarray], Any]:
    """(config dict, float32 state dict, model) of transformers loading a GGUF file."""
    model = transformers.AutoModelForCausalLM.from_pretrained(
        path.parent, gguf_file=path.name, dtype=torch.float32
    )
    return model.config.to_dict(), {k: v.numpy() for k, v in model.state_dict().items()}, model


def assert_same_logits(config: dict[str, Any], tensors: dict[str, np.ndarray], ref_model: Any) -> None:
    """A transformers model built from our config dict and tensors computes what ``ref_model`` does."""
    model = transformers.AutoModelForCausalLM.from_config(
        transformers.AutoConfig.for_model(**config), dtype=torch.float32
    )
    result = model.load_state_dict({k: torch.from_numpy(v) for k, v in tensors.items()}, strict=False)
    assert not result.unexpected_keys and set(result.missing_keys) <= {"lm_head.weight"}
    ids = torch.tensor([[1, 7, 3, 12, 9, 4, 30, 2, 5]])
    with torch.no_grad():
        torch.testing.assert_close(model(ids).logits, ref_model(ids).logits, rtol=1e-5, atol=1e-5)


def assert_config_matches(ours: dict[str, Any], ref: dict[str, Any]) -> None:
    for key in CONFIG_FIELDS:
        assert ours[key] == ref[key], key
    assert math.isclose(ours["rms_norm_eps"], ref["rms_norm_eps"], rel_tol=1e-6)  # ours: float32's shortest
    theta = (ref.get("rope_parameters") or {}).get("rope_theta", ref.get("rope_theta"))
    assert ours["rope_theta"] == theta
    if ref.get("head_dim") is not None:
        assert ours["head_dim"] == ref["head_dim"]
    assert ours["model_type"] == ref["model_type"]


def assert_tensors_match(ours: dict[str, np.ndarray], ref: dict[str, np.ndarray], tied: bool) -> None:
    assert set(ref) - set(ours) == ({"lm_head.weight"} if tied else set())
    for name, values in ours.items():
        assert values.dtype == np.float32 and values.shape == ref[name].shape, name
        np.testing.assert_array_equal(values, ref[name], err_msg=name)


# ---- the real model ----


@pytest.fixture(scope="module")
def smollm2(smollm2_reference: tuple[Any, Any]) -> tuple[Any, dict[str, Any], dict[str, np.ndarray], Any]:
    path = smollm2_path()
    assert path is not None  # else smollm2_reference skipped
    model = smollm2_reference[0]  # conftest's, shared with the other real-model tests
    state = {k: v.numpy() for k, v in model.state_dict().items()}
    return open_gguf(path), model.config.to_dict(), state, model


def test_smollm2_config_matches_transformers(smollm2: Any) -> None:
    checkpoint, ref_config, _, _ = smollm2
    cfg = checkpoint.config
    assert_config_matches(cfg, ref_config)
    assert cfg["architectures"] == ["LlamaForCausalLM"]
    assert (cfg["num_attention_heads"], cfg["num_key_value_heads"], cfg["num_hidden_layers"]) == (9, 3, 30)
    assert cfg["tie_word_embeddings"] is True
    assert (
        cfg["bos_token_id"] == ref_config["bos_token_id"]
        and cfg["eos_token_id"] == ref_config["eos_token_id"]
    )
    assert cfg["torch_dtype"] == "bfloat16"  # a quantized file
    assert cfg["rms_norm_eps"] == 1e-5


def test_smollm2_tensors_match_transformers(smollm2: Any) -> None:
    checkpoint, _, ref_state, _ = smollm2
    assert_tensors_match(dict(checkpoint.tensors()), ref_state, tied=True)
    types = checkpoint.tensor_types
    assert types["model.embed_tokens.weight"] == "Q8_0"
    assert types["model.layers.0.self_attn.q_proj.weight"] == "Q4_1"
    assert types["model.norm.weight"] == "F32"


# ---- synthetic files: architectures ----

ARCH_SPECS = {
    "llama": Spec(),
    "llama-tied": Spec(tie=True, kv_heads=4),
    "qwen2-bias": Spec(arch="qwen2", bias=True),
    "qwen3-qk-norm": Spec(arch="qwen3", hidden=64, heads=2, kv_heads=1, head_dim=128, qk_norm=True),
}


@pytest.mark.parametrize("case", list(ARCH_SPECS))
def test_architecture_matches_transformers(case: str, tmp_path: Path) -> None:
    spec = ARCH_SPECS[case]
    path = tmp_path / f"{case}.gguf"
    original = write_model(path, spec)
    checkpoint = open_gguf(path)
    ref_config, ref_state, ref_model = hf_model(path)
    assert_config_matches(checkpoint.config, ref_config)
    ours = dict(checkpoint.tensors())
    assert_tensors_match(ours, ref_state, tied=spec.tie)
    assert_same_logits(checkpoint.config, ours, ref_model)
    # F32 weights come back exactly as drawn in HF layout (so the Q/K rows are back in transformers' order).
    assert set(ours) == set(original)
    for name, values in ours.items():
        np.testing.assert_array_equal(values, original[name], err_msg=name)
    cfg = checkpoint.config
    assert cfg["architectures"] == [
        {"llama": "Llama", "qwen2": "Qwen2", "qwen3": "Qwen3"}[spec.arch] + "ForCausalLM"
    ]
    assert cfg["attention_bias"] is spec.bias and cfg["torch_dtype"] == "float32"
    assert cfg["head_dim"] == spec.dim


@pytest.mark.parametrize("arch", ["llama", "mistral"])
def test_mistral(arch: str, tmp_path: Path) -> None:
    """llama.cpp writes Mistral as "llama" (told apart by name, as transformers does); "mistral" is read too.

    transformers cannot load Mistral GGUF weights with this gguf package, so the tensors are held against
    the weights written (the config against transformers' where it reads one).
    """
    spec = Spec(arch=arch, name="mistral")
    path = tmp_path / "mistral.gguf"
    original = write_model(path, spec)
    checkpoint = open_gguf(path)
    assert checkpoint.config["architectures"] == ["MistralForCausalLM"]
    assert checkpoint.config["model_type"] == "mistral" and checkpoint.config["sliding_window"] is None
    ours = dict(checkpoint.tensors())
    assert set(ours) == set(original)
    for name, values in ours.items():
        np.testing.assert_array_equal(values, original[name], err_msg=name)
    if arch == "llama":
        ref = transformers.AutoConfig.from_pretrained(tmp_path, gguf_file=path.name).to_dict()
        assert_config_matches(checkpoint.config, ref)


# ---- synthetic files: tensor types ----

# transformers' own torch dequantizer (independent of the gguf package, which both readers call)
try:
    from transformers.integrations.gguf.dequant import GGML_BLOCK as TORCH_DEQUANT_TYPES
    from transformers.integrations.gguf.dequant import dequantize as torch_dequantize
except ImportError:  # older transformers
    TORCH_DEQUANT_TYPES, torch_dequantize = {}, None

# Relative RMS error allowed against the float weights for the types gguf can quantize.
QUANT_RMS_ERROR = {Q.Q8_0: 0.01, Q.Q5_0: 0.05, Q.Q5_1: 0.05, Q.Q4_0: 0.1, Q.Q4_1: 0.1}
TYPES = list(QUANTIZABLE) + list(RANDOM_BLOCK_SCALES)


@pytest.fixture(scope="module")
def typed_files(tmp_path_factory: pytest.TempPathFactory) -> dict[Q, tuple[Path, dict[str, np.ndarray]]]:
    root = tmp_path_factory.mktemp("types")
    spec = dict(hidden=256, ffn=256, layers=1, heads=4, kv_heads=2, vocab=32)
    return {
        q: (root / f"{q.name}.gguf", write_model(root / f"{q.name}.gguf", Spec(qtype=q, **spec)))
        for q in TYPES
    }


@pytest.mark.parametrize("qtype", TYPES, ids=[q.name for q in TYPES])
def test_tensor_type(qtype: Q, typed_files: dict[Q, tuple[Path, dict[str, np.ndarray]]]) -> None:
    path, original = typed_files[qtype]
    checkpoint = open_gguf(path)
    ours = dict(checkpoint.tensors())
    assert checkpoint.tensor_types["model.layers.0.mlp.up_proj.weight"] == qtype.name
    assert checkpoint.tensor_types["model.norm.weight"] == "F32"
    expected_dtype = {Q.F32: "float32", Q.F16: "float16", Q.BF16: "bfloat16"}.get(qtype, "bfloat16")
    assert checkpoint.config["torch_dtype"] == expected_dtype

    # 1. Names, shapes, Q/K order and values equal transformers loading the file.
    assert_tensors_match(ours, hf_model(path)[1], tied=False)

    # 2. Dequantization equals transformers' own torch dequantizer, tensor by tensor, where it has one.
    if int(qtype) in TORCH_DEQUANT_TYPES:
        assert torch_dequantize is not None
        for t in gguf.GGUFReader(path).tensors:
            if t.tensor_type == qtype:
                ref = torch_dequantize(torch.from_numpy(np.array(t.data).reshape(-1)), int(qtype)).numpy()
                np.testing.assert_array_equal(dequantize_tensor(t).reshape(-1), ref, err_msg=t.name)

    # 3. For a type gguf can quantize: close to the float weights that were written (in HF layout).
    if qtype in QUANTIZABLE:
        for name, values in ours.items():
            want = original[name]
            if values.ndim == 1 or qtype == Q.F32:
                np.testing.assert_array_equal(values, want, err_msg=name)
            elif qtype in (Q.F16, Q.BF16):
                half = torch.float16 if qtype == Q.F16 else torch.bfloat16
                np.testing.assert_array_equal(values, torch.from_numpy(want).to(half).float().numpy(), name)
            else:
                error = np.sqrt(np.mean((values - want) ** 2) / np.mean(want**2))
                assert error < QUANT_RMS_ERROR[qtype], (name, error)


# ---- rope scaling ----


def hf_inv_freq(config: dict[str, Any]) -> np.ndarray:
    """transformers' rotary inverse frequencies for a llama config dict."""
    from transformers.modeling_rope_utils import ROPE_INIT_FUNCTIONS

    cfg = transformers.LlamaConfig(**config)
    # transformers 5 keeps rope settings in rope_parameters, 4.x in rope_scaling + rope_theta
    params = getattr(cfg, "rope_parameters", None) or {
        "rope_theta": cfg.rope_theta,
        **(cfg.rope_scaling or {}),
    }
    kind = params.get("rope_type", "default")
    if kind == "default":
        return 1.0 / (params["rope_theta"] ** (np.arange(0, cfg.head_dim, 2) / cfg.head_dim))
    return ROPE_INIT_FUNCTIONS[kind](cfg, "cpu")[0].double().numpy()


LLAMA3 = dict(factor=8.0, low_freq_factor=1.0, high_freq_factor=4.0, original_max_position_embeddings=8192)


@pytest.mark.parametrize(
    ("theta", "head_dim", "params"),
    [
        (500000.0, 64, LLAMA3),  # Llama 3.1
        (500000.0, 128, {**LLAMA3, "factor": 32.0}),  # Llama 3.2
        (500000.0, 16, LLAMA3),  # one frequency in the smooth band: Llama 3's factors are assumed
        (10000.0, 128, dict(LLAMA3, low_freq_factor=2.0, high_freq_factor=8.0)),  # fitted from the band
        (10000.0, 128, dict(LLAMA3, original_max_position_embeddings=16384)),  # same up to scale
    ],
)
def test_llama3_rope_freqs_become_rope_scaling(
    theta: float, head_dim: int, params: dict[str, float], tmp_path: Path
) -> None:
    true = {"rope_type": "llama3", **params}
    divisors = llama3_divisors(true, theta, head_dim).astype(np.float32)
    path = tmp_path / "llama3.gguf"
    spec = Spec(hidden=2 * head_dim, heads=2, kv_heads=1, rope_theta=theta)
    write_model(path, spec, extra={"rope_freqs.weight": divisors})
    checkpoint = open_gguf(path)
    assert "rope_freqs.weight" not in checkpoint.tensor_types and len(checkpoint.state_dict()) > 0
    ours = checkpoint.config
    assert ours["rope_scaling"]["rope_type"] == "llama3"
    reference = {**ours, "rope_scaling": true}
    np.testing.assert_allclose(hf_inv_freq(ours), hf_inv_freq(reference), rtol=1e-5)
    unscaled = {k: v for k, v in ours.items() if k != "rope_scaling"}
    assert not np.allclose(hf_inv_freq(unscaled), hf_inv_freq(reference), rtol=1e-3)


def test_rope_freqs_that_are_not_llama3(tmp_path: Path) -> None:
    path = tmp_path / "odd-rope.gguf"
    write_model(
        path,
        Spec(hidden=128, heads=2, kv_heads=1),
        extra={"rope_freqs.weight": np.linspace(1, 3, 32, dtype=np.float32)},
    )
    with pytest.raises(ValueError, match="llama3"):
        open_gguf(path)


def test_rope_scaling_from_metadata() -> None:
    base = {
        "general.architecture": "qwen2",
        "qwen2.embedding_length": 64,
        "qwen2.block_count": 2,
        "qwen2.attention.head_count": 4,
        "qwen2.feed_forward_length": 96,
        "qwen2.attention.layer_norm_rms_epsilon": 1e-6,
        "qwen2.rope.freq_base": 1000000.0,
    }
    shapes = {"token_embd.weight": (100, 64)}
    yarn = {"qwen2.rope.scaling.type": "yarn", "qwen2.rope.scaling.factor": 4.0}
    yarn["qwen2.rope.scaling.original_context_length"] = 32768
    assert build_config({**base, **yarn}, shapes, ["F32"])["rope_scaling"] == {
        "rope_type": "yarn",
        "factor": 4.0,
        "original_max_position_embeddings": 32768,
    }
    linear = {"qwen2.rope.scaling.type": "linear", "qwen2.rope.scaling.factor": 2.0}
    assert build_config({**base, **linear}, shapes, ["F32"])["rope_scaling"] == {
        "rope_type": "linear",
        "factor": 2.0,
    }
    plain = build_config(base, shapes, ["Q4_K", "F32"])
    assert "rope_scaling" not in plain and plain["vocab_size"] == 100 and plain["num_key_value_heads"] == 4
    with pytest.raises(ValueError, match="rotates 8 of 16 head dimensions"):
        build_config({**base, "qwen2.rope.dimension_count": 8}, shapes, ["F32"])
    with pytest.raises(ValueError, match="longrope"):
        build_config({**base, "qwen2.rope.scaling.type": "longrope"}, shapes, ["F32"])


# ---- sharded files ----


def test_split_checkpoint(tmp_path: Path) -> None:
    spec = Spec(layers=3)
    original = write_model(tmp_path / "model.gguf", spec, split_max_tensors=20)
    shards = sorted(tmp_path.glob("model-*-of-*.gguf"))
    assert [s.name for s in shards] == ["model-00001-of-00002.gguf", "model-00002-of-00002.gguf"]
    for given in (shards[0], shards[1], tmp_path):  # any shard, or the directory
        checkpoint = open_gguf(given)
        assert checkpoint.paths == shards
        ours = dict(checkpoint.tensors())
        assert set(ours) == set(original) and len(checkpoint.tensor_types) == len(original)
        for name, values in ours.items():
            np.testing.assert_array_equal(values, original[name], err_msg=name)
    assert checkpoint.config["num_hidden_layers"] == 3
    shards[1].unlink()
    with pytest.raises(FileNotFoundError, match="model-00002-of-00002.gguf"):
        open_gguf(shards[0])


# ---- errors and helpers ----


def test_unsupported_architecture(tmp_path: Path) -> None:
    path = tmp_path / "phi2.gguf"
    writer = gguf.GGUFWriter(path, "phi2")
    writer.add_tensor("token_embd.weight", np.zeros((4, 4), np.float32))
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    with pytest.raises(ValueError, match=r"'phi2' is not supported; supported: llama, mistral, qwen2, qwen3"):
        open_gguf(path)


def test_unsupported_tensor_type(tmp_path: Path) -> None:
    path = tmp_path / "ints.gguf"
    write_model(path, Spec(layers=1), extra={"blk.0.attn_q.bias": np.zeros(64, np.int32)})
    with pytest.raises(ValueError, match=r"'blk\.0\.attn_q\.bias'.*type I32"):
        open_gguf(path)


def test_unknown_tensor_and_missing_file(tmp_path: Path) -> None:
    path = tmp_path / "odd.gguf"
    write_model(path, Spec(layers=1), extra={"blk.0.attn_qkv.weight": np.zeros((8, 8), np.float32)})
    with pytest.raises(ValueError, match=r"'blk\.0\.attn_qkv\.weight'"):
        open_gguf(path)
    with pytest.raises(FileNotFoundError, match="nothing.gguf"):
        open_gguf(tmp_path / "nothing.gguf")
    with pytest.raises(FileNotFoundError, match="x-00003-of-00003.gguf"):
        gguf_shard_paths(tmp_path / "x-00003-of-00003.gguf")


def test_is_gguf(tmp_path: Path) -> None:
    assert is_gguf("model.Q4_K_M.gguf") and is_gguf(Path("a/B.GGUF"))
    blob = tmp_path / "weights.bin"
    blob.write_bytes(b"GGUF" + bytes(20))
    other = tmp_path / "model.safetensors"
    other.write_bytes(b"\x00" * 24)
    assert is_gguf(blob) and not is_gguf(other) and not is_gguf(tmp_path)
