"""Quantization formats (bits incl. scales, by hand) and how schemes map onto a model."""

from __future__ import annotations

import pytest

from glassbox.perf.hardware import GIB
from glassbox.perf.memory_plan import weight_bytes
from glassbox.perf.model_presets import load_model_facts
from glassbox.perf.quant import get_format, resolve_scheme
from glassbox.quant.config import native_quant_from_config
from glassbox.quant.formats import FORMATS


def test_bits_per_weight_by_hand() -> None:
    assert FORMATS["q8_0"].bits_per_weight == 34 * 8 / 32  # 32 int8 + fp16 scale
    assert FORMATS["q4_0"].bits_per_weight == 18 * 8 / 32  # 32 nibbles + fp16 scale
    assert FORMATS["nvfp4"].bits_per_weight == 4 + 8 / 16  # E2M1 + FP8 scale per 16
    assert FORMATS["mxfp4"].bits_per_weight == 4 + 8 / 32  # E2M1 + E8M0 scale per 32
    assert FORMATS["w4a16"].bits_per_weight == pytest.approx(4 + 20 / 128)  # fp16 scale + 4-bit zero / 128
    assert FORMATS["bf16"].bits_per_weight == FORMATS["fp16"].bits_per_weight == 16
    assert 4.5 < FORMATS["q4_k_m"].bits_per_weight < 5.0  # between Q4_K (4.5) and Q6_K (6.56)


def test_unknown_format_names_the_flag() -> None:
    with pytest.raises(ValueError, match="--quant must be one of"):
        get_format("q3_xs")
    assert get_format("BF16").name == "bf16" and get_format("awq").name == "w4a16"


def test_gpt_oss_native_mix() -> None:
    f = load_model_facts("gpt-oss-20b")
    scheme = resolve_scheme("mxfp4", f.native_quant, f.dtype, gguf_engine=False, mixed_rest_format=None)
    assert scheme.describe() == {"experts": "mxfp4", "main": "bf16", "embed": "bf16", "lm_head": "bf16"}
    assert resolve_scheme("native", f.native_quant, f.dtype, False, None) == scheme
    # llama.cpp's GGUF (ggml-org) stores the non-expert tensors as q8_0: llama-bench reports 11.27 GiB.
    gguf = resolve_scheme("mxfp4", f.native_quant, f.dtype, gguf_engine=True, mixed_rest_format="q8_0")
    assert gguf.main.name == gguf.lm_head.name == "q8_0" and gguf.experts.name == "mxfp4"
    assert weight_bytes(f, gguf) / GIB == pytest.approx(11.27, rel=0.01)
    # gpt-oss-120b GGUF: 59.02 GiB (llama-bench on a DGX Spark).
    big = load_model_facts("gpt-oss-120b")
    gguf_big = resolve_scheme("mxfp4", big.native_quant, big.dtype, True, "q8_0")
    assert weight_bytes(big, gguf_big) / GIB == pytest.approx(59.02, rel=0.01)


def test_uniform_formats() -> None:
    f = load_model_facts("llama-3.1-8b")
    fp8 = resolve_scheme("fp8", None, "bf16", False, None)
    assert fp8.main.name == "fp8" and fp8.lm_head.name == "bf16" and fp8.embed.name == "bf16"
    q4 = resolve_scheme("q4_k_m", None, "bf16", True, "q8_0")
    assert {q4.format_for(g).name for g in ("embed", "lm_head", "attention", "mlp")} == {"q4_k_m"}
    # Llama 3.1 8B Q4_K_M GGUF is 4.58 GiB (llama.cpp's reported size).
    assert weight_bytes(f, q4) / GIB == pytest.approx(4.58, rel=0.03)
    # Requesting bf16 for a natively quantized model means dequantized weights everywhere.
    oss = load_model_facts("gpt-oss-20b")
    assert resolve_scheme("bf16", oss.native_quant, oss.dtype, False, None).experts.name == "bf16"


@pytest.mark.parametrize(
    "qc,expected",
    [
        ({"quant_method": "fp8", "weight_block_size": [128, 128]}, ("fp8", "fp8")),
        ({"quant_method": "awq", "bits": 4, "group_size": 128}, ("w4a16", "w4a16")),
        ({"quant_method": "compressed-tensors", "format": "nvfp4-pack-quantized"}, ("nvfp4", "nvfp4")),
        (
            {
                "quant_method": "compressed-tensors",
                "config_groups": {"g": {"weights": {"num_bits": 8, "type": "float"}}},
            },
            ("fp8", "fp8"),
        ),
        ({"quant_method": "mxfp4"}, ("mxfp4", "bf16")),
    ],
)
def test_native_quant_parsing(qc: dict, expected: tuple[str, str]) -> None:
    native = native_quant_from_config({"quantization_config": qc}, "bf16")
    assert native is not None and (native.experts, native.main) == expected
    assert native.lm_head == "bf16"
    assert native_quant_from_config({}, "bf16") is None
