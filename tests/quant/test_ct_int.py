"""compressed-tensors integer checkpoints (quant/blocks/ct_int.py: llm-compressor's W4A16, W8A16, W8A8) kept in
blocks. The checkpoints are written by the compressed-tensors package itself (its compressors quantize and
pack each layer), and its own decompression is the reference: the blocks dequantize exactly to it, and a
tiny Llama run by the engine matches transformers running the decompressed float32 weights."""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Any

import pytest
import torch
from safetensors.torch import load_file
from test_gptq_awq import LINEARS, MAX_NEW, PROMPTS, _write
from tiny_models import build_tiny_model, hf_greedy

from glassbox import LLM, SamplingParams
from glassbox.quant.blocks.ct_int import layer_blocks
from glassbox.quant.blocks.ct_int_config import CtIntSpec, ct_int_spec
from glassbox.quant.blocks.linear import BlockQuantLinear
from glassbox.tokenizer.hf_tokenizer import Tokenizer

ct = pytest.importorskip("compressed_tensors")
from compressed_tensors.compressors.naive_quantized.base import IntQuantizationCompressor  # noqa: E402
from compressed_tensors.compressors.pack_quantized.base import PackedQuantizationCompressor  # noqa: E402
from compressed_tensors.compressors.pack_quantized.helpers import pack_to_int32, unpack_from_int32  # noqa: E402
from compressed_tensors.quantization import QuantizationArgs, QuantizationScheme  # noqa: E402

# name: (format, bits, strategy, group size, symmetric, W8A8 activations, act-order by group)
CASES: dict[str, tuple[str, int, str, int | None, bool, bool, bool]] = {
    "w4a16-g128": ("pack-quantized", 4, "group", 128, True, False, False),
    "w4a16-g32-asym": ("pack-quantized", 4, "group", 32, False, False, False),
    "w4a16-g64-actorder": ("pack-quantized", 4, "group", 64, True, False, True),
    "w4a16-channel": ("pack-quantized", 4, "channel", None, True, False, False),
    "w8a16-channel-asym": ("pack-quantized", 8, "channel", None, False, False, False),
    "w8a8-int": ("int-quantized", 8, "channel", None, True, True, False),
}


def _args(case: str) -> QuantizationArgs:
    _, bits, strategy, group, sym, _, _ = CASES[case]
    return QuantizationArgs(num_bits=bits, type="int", symmetric=sym, strategy=strategy, group_size=group)


def _scheme(case: str) -> QuantizationScheme:
    act = QuantizationArgs(num_bits=8, type="int", strategy="token", dynamic=True) if CASES[case][5] else None
    return QuantizationScheme(targets=["Linear"], weights=_args(case), input_activations=act)


def quant_config(case: str, **override: Any) -> dict[str, Any]:
    """As llm-compressor writes it into config.json."""
    fmt = CASES[case][0]
    scheme = _scheme(case).model_dump()
    if CASES[case][6]:
        scheme["weights"]["actorder"] = "group"
    qc = {
        "quant_method": "compressed-tensors",
        "format": fmt,
        "quantization_status": "compressed",
        "config_groups": {"group_0": scheme},
        "ignore": ["lm_head"],
        "kv_cache_scheme": None,
    }
    return qc | override


def _scale_zero(w: torch.Tensor, case: str) -> tuple[torch.Tensor, torch.Tensor | None]:
    """Min-max scales (float16 values in float32: exact in both) and signed zero points per group."""
    _, bits, strategy, group, sym, _, _ = CASES[case]
    n, k = w.shape
    g = w.view(n, -1, group) if strategy == "group" and group is not None else w.view(n, 1, k)
    top = (1 << (bits - 1)) - 1
    if sym:
        return (g.abs().amax(-1) / top).half().float(), None
    lo, hi = g.amin(-1).clamp(max=0), g.amax(-1).clamp(min=0)
    s = ((hi - lo) / (2 * top + 1)).half().float()
    return s, (-(top + 1) - torch.round(lo / s)).clamp(-(top + 1), top).to(torch.int8)


