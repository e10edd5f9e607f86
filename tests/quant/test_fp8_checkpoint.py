"""FP8 (E4M3) checkpoints kept 8-bit (quant/fp8/checkpoint.py, quant/fp8/linear.py, kernels/cpu_fp8.c),
held to the format's own definition: the test decodes E4M3 from its bits (sign, 4 exponent bits of bias 7,
3 mantissa bits, subnormals at exponent 0) and multiplies by the layout's scale. Tiny Llama checkpoints are
written here in the published layouts (HF "fp8" 128 x 128 blocks; compressed-tensors per-tensor with static
input scales, per-channel with an ignored layer, ragged blocks) from a random model quantized with torch's
float8_e4m3fn; glassbox runs each in float32 token for token like transformers runs the same weights
(the HF layout loaded by transformers itself, in its dequantize mode; the others dequantized by the test
and saved as a plain checkpoint)."""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any

import pytest
import torch
import torch.nn.functional as F
from safetensors.torch import load_file, save_file
from tiny_models import build_tiny_model, hf_greedy

from glassbox import LLM, SamplingParams
from glassbox.kernels.native import library
from glassbox.perf.memory_plan import weight_bytes
from glassbox.perf.quant import resolve_scheme
from glassbox.quant.blocks.ct_int_config import ct_int_spec
from glassbox.quant.fp8.checkpoint import layer_weights, read_fp8
from glassbox.quant.fp8.config import fp8_spec
from glassbox.quant.fp8.linear import Fp8Linear
from glassbox.quant.fp8.weights import Fp8Weights, concat, gemv
from glassbox.tokenizer.hf_tokenizer import Tokenizer
from glassbox.trace import weight_quant

needs_kernels = pytest.mark.skipif(library() is None, reason="no C compiler: the kernels are not built")
LINEARS = ("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj")

# ---- the format, by its definition ------------------------------------------------------------------


def e4m3_value(code: int) -> float:
    """E4M3 ("fn"): S.EEEE.MMM, bias 7; exponent 0 is subnormal (2^-6 x M/8); S.1111.111 is NaN."""
    sign = -1.0 if code & 0x80 else 1.0
    e, m = (code >> 3) & 15, code & 7
    if e == 15 and m == 7:
        return math.nan
    return sign * (math.ldexp(m / 8, -6) if e == 0 else math.ldexp(1 + m / 8, e - 7))


E4M3 = torch.tensor([e4m3_value(c) for c in range(256)], dtype=torch.float64)


def dequantized(codes: torch.Tensor, scales: torch.Tensor, bn: int, bk: int) -> torch.Tensor:
    """W = e4m3(codes) * scale of the weight's (bn x bk) block, in float64, rounded once to float32."""
    n, k = codes.shape
    s = scales.double().reshape(-1, scales.shape[-1] if scales.dim() > 1 else 1)
    s = s.repeat_interleave(bn, 0)[:n].repeat_interleave(bk, 1)[:, :k]
    return (E4M3[codes.view(torch.uint8).long()] * s).float()


