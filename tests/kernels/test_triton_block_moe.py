"""The fused MoE on experts kept in blocks (kernels/triton_block_moe.py, stacked by quant/blocks/moe_stack.py), as
CUDA runs it: int4 (Q4_0's layout), asymmetric int4 (stored offsets), int8, GGUF Q4_K and Q6_K, MXFP4 and
NVFP4 experts, [gate | up] halves with SiLU and gpt-oss's interleaved clamped SwiGLU with biases, hidden
sizes with blocks past the last whole chunk, 1-40 tokens, against each expert's dequantized weights in
float64 (the formats' dequantization is checked against their references elsewhere); then ``MoEExperts``
holding such experts switched onto the kernels (models/moe_triton.use_triton_experts) against its own
reference path. Skipped unless CUDA, or ``TRITON_INTERPRET=1`` with triton (float32 there).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch
import torch.nn.functional as F
from gguf import GGMLQuantizationType as Q
from gguf_factory import random_blocks
from test_triton_block_linear import CUDA, DEV, INTERPRET

from glassbox.quant.blocks import kquant
from glassbox.quant.blocks import quantize as block_quantize
from glassbox.quant.blocks.linear import BlockQuantLinear
from glassbox.quant.fp4.linear import FP4Linear
from glassbox.quant.fp4.quantize import quantize as quantize_fp4
from glassbox.quant.held_experts import ExpertMatrix

pytestmark = pytest.mark.skipif(not (CUDA or INTERPRET), reason="needs CUDA, or TRITON_INTERPRET=1 + triton")
E, TOP_K = 4, 2
FORMATS = ["int4", "int4-asym", "int8", "Q4_K", "Q6_K", "mxfp4", "nvfp4"]


def _matrix(fmt: str, n: int, k: int, rng: np.random.Generator) -> ExpertMatrix:
    if fmt in ("Q4_K", "Q6_K"):
        qtype = Q[fmt]
        return kquant.from_gguf(fmt, random_blocks(qtype, n, k, rng).reshape(n, -1), (n, k))
    w = torch.from_numpy(rng.standard_normal((n, k)).astype(np.float32)) * 0.1
    if fmt in ("mxfp4", "nvfp4"):
        return quantize_fp4(w, fmt)
    return block_quantize.quantize(w, 8 if fmt == "int8" else 4, asymmetric=fmt == "int4-asym")


def _linear(w: ExpertMatrix, bias: torch.Tensor | None) -> Any:
    return FP4Linear(w, bias) if fmt_is_fp4(w) else BlockQuantLinear(w, bias)


def fmt_is_fp4(w: ExpertMatrix) -> bool:
    from glassbox.quant.fp4.weights import FP4Weights

    return isinstance(w, FP4Weights)


def _experts(
    fmt: str, hidden: int, inter: int, bias: bool, seed: int
) -> tuple[list[Any], torch.Tensor, torch.Tensor, Any, Any]:
    """(per expert (gate_up, down) linears, the dequantized (E, 2I, H) and (E, H, I) float64, biases)."""
    rng = np.random.default_rng(seed)
    pairs, w1, w2 = [], [], []
    b1 = torch.randn(E, 2 * inter, dtype=torch.float64) * 0.1 if bias else None
    b2 = torch.randn(E, hidden, dtype=torch.float64) * 0.1 if bias else None
    for e in range(E):
        up, down = _matrix(fmt, 2 * inter, hidden, rng), _matrix(fmt, hidden, inter, rng)
        w1.append(up.dense(torch.float32).double())
        w2.append(down.dense(torch.float32).double())
        pairs.append(
            (
                _linear(up, None if b1 is None else b1[e].float()),
                _linear(down, None if b2 is None else b2[e].float()),
            )
        )
    return pairs, torch.stack(w1), torch.stack(w2), b1, b2


def _reference(x: torch.Tensor, ids: torch.Tensor, weights: torch.Tensor, w1: torch.Tensor, w2: torch.Tensor,
               b1: Any, b2: Any, swiglu: bool) -> torch.Tensor:  # fmt: skip
    xd = x.double()
    out = torch.zeros_like(xd)
    inter = w1.shape[1] // 2
    for t in range(x.shape[0]):
        for j in range(ids.shape[1]):
            e = int(ids[t, j])
            gu = w1[e] @ xd[t] + (0 if b1 is None else b1[e])
            if swiglu:  # interleaved rows, gpt-oss's clamps (alpha 1.702, limit 7)
                g, u = gu[0::2].clamp(max=7.0), gu[1::2].clamp(-7.0, 7.0)
                h = (u + 1) * g * torch.sigmoid(1.702 * g)
            else:
                h = F.silu(gu[:inter]) * gu[inter:]
            out[t] += float(weights[t, j]) * (w2[e] @ h + (0 if b2 is None else b2[e]))
    return out


CASES = [(f, 96, 80, False, "silu") for f in ("int4", "int4-asym", "int8", "mxfp4", "nvfp4")] + [
    ("int4", 608, 48, True, "swiglu"),  # a chunk and 3 blocks (padded: 2 pairs)
    ("Q4_K", 768, 256, False, "silu"),  # a chunk and a super-block
    ("Q6_K", 256, 256, True, "swiglu"),
    ("mxfp4", 576, 64, True, "swiglu"),
]


@pytest.mark.parametrize(
    ("fmt", "hidden", "inter", "bias", "act"), CASES, ids=[f"{c[0]}-{c[1]}-{c[4]}" for c in CASES]
)
def test_block_fused_moe_matches_reference(fmt: str, hidden: int, inter: int, bias: bool, act: str) -> None:
    from glassbox.kernels.triton_block_moe import block_fused_moe
    from glassbox.quant.blocks.moe_stack import StackedExperts, stack_experts

    pairs, w1, w2, b1, b2 = _experts(fmt, hidden, inter, bias, seed=hidden + inter)
    stacked = stack_experts(pairs, DEV)
    assert isinstance(stacked, StackedExperts), stacked
    g = torch.Generator().manual_seed(3)
    for t in (1, 5, 40):
        x = torch.randn(t, hidden, generator=g)
        ids = torch.stack([torch.randperm(E, generator=g)[:TOP_K] for _ in range(t)])
        weights = torch.rand(t, TOP_K, generator=g)
        y = block_fused_moe(
            x.to(DEV), ids.to(DEV), weights.to(DEV), stacked.w1, stacked.w2, E, stacked.b1, stacked.b2,
            act, interleaved=act == "swiglu", alpha=1.702, limit=7.0,
        )  # fmt: skip
        ref = _reference(x, ids, weights, w1, w2, b1, b2, act == "swiglu")
        err = ((y.cpu().double() - ref).norm() / ref.norm()).item()
        assert err < 1e-5, (t, err)


def test_mixed_formats_are_not_stacked() -> None:
    from glassbox.quant.blocks.moe_stack import stack_experts

    pairs, *_ = _experts("int4", 96, 80, False, seed=1)
    other, *_ = _experts("int8", 96, 80, False, seed=2)
    assert stack_experts([pairs[0], other[1]], DEV) == "gate_up: experts of different formats"


# -- the engine on the triton path ----------------------------------------------------------------------------
# per layer of a Qwen3-MoE file: (gate, up, down); an F16 down is not held (that layer's experts stay float)
MIX = [(Q.Q4_K, Q.Q4_K, Q.Q6_K), (Q.Q4_0, Q.Q4_0, Q.Q8_0), (Q.Q8_0, Q.Q8_0, Q.F16)]
PROJ = {"gate_proj": 0, "up_proj": 1, "down_proj": 2}


@pytest.mark.skipif(not INTERPRET, reason="needs TRITON_INTERPRET=1, triton, and no CUDA")
@pytest.mark.timeout(900)
@pytest.mark.parametrize("arch", ["qwen3_moe", "gpt_oss"])
def test_interpreted_engine_gguf_moe(tmp_path: Path, arch: str) -> None:
    """A MoE GGUF file built as CUDA builds it (its experts held where they stack, then stacked by
    use_triton_experts; the other linears in blocks) on the triton path, through decode graphs and chunked
    mixed steps: the greedy tokens of the CPU's float32 path, which dequantizes the file at load. Qwen3-MoE
    with K-quant, Q4_0/Q8_0 and float experts by layer; gpt-oss's MXFP4 experts (gate and up apart: the
    clamped SwiGLU over halves, biases)."""
    from gguf_factory import write_moe_model
    from test_gpu import with_engine
    from test_triton_block_linear import _on_triton, _tokens
    from tiny_models import build_tiny_model

    from glassbox.engine.checkpoint import open_checkpoint
    from glassbox.models.loader import build_model
    from glassbox.models.moe import MoEExperts
    from glassbox.models.moe_triton import use_triton_experts

    path = tmp_path / f"{arch}.gguf"
    if arch == "qwen3_moe":
        d = build_tiny_model("qwen3_moe", tmp_path / "hf", decoder_sparse_step=1, hidden_size=256,
                             moe_intermediate_size=256, intermediate_size=256, num_hidden_layers=3)  # fmt: skip
        write_moe_model(path, d, Q.Q8_0, lambda n: MIX[int(n.split(".")[2])][PROJ[n.split(".")[-2]]])
        stacked = 2
    else:
        from test_gguf_moe import SHAPES

        d = build_tiny_model("gpt_oss", tmp_path / "hf", **SHAPES["gpt_oss"])
        write_moe_model(path, d, Q.Q8_0, Q.MXFP4)
        stacked = 2

    def packed_model(llm: Any) -> Any:
        ex = llm.engine.executor
        weights, kept = open_checkpoint(llm.engine.source).weights(True, ex.device, ex.dtype, cpu=False)
        model = build_model(ex.model_config, weights, ex.dtype, ex.device, kept=kept)
        experts = [m for m in model.modules() if isinstance(m, MoEExperts)]
        assert use_triton_experts(model) == len(experts)
        assert sum(m.blocks is not None for m in experts) == stacked and not any(m.linears for m in experts)
        return model

    kw: dict[str, Any] = dict(dtype="float32", device="cpu", max_num_seqs=4)
    ref = with_engine(path, _tokens, **kw)
    assert with_engine(path, _on_triton(True, packed_model), **kw) == ref
    assert with_engine(path, _on_triton(False, packed_model), **kw, max_num_batched_tokens=24) == ref


@pytest.mark.skipif(not INTERPRET, reason="needs TRITON_INTERPRET=1, triton, and no CUDA")
@pytest.mark.timeout(900)
def test_interpreted_engine_gptq_moe(tmp_path: Path) -> None:
    """A GPTQ Qwen3-MoE checkpoint (zero codes, groups of 32; every expert its own layer) built as CUDA
    builds it (its experts held, then stacked) on the triton path: the greedy tokens of the CPU's float32
    path on the same blocks."""
    from test_gpu import with_engine
    from test_int_experts import moe_checkpoint
    from test_triton_block_linear import _on_triton, _tokens

    from glassbox.engine.checkpoint import open_checkpoint
    from glassbox.models.loader import build_model
    from glassbox.models.moe import MoEExperts
    from glassbox.models.moe_triton import use_triton_experts
    from glassbox.quant.blocks.linear import block_weights

    qdir, _ = moe_checkpoint("gptq", tmp_path)

    def packed_model(llm: Any) -> Any:
        ex = llm.engine.executor
        weights, kept = open_checkpoint(llm.engine.source).weights(True, ex.device, ex.dtype, cpu=False)
        model = build_model(ex.model_config, weights, ex.dtype, ex.device, kept=kept)
        experts = [m for m in model.modules() if isinstance(m, MoEExperts)]
        assert experts and use_triton_experts(model) == len(experts)
        assert all(m.blocks is not None and m.blocks.w1.kind == 2 for m in experts)  # zero codes
        held = {id(w) for m in experts if m.blocks is not None for w in m.blocks.held}
        assert held <= {id(w) for w in block_weights(model)}  # the engine counts the stacked bytes
        return model

    kw: dict[str, Any] = dict(dtype="float32", device="cpu", max_num_seqs=4)
    assert with_engine(qdir, _on_triton(True, packed_model), **kw) == with_engine(qdir, _tokens, **kw)