def compress(w: torch.Tensor, case: str, seed: int) -> tuple[dict[str, torch.Tensor], torch.Tensor]:
    """(the layer's stored tensors, written by compressed-tensors, and its decompressed float32 weight);
    act-order channels in an order drawn from ``seed`` (the same for layers of one input: GPTQ orders them
    by the input's statistics)."""
    scheme = _scheme(case)
    compressor = (
        PackedQuantizationCompressor if CASES[case][0] == "pack-quantized" else IntQuantizationCompressor
    )
    perm = (
        torch.randperm(w.shape[1], generator=torch.Generator().manual_seed(seed)) if CASES[case][6] else None
    )
    src = w if perm is None else w[:, perm]  # act-order: groups of the channels in ``perm``'s order
    s, z = _scale_zero(src, case)
    state = {"weight": src, "weight_scale": s} | ({} if z is None else {"weight_zero_point": z})
    stored = compressor.compress(state, scheme)
    dense = compressor.decompress(stored, scheme)["weight"].float()
    if perm is None:
        return stored, dense
    # stored in input-channel order, each channel's group in g_idx (the format before compressed-tensors
    # 0.20 dropped it); the packing is the library's
    unpacked = unpack_from_int32(stored["weight_packed"], CASES[case][1], w.shape)
    codes = torch.empty_like(unpacked)
    codes[:, perm] = unpacked
    group = CASES[case][3]
    assert group is not None
    g_idx = torch.empty(w.shape[1], dtype=torch.int32)
    g_idx[perm] = (torch.arange(w.shape[1]) // group).to(torch.int32)
    out = torch.empty_like(dense)
    out[:, perm] = dense
    stored = dict(stored, weight_packed=pack_to_int32(codes, CASES[case][1]), weight_g_idx=g_idx)
    return stored, out


def _spec(case: str) -> CtIntSpec:
    spec = ct_int_spec(quant_config(case))
    assert spec is not None
    return spec


@pytest.mark.parametrize("case", list(CASES))
@pytest.mark.parametrize("k", [128, 640])
def test_blocks_dequantize_to_the_library_decompression(case: str, k: int) -> None:
    group = CASES[case][3] or 32
    k = k if k % group == 0 else 5 * group
    w = torch.randn(40, k, generator=torch.Generator().manual_seed(k)) * 0.05
    stored, dense = compress(w, case, seed=k)
    blocks = layer_blocks(_spec(case), stored, "layer")
    assert torch.equal(blocks.dense(torch.float32), dense)
    assert torch.equal(blocks.dequantize_reference(), blocks.dequantize(torch.float32))
    assert (blocks.perm is not None) == CASES[case][6]
    assert blocks.bits == CASES[case][1]
    # symmetric: held as Q4_0 / Q8_0 are (a constant offset), without zero codes
    assert (blocks.zeros is None) == CASES[case][4]
    assert blocks.offset_factor == (-float(1 << (CASES[case][1] - 1)) if CASES[case][4] else 0.0)


def test_channel_rows_not_whole_blocks() -> None:
    """K = 100: the packed words end mid-block; the blocks pad it."""
    for case in ("w4a16-channel", "w8a16-channel-asym", "w8a8-int"):
        w = torch.randn(24, 100, generator=torch.Generator().manual_seed(1)) * 0.05
        stored, dense = compress(w, case, seed=1)
        assert torch.equal(layer_blocks(_spec(case), stored, "layer").dense(torch.float32), dense)


def test_bf16_scales_as_llm_compressor_stores_them() -> None:
    """Scales in the model's dtype (bf16): float16 holds them exactly; the library's decompression rounds
    the product to bf16 once, as the blocks' exact float32 product rounded to bf16."""
    w = torch.randn(32, 256, generator=torch.Generator().manual_seed(3)) * 0.05
    scheme = _scheme("w4a16-g128")
    s = (w.view(32, 2, 128).abs().amax(-1) / 7).bfloat16()
    stored = PackedQuantizationCompressor.compress({"weight": w.bfloat16(), "weight_scale": s}, scheme)
    ref = PackedQuantizationCompressor.decompress(stored, scheme)["weight"]
    assert ref.dtype == torch.bfloat16
    blocks = layer_blocks(_spec("w4a16-g128"), stored, "layer")
    assert torch.equal(blocks.dense(torch.float32).bfloat16(), ref)


# ---- checkpoints through the engine ----------------------------------------------------------------


def quantized_model(root: Path, case: str, qc_override: dict[str, Any] | None = None) -> tuple[Path, Path]:
    """(the compressed-tensors directory, the same weights decompressed in float32): a tiny Llama whose
    linear layers are quantized by the library; embeddings, norms and lm_head (ignored) stay float."""
    out = case + ("-" + "-".join(sorted(qc_override)) if qc_override else "")
    if (root / out / "config.json").is_file():
        return root / out, root / f"{out}-dense"
    base = build_tiny_model("llama", root, hidden_size=256, intermediate_size=384, num_attention_heads=4)
    floats = load_file(str(base / "model.safetensors"))
    quant, dense = dict(floats), dict(floats)
    for key in sorted(n for n in floats if n.rpartition(".")[0].endswith(LINEARS)):
        prefix = key.removesuffix(".weight")
        module = key.split(".")[-2]
        shared = {"k_proj": "q_proj", "v_proj": "q_proj", "up_proj": "gate_proj"}.get(module, module)
        stored, weight = compress(
            floats[key].float(), case, seed=10 * int(key.split(".")[2]) + LINEARS.index(shared)
        )
        del quant[key]
        quant.update({f"{prefix}.{p}": t for p, t in stored.items()})
        dense[key] = weight
    qc = quant_config(case, **(qc_override or {}))
    return _write(base, root / out, quant, qc), _write(base, root / f"{out}-dense", dense, None)


@pytest.fixture(scope="module")
def root(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("ct-int")


@pytest.mark.parametrize("case", ["w4a16-g128", "w4a16-g32-asym", "w4a16-g64-actorder", "w8a8-int"])
def test_checkpoint_runs_as_its_decompressed_weights(
    root: Path, case: str, caplog: pytest.LogCaptureFixture
) -> None:
    qdir, ddir = quantized_model(root, case)
    prompts = [Tokenizer.from_dir(qdir).encode(p) for p in PROMPTS]
    ref = hf_greedy(ddir, prompts, MAX_NEW)
    params = SamplingParams(temperature=0, max_tokens=MAX_NEW, ignore_eos=True, logprobs=1)
    with caplog.at_level(logging.INFO, logger="glassbox.quant.blocks.ct_int"):
        llm = LLM(str(qdir), dtype="float32", device="cpu")
    layers = [m for m in llm.engine.executor.model.modules() if isinstance(m, BlockQuantLinear)]
    assert len(layers) == 2 * 4  # fused q/k/v and gate/up, o, down per layer; lm_head stays float
    bits, strategy, group = CASES[case][1], CASES[case][2], CASES[case][3]
    assert llm.engine.executor.block_formats == [f"CT int{bits} " + (f"g{group}" if group else strategy)]
    assert ("activation quantization" in caplog.text) == CASES[case][5]
    for out, (toks, lps) in zip(llm.generate(prompts, params), ref, strict=True):
        assert out.token_ids == toks
        assert out.logprobs is not None
        assert max(abs(out.logprobs[j][t] - lps[j]) for j, t in enumerate(toks)) < 1e-4


def test_transformers_runs_the_same_checkpoint(root: Path) -> None:
    """transformers' own compressed-tensors integration (decompressing each layer as it runs) gives the
    dense copy's greedy tokens and logprobs: the checkpoint is the format as published, not only as this
    test's reference reads it. (Symmetric weights: transformers 5.24 with compressed-tensors 0.20 allots
    packed zero points unpacked and refuses asymmetric checkpoints.)"""
    qdir, ddir = quantized_model(root, "w4a16-g128")
    prompts = [Tokenizer.from_dir(qdir).encode(p) for p in PROMPTS[:2]]
    packed, dense = hf_greedy(qdir, prompts, MAX_NEW), hf_greedy(ddir, prompts, MAX_NEW)
    assert [toks for toks, _ in packed] == [toks for toks, _ in dense]
    # The two runs multiply the same float32 weights, but through different kernels (a decompressed
    # weight vs a loaded one: another layout, so BLAS may sum in another order; on an AMD EPYC they
    # differed at 1e-6, bit-equal on an Intel Xeon). float32 sums of K terms differ by <= K * 2**-24 of
    # sum |x w| (K <= 128 here, a few layers): ~1e-5 relative at most, and a logprob moves by at most
    # twice its logits' largest change; 1e-4 holds that with room, far below any format error (Q4: 1e-2).
    for (_, a), (_, b) in zip(packed, dense, strict=True):
        assert a == pytest.approx(b, abs=1e-4)


@pytest.mark.parametrize(
    ("override", "key"),
    [
        ({"format": "marlin-24"}, "format"),
        ({"transform_config": {"x": 1}}, "transform_config"),
        ({"sparsity_config": {"format": "sparse-24-bitmask"}}, "sparsity_config.format"),
    ],
)
def test_unsupported_settings_name_their_key(root: Path, override: dict[str, Any], key: str) -> None:
    with pytest.raises(ValueError, match=f"quantization_config {key}="):
        ct_int_spec(quant_config("w4a16-g128", **override))
    qdir, _ = quantized_model(root, "w4a16-g128", override)
    with pytest.raises(ValueError, match=f"quantization_config {key}="):
        LLM(str(qdir), dtype="float32", device="cpu")


@pytest.mark.parametrize(
    ("field", "value", "key"),
    [
        ("num_bits", 3, "weights.num_bits"),
        ("strategy", "block", "weights.strategy"),
        ("group_size", 48, "weights.group_size"),
        ("dynamic", True, "weights.dynamic"),
    ],
)
def test_unsupported_weight_settings_name_their_key(field: str, value: Any, key: str) -> None:
    qc = quant_config("w4a16-g128")
    qc["config_groups"]["group_0"]["weights"][field] = value
    with pytest.raises(ValueError, match=f"quantization_config config_groups.group_0.{key}="):
        ct_int_spec(qc)


def test_float_formats_are_not_taken() -> None:
    """FP8 groups stay quant/fp8/config.py's; a model of 16-bit weights has no spec."""
    qc = quant_config("w4a16-g128")
    qc["config_groups"]["group_0"]["weights"] |= {"type": "float", "num_bits": 8}
    assert ct_int_spec(qc) is None
    assert ct_int_spec({"quant_method": "gptq", "bits": 4}) is None


def test_a_scale_without_integer_codes_is_named() -> None:
    spec = _spec("w8a8-int")
    with pytest.raises(ValueError, match=r"^m: weight_scale beside a torch.bfloat16 weight"):
        layer_blocks(
            spec, {"weight_scale": torch.ones(4, 1), "weight": torch.ones(4, 32, dtype=torch.bfloat16)}, "m"
        )
    with pytest.raises(ValueError, match="^m: an integer weight without its weight_scale"):
        layer_blocks(spec, {"weight": torch.ones(4, 32, dtype=torch.int8)}, "m")