def quantize(w: torch.Tensor, bn: int, bk: int) -> tuple[torch.Tensor, torch.Tensor]:
    """(float8_e4m3fn weight, float32 scale grid): each bn x bk block scaled to max|w| = 448, rounded by
    torch's float8 cast."""
    n, k = w.shape
    rows, cols = -(-n // bn), -(-k // bk)
    blocks = F.pad(w.float(), (0, cols * bk - k, 0, rows * bn - n)).view(rows, bn, cols, bk)
    s = blocks.abs().amax(dim=(1, 3)) / 448.0
    q = (blocks / s[:, None, :, None]).to(torch.float8_e4m3fn).view(rows * bn, cols * bk)[:n, :k]
    return q.contiguous(), s


def random_weights(n: int, k: int, bn: int, bk: int, seed: int) -> Fp8Weights:
    """Quantized random weights whose codes also run through every finite code (subnormals, +-0)."""
    q, s = quantize(torch.randn(n, k, generator=torch.Generator().manual_seed(seed)), bn, bk)
    codes = q.view(torch.uint8).clone()
    every = torch.tensor([c for c in range(256) if c & 0x7F != 0x7F], dtype=torch.uint8)
    flat = codes.view(-1)
    flat[: min(flat.numel(), every.numel())] = every[: flat.numel()]
    return Fp8Weights(codes, s, bn, bk, "test")


# (N, K, block rows, block cols): odd sizes, short last blocks, per-tensor (N x K) and per-channel (1 x K)
SHAPES = [(37, 200, 128, 128), (130, 300, 128, 128), (5, 77, 1, 77), (33, 48, 16, 16), (40, 333, 40, 333),
          (70, 1000, 32, 64)]  # fmt: skip


def test_e4m3_decoding_agrees_with_torch() -> None:
    finite = [c for c in range(256) if c & 0x7F != 0x7F]
    as_torch = torch.tensor(finite, dtype=torch.uint8).view(torch.float8_e4m3fn).double()
    assert torch.equal(as_torch, E4M3[finite])
    assert E4M3[0x7E] == 448 and E4M3[1] == 2.0**-9  # largest, smallest subnormal


@needs_kernels
@pytest.mark.parametrize(("n", "k", "bn", "bk"), SHAPES)
def test_dequantize_is_the_definition(n: int, k: int, bn: int, bk: int) -> None:
    w = random_weights(n, k, bn, bk, seed=n)
    ref = dequantized(w.codes, w.scales, bn, bk)
    assert torch.equal(w.dequantize(torch.float32), ref)  # the C kernel, exact
    assert torch.equal(w.dequantize(torch.bfloat16), ref.bfloat16())
    assert torch.equal(w.dequantize_reference(), ref)  # the PyTorch fallback
    assert torch.equal(w.dequantize(torch.bfloat16, (3, n - 1)), ref[3 : n - 1].bfloat16())  # a tile


@needs_kernels
@pytest.mark.parametrize(("n", "k", "bn", "bk"), SHAPES)
@pytest.mark.parametrize("m", [1, 3, 17])
def test_gemv_matches_float64(n: int, k: int, bn: int, bk: int, m: int) -> None:
    """Vector and plain-C paths, float32 and bf16 activations: within float32 summation of the exact
    products; bf16 outputs within their rounding."""
    w = random_weights(n, k, bn, bk, seed=n + m)
    x = torch.randn(m, k, generator=torch.Generator().manual_seed(m)).bfloat16().float()
    bias = torch.randn(n)
    wd = dequantized(w.codes, w.scales, bn, bk).double()
    exact = x.double() @ wd.t() + bias.double()
    terms = x.double().abs() @ wd.abs().t() + bias.double().abs()
    for generic in (False, True):
        err = (gemv(w, x, bias, generic).double() - exact).abs()
        assert bool((err <= 1e-6 * terms).all()), float((err / terms).max())
        y = gemv(w, x.bfloat16(), bias, generic).double()
        assert bool(((y - exact).abs() <= 2**-8 * exact.abs() + 1e-6 * terms).all())
    lin = Fp8Linear(w, bias)  # the module: the GEMV up to its kernel rows, tiles of rows past them
    lin.tile_rows = 16
    assert torch.allclose(lin(x).double(), exact, rtol=1e-5, atol=1e-5 * float(terms.max()))


def test_stacked_layers_keep_each_scale() -> None:
    """A fused q/k/v of per-tensor parts (a scale per row), of per-channel parts and of block parts whose
    heights are whole blocks (the last one aside) stacks with every row's scales; block parts that do not
    line up, or differ in their column blocks, stay apart."""
    for bn, bk, heights in ((None, None, (48, 16, 16)), (1, None, (40, 24, 24)), (32, 64, (64, 32, 8))):
        parts = [random_weights(h, 96, bn or h, bk or 96, seed=h) for h in heights]
        both = concat(parts)
        assert both is not None
        ref = torch.cat([dequantized(p.codes, p.scales, p.block_rows, p.block_cols) for p in parts])
        assert torch.equal(both.dequantize_reference(), ref)
        assert both.nbytes <= sum(p.nbytes for p in parts) + 4 * sum(heights)
    assert concat([random_weights(h, 96, 32, 64, h) for h in (40, 24, 24)]) is None
    assert concat([random_weights(8, 96, 8, 96, 0), random_weights(8, 96, 8, 32, 1)]) is None


# ---- checkpoints -------------------------------------------------------------------------------------


def ct_config(
    strategy: str, block: list[int] | None, static_input: bool, ignore: list[str]
) -> dict[str, Any]:
    weights = {"num_bits": 8, "type": "float", "symmetric": True, "dynamic": False, "strategy": strategy,
               "block_structure": block, "group_size": None, "actorder": None, "observer": "minmax"}  # fmt: skip
    act = {"num_bits": 8, "type": "float", "symmetric": True, "dynamic": not static_input,
           "strategy": "tensor" if static_input else "token"}  # fmt: skip
    return {
        "quant_method": "compressed-tensors", "format": "float-quantized", "quantization_status": "compressed",
        "config_groups": {"group_0": {"targets": ["Linear"], "weights": weights, "input_activations": act,
                                      "output_activations": None}},
        "ignore": ignore, "kv_cache_scheme": None,
    }  # fmt: skip


HF_FP8 = {
    "quant_method": "fp8",
    "activation_scheme": "dynamic",
    "fmt": "e4m3",
    "weight_block_size": [128, 128],
}
IGNORED = "model.layers.1.mlp.down_proj"
CASES: dict[str, tuple[dict[str, Any], int | None, int | None]] = {  # config, block rows, cols (None: all)
    "hf-fp8-block128": (HF_FP8, 128, 128),
    "ct-tensor-static": (ct_config("tensor", None, True, ["lm_head"]), None, None),
    "ct-channel": (ct_config("channel", None, False, ["lm_head", IGNORED]), 1, None),
    "ct-block-96x64": (ct_config("block", [96, 64], False, ["lm_head"]), 96, 64),  # short blocks everywhere
}


def write_checkpoint(base: Path, out: Path, tensors: dict[str, torch.Tensor], qc: dict | None) -> Path:
    out.mkdir(parents=True)
    for f in base.iterdir():
        if f.suffix != ".safetensors" and f.name != "config.json":
            (out / f.name).write_bytes(f.read_bytes())
    cfg = json.loads((base / "config.json").read_text())
    if qc is not None:
        cfg["quantization_config"] = qc
    (out / "config.json").write_text(json.dumps(cfg))
    save_file({k: v.contiguous() for k, v in tensors.items()}, str(out / "model.safetensors"))
    return out


@pytest.fixture(scope="module")
def root(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("fp8")


def fp8_model(root: Path, case: str) -> tuple[Path, Path]:
    """(the FP8 checkpoint, its weights dequantized by the definition as a plain float32 checkpoint)."""
    if (root / case / "config.json").is_file():
        return root / case, root / f"{case}-dense"
    base = build_tiny_model("llama", root, hidden_size=256, intermediate_size=384, num_attention_heads=4)
    qc, bn, bk = CASES[case]
    floats = load_file(str(base / "model.safetensors"))
    quant, dense = dict(floats), dict(floats)
    scale_part = "weight_scale_inv" if qc["quant_method"] == "fp8" else "weight_scale"
    for key in sorted(n for n in floats if n.rpartition(".")[0].endswith(LINEARS)):
        prefix = key.removesuffix(".weight")
        if prefix == IGNORED and case == "ct-channel":
            continue  # stays float32 (the config's ignore list)
        n, k = floats[key].shape
        q, s = quantize(floats[key], bn or n, bk or k)
        quant[key] = q
        quant[f"{prefix}.{scale_part}"] = s.reshape(n, 1) if bn == 1 else s.reshape(1) if bn is None else s
        if case == "ct-tensor-static":
            quant[f"{prefix}.input_scale"] = torch.tensor([0.02])
        dense[key] = dequantized(q, s, bn or n, bk or k)
    return write_checkpoint(base, root / case, quant, qc), write_checkpoint(
        base, root / f"{case}-dense", dense, None
    )


PROMPTS = ["def fibonacci(n):", "import os\nimport sys\n", "你好，世界", "class Foo:\n    def"]
MAX_NEW = 8


@pytest.mark.parametrize("case", list(CASES))
def test_checkpoint_runs_as_its_dequantized_weights(root: Path, case: str) -> None:
    qdir, ddir = fp8_model(root, case)
    prompts = [Tokenizer.from_dir(qdir).encode(p) for p in PROMPTS]
    # the reference: transformers loads the HF layout itself (dequantizing on the CPU), else the plain copy
    ref = hf_greedy(qdir if case.startswith("hf") else ddir, prompts, MAX_NEW)
    params = SamplingParams(temperature=0, max_tokens=MAX_NEW, ignore_eos=True, logprobs=1)
    llm = LLM(str(qdir), dtype="float32", device="cpu")
    ex = llm.engine.executor
    fp8 = [m for m in ex.model.modules() if isinstance(m, Fp8Linear)]
    # per layer: fused q/k/v (apart where its blocks do not line up: 96-row blocks of 256 + 128 + 128 rows),
    # fused gate/up, o, down (one down_proj ignored); lm_head float
    assert len(fp8) == {"ct-channel": 7, "ct-block-96x64": 12}.get(case, 8)
    assert all(m.codes.dtype == torch.uint8 for m in fp8) and ex.block_formats
    for out, (toks, lps) in zip(llm.generate(prompts, params), ref, strict=True):
        assert out.token_ids == toks
        assert out.logprobs is not None
        assert max(abs(out.logprobs[j][t] - lps[j]) for j, t in enumerate(toks)) < 1e-4
    # what the planner (and `glassbox trace`) costs this engine by: FP8 at 8 bits, the rest at 32
    facts = llm.engine.facts
    scheme = resolve_scheme(weight_quant(llm.engine), facts.native_quant, "fp32", False, None)
    assert scheme.main.name == "fp8" and scheme.embed.name == "fp32"
    ignored = 3 * 384 * 256 if case == "ct-channel" else 0  # the layer left in float32 (4 bytes, not 1)
    assert weight_bytes(facts, scheme) + ignored == pytest.approx(ex.weight_bytes, rel=0.01)


def test_bf16_engine_stays_close(root: Path) -> None:
    qdir, ddir = fp8_model(root, "hf-fp8-block128")
    prompts = [Tokenizer.from_dir(qdir).encode(p) for p in PROMPTS]
    ref = hf_greedy(ddir, prompts, MAX_NEW)
    params = SamplingParams(temperature=0, max_tokens=MAX_NEW, ignore_eos=True, logprobs=1)
    for out, (toks, lps) in zip(LLM(str(qdir), dtype="bfloat16", device="cpu").generate(prompts, params), ref,
                                strict=True):  # fmt: skip
        assert out.token_ids[0] == toks[0]
        assert out.logprobs is not None
        for j, t in enumerate(toks):  # while the greedy paths agree
            if out.token_ids[: j + 1] != toks[: j + 1]:
                break
            assert abs(out.logprobs[j][t] - lps[j]) < 0.25  # bf16 activations and bf16 weight tiles


UNSUPPORTED = [
    (HF_FP8 | {"fmt": "e5m2"}, "fmt"),
    (HF_FP8 | {"activation_scheme": "tensorwise"}, "activation_scheme"),
    (HF_FP8 | {"weight_block_size": [128, 100]}, "weight_block_size"),
    (HF_FP8 | {"expert_dtype": "fp4"}, "expert_dtype"),
    (ct_config("group", None, False, []), "config_groups.group_0.weights.strategy"),
    (ct_config("channel", None, False, []) | {"format": "pack-quantized"}, "format"),
    (ct_config("channel", None, False, []) | {"sparsity_config": {"format": "sparse-24-bitmask"}},
     "sparsity_config.format"),
    ({"quant_method": "fbgemm_fp8", "activation_scale_ub": 1200.0}, "quant_method"),
]  # fmt: skip


@pytest.mark.parametrize(("qc", "key"), UNSUPPORTED, ids=[k for _, k in UNSUPPORTED])
def test_unsupported_settings_name_their_key(qc: dict[str, Any], key: str) -> None:
    with pytest.raises(ValueError, match=f"quantization_config {key}="):
        fp8_spec(qc)


@pytest.mark.parametrize(
    ("path", "value", "key"),
    [(("weights", "num_bits"), 4, "weights.num_bits"), (("weights", "symmetric"), False, "weights.symmetric"),
     (("input_activations", "type"), "int", "input_activations")],
)  # fmt: skip
def test_unsupported_groups_name_their_key(path: tuple[str, str], value: Any, key: str) -> None:
    qc = ct_config("channel", None, False, [])
    qc["config_groups"]["group_0"][path[0]][path[1]] = value
    with pytest.raises(ValueError, match=f"quantization_config config_groups.group_0.{key}="):
        fp8_spec(qc)


def test_integer_groups_are_not_fp8() -> None:
    """All-integer configs are quant/blocks/ct_int.py's (fp8_spec: None; an integer type in the float format is
    refused there, by its format); an integer group beside an FP8 one is refused here, by its type."""
    qc = ct_config("channel", None, False, [])
    qc["config_groups"]["group_0"]["weights"]["type"] = "int"
    assert fp8_spec(qc) is None
    with pytest.raises(ValueError, match="quantization_config format='float-quantized'"):
        ct_int_spec(qc)
    mixed = ct_config("channel", None, False, [])
    mixed["config_groups"]["group_1"] = json.loads(json.dumps(mixed["config_groups"]["group_0"]))
    mixed["config_groups"]["group_1"]["weights"]["type"] = "int"
    with pytest.raises(ValueError, match="quantization_config config_groups.group_1.weights.type='int'"):
        fp8_spec(mixed)


def test_engine_refuses_bad_configs_and_tensors(root: Path) -> None:
    qdir, _ = fp8_model(root, "ct-channel")
    bad = root / "bad-int"
    cfg = json.loads((qdir / "config.json").read_text())
    cfg["quantization_config"]["config_groups"]["group_0"]["weights"]["type"] = "int"
    bad.mkdir()
    for f in qdir.iterdir():
        (bad / f.name).write_bytes(f.read_bytes())
    (bad / "config.json").write_text(json.dumps(cfg))
    with pytest.raises(ValueError, match="quantization_config format='float-quantized': integer weights"):
        LLM(str(bad), dtype="float32", device="cpu")
    spec = fp8_spec(CASES["ct-channel"][0])
    assert spec is not None
    q, s = quantize(torch.randn(8, 32), 1, 32)
    with pytest.raises(ValueError, match="fits none of the checkpoint's layouts"):
        layer_weights(q, s.reshape(1, 8), spec, "layer")
    nan = q.view(torch.uint8).clone()
    nan[0, 0] = 0xFF
    with pytest.raises(ValueError, match="NaN codes"):
        layer_weights(nan.view(torch.float8_e4m3fn), s, spec, "layer")
    lone = root / "lone"
    lone.mkdir()
    save_file({"a.weight": q}, str(lone / "model.safetensors"))
    with pytest.raises(ValueError, match="a.weight: an FP8 weight without its weight_scale"):
        read_fp8(lone, spec)
