"""GPTQ and AWQ checkpoints (quant/blocks/gptq_awq.py) kept in blocks: written here by a packer of the test's
own from random codes, scales and zeros (the formats' standard definitions), and checked against the same
definitions: the blocks dequantize exactly to W = s (q - z), the GEMV matches float64 arithmetic, and a
tiny Llama run by the engine matches transformers running the formula's float32 weights."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch
from safetensors.torch import load_file, save_file
from test_quantization import block_gemv_f32
from tiny_models import build_tiny_model, hf_greedy

from glassbox import LLM, SamplingParams
from glassbox.kernels.native import library
from glassbox.quant.blocks.gptq_awq import layer_blocks
from glassbox.quant.blocks.linear import BlockQuantLinear
from glassbox.quant.config import GroupQuant, group_quant
from glassbox.tokenizer.hf_tokenizer import Tokenizer

needs_kernels = pytest.mark.skipif(library() is None, reason="no C compiler: the kernels are not built")
AWQ_ORDER = [0, 2, 4, 6, 1, 3, 5, 7]
LINEARS = ("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj")


# ---- the test's own packer and formula -------------------------------------------------------------


class Layer:
    """Random codes q (K, N), zeros z (G, N), float16 scales (G, N) and each input channel's group."""

    def __init__(
        self, k: int, n: int, group: int, bits: int, act_order: bool, zmin: int, seed: int, perm_seed: int = 0
    ) -> None:
        rng = np.random.default_rng(seed)
        size = k if group == -1 else group
        g = np.arange(k) // size
        # act-order: the groups hold channels in a shuffled order (the same for layers of one input)
        self.g_idx = g[np.random.default_rng(perm_seed).permutation(k)] if act_order else g
        ngroups = -(-k // size)
        top = (1 << bits) - 1
        self.q = rng.integers(0, top + 1, (k, n))
        self.z = rng.integers(zmin, top + 1, (ngroups, n))
        # scales near 0.08 / 2^(bits-1), so the weights are about as large as the float model's
        self.s = (rng.uniform(0.5, 1.5, (ngroups, n)) * 0.16 / (1 << bits)).astype(np.float16)
        self.bits = bits

    def weight(self) -> torch.Tensor:
        """W (N, K) float32: W[n, k] = s[g, n] (q[k, n] - z[g, n]), g = g_idx[k]."""
        g = self.g_idx
        w = self.s[g].astype(np.float32) * (self.q - self.z[g]).astype(np.float32)  # (K, N)
        return torch.from_numpy(np.ascontiguousarray(w.T))


def _words(cols: list[np.ndarray], bits: int) -> torch.Tensor:
    """int32 words whose field i (bits wide, lowest first) holds cols[i]."""
    acc = np.zeros(cols[0].shape, np.uint64)
    for i, c in enumerate(cols):
        acc |= (c.astype(np.uint64) & ((1 << bits) - 1)) << np.uint64(bits * i)
    return torch.from_numpy(acc.astype(np.uint32).view(np.int32))


def pack_gptq(layer: Layer, v1: bool) -> dict[str, torch.Tensor]:
    p = 32 // layer.bits
    stored = layer.z - 1 if v1 else layer.z  # v1 keeps z - 1
    return {
        "qweight": _words([layer.q[i::p] for i in range(p)], layer.bits),  # along K
        "qzeros": _words([stored[:, i::p] for i in range(p)], layer.bits),  # along N
        "scales": torch.from_numpy(layer.s),
        "g_idx": torch.from_numpy(layer.g_idx.astype(np.int32)),
    }


def pack_awq(layer: Layer) -> dict[str, torch.Tensor]:
    return {  # nibble j of word c: column 8 c + AWQ_ORDER[j]
        "qweight": _words([layer.q[:, o::8] for o in AWQ_ORDER], 4),
        "qzeros": _words([layer.z[:, o::8] for o in AWQ_ORDER], 4),
        "scales": torch.from_numpy(layer.s),
    }


def quant_config(method: str, bits: int = 4, group: int = 128, v1: bool = True, act: bool = False) -> dict:
    if method == "awq":
        return {
            "quant_method": "awq",
            "bits": bits,
            "group_size": group,
            "version": "gemm",
            "zero_point": True,
        }
    fmt = "gptq" if v1 else "gptq_v2"
    return {
        "quant_method": "gptq", "bits": bits, "group_size": group, "desc_act": act, "sym": False,
        "checkpoint_format": fmt,
    }  # fmt: skip


CASES = {  # name: (method, bits, group, v1, act-order)
    "gptq-v1-g128": ("gptq", 4, 128, True, False),
    "gptq-v2-g128-act": ("gptq", 4, 128, False, True),
    "gptq-v1-g32-act": ("gptq", 4, 32, True, True),
    "gptq-v2-g-1": ("gptq", 4, -1, False, False),
    "gptq-v1-int8-g64": ("gptq", 8, 64, True, False),
    "awq-g128": ("awq", 4, 128, False, False),
    "awq-g32": ("awq", 4, 32, False, False),
}


def _case_layer(case: str, k: int, n: int, seed: int) -> tuple[Layer, dict[str, torch.Tensor], GroupQuant]:
    method, bits, group, v1, act = CASES[case]
    layer = Layer(k, n, group, bits, act, zmin=1 if v1 else 0, seed=seed)
    parts = pack_awq(layer) if method == "awq" else pack_gptq(layer, v1)
    spec = group_quant(quant_config(method, bits, group, v1, act))
    assert spec is not None
    return layer, parts, spec


# ---- blocks and kernels ----------------------------------------------------------------------------


@pytest.mark.parametrize("case", list(CASES))
@pytest.mark.parametrize("k", [96, 640])
def test_repacked_blocks_dequantize_exactly(case: str, k: int) -> None:
    group = CASES[case][2]
    if group > 32 and k % group:
        k = group * 5  # a group must fill whole blocks: 640 / 128, or 5 groups
    layer, parts, spec = _case_layer(case, k, 40, seed=k)
    w = layer_blocks(spec, parts, "layer")
    ref = layer.weight()
    assert w.label == spec.label and w.zeros is not None
    assert (w.perm is not None) == CASES[case][4]
    assert torch.equal(w.dense(torch.float32), ref)  # the kernels' dequantization
    assert torch.equal(w.dense(torch.bfloat16), ref.bfloat16())
    reference = w.dequantize_reference()  # the PyTorch ops (block order)
    assert torch.equal(reference, w.dequantize(torch.float32))
    ids = torch.tensor([39, 0, 7])
    assert torch.equal(w.rows(ids, torch.float32), ref[ids])


def _int8_reference(x: torch.Tensor, layer: Layer) -> tuple[torch.Tensor, torch.Tensor]:
    """The kernels' arithmetic: x's channels sorted by group, in int8 blocks of 32 (float32 scale
    max|x| / 127, codes rounded half away from zero), times W in float64; and the sum of the terms' magnitudes (s q x and
    s z x summed apart) that float32 rounding scales with."""
    perm = torch.from_numpy(np.argsort(layer.g_idx, kind="stable"))
    k = x.shape[1]
    pad = -k % 32
    xb = torch.nn.functional.pad(x.float()[:, perm], (0, pad)).view(x.shape[0], -1, 32)
    dx = xb.abs().amax(-1, keepdim=True) / 127.0  # float32, as the kernel rounds the codes
    scaled = xb * torch.where(dx > 0, 1.0 / dx, 0.0)
    codes = torch.sign(scaled) * torch.floor(scaled.abs() + 0.5)
    xq = (codes.double() * dx.double()).view(x.shape[0], -1)[:, :k]
    g = layer.g_idx[perm.numpy()]
    s = torch.from_numpy(layer.s[g].astype(np.float64))  # (K, N), channels sorted
    q = torch.from_numpy(layer.q[perm.numpy()].astype(np.float64))
    z = torch.from_numpy(layer.z[g].astype(np.float64))
    y = xq @ (s * (q - z))
    terms = xq.abs() @ (s * q) + xq.abs() @ (s * z)
    return y, terms


@needs_kernels
@pytest.mark.parametrize(
    ("case", "k"), [("gptq-v1-g32-act", 96), ("awq-g32", 96), ("gptq-v2-g128-act", 640), ("gptq-v2-g-1", 576),
                    ("gptq-v1-int8-g64", 640), ("awq-g128", 1152)],
)  # fmt: skip
@pytest.mark.parametrize("m", [1, 3, 16])
def test_gemv_matches_float64_arithmetic(case: str, k: int, m: int) -> None:
    """K = 96 (no whole 512-code chunk), 576 (a chunk and a tail); N = 40 (tiles of 16 and a rest)."""
    layer, parts, spec = _case_layer(case, k, 40, seed=m)
    w = layer_blocks(spec, parts, "layer")
    x = torch.randn(m, k, generator=torch.Generator().manual_seed(k + m)).bfloat16().float()
    ref, terms = _int8_reference(x, layer)
    xs = x if w.perm is None else x[:, w.perm]
    for generic in (False, True):
        err = (block_gemv_f32(w, xs, generic).double() - ref).abs()
        assert bool((err <= 2e-6 * terms + 1e-7).all()), float((err / terms).max())
    # the linear (bf16 in and out) permutes its input itself; bf16 rounds its output
    y = BlockQuantLinear(w)(x.bfloat16()).double()
    assert bool(((y - ref).abs() <= 2**-7 * ref.abs() + 1e-6 * terms + 1e-6).all())
    # float32: the exact weight, channel order restored
    exact = x.double() @ layer.weight().double().t()
    assert torch.allclose(BlockQuantLinear(w)(x).double(), exact, rtol=1e-5, atol=1e-5)


# ---- checkpoints through the engine ----------------------------------------------------------------


def _write(src: Path, out: Path, tensors: dict[str, torch.Tensor], qc: dict | None) -> Path:
    out.mkdir(parents=True)
    for f in src.iterdir():
        if f.suffix != ".safetensors" and f.name != "config.json":
            (out / f.name).write_bytes(f.read_bytes())
    cfg = json.loads((src / "config.json").read_text())
    if qc is not None:
        cfg["quantization_config"] = qc
    (out / "config.json").write_text(json.dumps(cfg))
    save_file({k: v.contiguous() for k, v in tensors.items()}, str(out / "model.safetensors"))
    return out


def quantized_model(
    root: Path, case: str, qc_override: dict[str, Any] | None = None, name: str = ""
) -> tuple[Path, Path]:
    """(the GPTQ/AWQ directory, the same weights as float32 by the formula): a tiny Llama whose linear
    layers are random codes; embeddings, norms and lm_head stay float."""
    out = name or case
    if (root / out / "config.json").is_file():
        return root / out, root / f"{out}-dense"
    base = build_tiny_model("llama", root, hidden_size=256, intermediate_size=384, num_attention_heads=4)
    method, bits, group, v1, act = CASES[case]
    floats = load_file(str(base / "model.safetensors"))
    quant, dense = dict(floats), dict(floats)
    inputs = ("q_proj", "o_proj", "gate_proj", "down_proj")  # q/k/v share an input, gate/up too
    for i, key in enumerate(sorted(n for n in floats if n.rpartition(".")[0].endswith(LINEARS))):
        n_out, k = floats[key].shape
        module = key.split(".")[-2]
        shared = {"k_proj": "q_proj", "v_proj": "q_proj", "up_proj": "gate_proj"}.get(module, module)
        perm_seed = 10 * int(key.split(".")[2]) + inputs.index(shared)
        layer = Layer(k, n_out, group, bits, act, zmin=1 if v1 else 0, seed=i, perm_seed=perm_seed)
        prefix = key.removesuffix(".weight")
        del quant[key]
        parts = pack_awq(layer) if method == "awq" else pack_gptq(layer, v1)
        quant.update({f"{prefix}.{p}": t for p, t in parts.items()})
        dense[key] = layer.weight()
    qc = quant_config(method, bits, group, v1, act) | (qc_override or {})
    return _write(base, root / out, quant, qc), _write(base, root / f"{out}-dense", dense, None)


PROMPTS = ["def fibonacci(n):", "import os\nimport sys\n", "你好，世界", "class Foo:\n    def"]
MAX_NEW = 8
# bf16 decode steps quantize activations to int8 blocks (the GEMV above): measured worst 0.13 nats on these
# random models (their distributions are nearly flat), against 0.06 for the dense weights in bf16
BF16_LOGPROB = 0.25


@pytest.fixture(scope="module")
def root(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("gptq")


@pytest.mark.parametrize("case", ["gptq-v1-g128", "gptq-v2-g128-act", "gptq-v1-int8-g64", "awq-g128"])
def test_checkpoint_runs_as_its_dequantized_weights(root: Path, case: str) -> None:
    qdir, ddir = quantized_model(root, case)
    prompts = [Tokenizer.from_dir(qdir).encode(p) for p in PROMPTS]
    ref = hf_greedy(ddir, prompts, MAX_NEW)
    params = SamplingParams(temperature=0, max_tokens=MAX_NEW, ignore_eos=True, logprobs=1)
    llm = LLM(str(qdir), dtype="float32", device="cpu")
    layers = [m for m in llm.engine.executor.model.modules() if isinstance(m, BlockQuantLinear)]
    assert len(layers) == 2 * 4  # fused q/k/v and gate/up, o, down per layer; lm_head stays float
    spec = group_quant(quant_config(*CASES[case]))
    assert spec is not None and llm.engine.executor.block_formats == [spec.label]
    for out, (toks, lps) in zip(llm.generate(prompts, params), ref, strict=True):
        assert out.token_ids == toks
        assert out.logprobs is not None
        assert max(abs(out.logprobs[j][t] - lps[j]) for j, t in enumerate(toks)) < 1e-4
    # bf16: prompt rows multiply the dequantized weight, decode rows run the int8-activation kernel
    bf16 = LLM(str(qdir), dtype="bfloat16", device="cpu").generate(prompts, params)
    for out, (toks, lps) in zip(bf16, ref, strict=True):
        assert out.token_ids[0] == toks[0]
        assert out.logprobs is not None
        for j, t in enumerate(toks):  # while the greedy paths agree
            if out.token_ids[: j + 1] != toks[: j + 1]:
                break
            assert abs(out.logprobs[j][t] - lps[j]) < BF16_LOGPROB


@pytest.mark.parametrize(
    ("override", "key"),
    [
        ({"quant_method": "awq", "version": "gemv"}, "version"),
        ({"bits": 3}, "bits"),
        ({"group_size": 48}, "group_size"),
        ({"checkpoint_format": "marlin"}, "checkpoint_format"),
    ],
)
def test_unsupported_settings_name_their_key(root: Path, override: dict[str, Any], key: str) -> None:
    qc = quant_config("gptq") | override
    with pytest.raises(ValueError, match=f"quantization_config {key}="):
        group_quant(qc)
    qdir, _ = quantized_model(root, "gptq-v1-g128", override, name=f"bad-{key}")
    with pytest.raises(ValueError, match=f"quantization_config {key}="):
        LLM(str(qdir), dtype="float32", device="cpu")


def test_other_dtypes_and_act_order_gaps_are_refused(root: Path) -> None:
    qdir, _ = quantized_model(root, "gptq-v1-g128")
    with pytest.raises(ValueError, match="GPTQ weights run on the CPU in bf16 or float32"):
        LLM(str(qdir), dtype="float16", device="cpu")
    layer = Layer(96, 16, 32, 4, act_order=False, zmin=1, seed=0)
    layer.g_idx = np.array([0] * 40 + [1] * 24 + [2] * 32)  # group 0: 40 channels, not whole blocks
    with pytest.raises(ValueError, match="group 0 holds 40 input channels"):
        layer_blocks(GroupQuant("gptq", 4, 32, True), pack_gptq(layer, True), "layer")
