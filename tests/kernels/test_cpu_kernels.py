"""glassbox's C kernels against the PyTorch reference ops they replace, on random inputs."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
import torch.nn.functional as F
from tiny_models import build_tiny_model, hf_greedy

from glassbox import LLM, SamplingParams
from glassbox.kernels import cpu_ops, native
from glassbox.layers.attention import _decode_attention, write_kv
from glassbox.layers.norm import RMSNorm
from glassbox.layers.rotary import RotaryEmbedding

pytestmark = pytest.mark.skipif(native.compiler() is None, reason="no C compiler to build the kernels")
DTYPES = [torch.float32, torch.bfloat16]


def _close(got: torch.Tensor, ref: torch.Tensor, dtype: torch.dtype) -> None:
    """float32: a few ulps; bf16: one rounding step (the kernels' exp and sums differ in the last bits)."""
    tol = 1e-5 if dtype == torch.float32 else 1.6e-2
    torch.testing.assert_close(got.float(), ref.float(), rtol=tol, atol=tol)


def test_library_builds_and_loads() -> None:
    assert native.library() is not None
    assert native.usable(torch.bfloat16, torch.bfloat16) and native.usable(torch.float32, torch.float32)
    assert not native.usable(torch.bfloat16, torch.float32)
    assert not native.usable(torch.float16, torch.float16)


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("rows", [1, 37])
def test_add_rms_norm_matches_residual_add_then_rmsnorm(dtype: torch.dtype, rows: int) -> None:
    g = torch.Generator().manual_seed(rows)
    norm = RMSNorm(1024, eps=1e-6).to(dtype)
    with torch.no_grad():
        norm.weight.copy_(torch.randn(1024, generator=g))
    x = torch.randn(rows, 1024, generator=g).to(dtype) * 3
    res = torch.randn(rows, 1024, generator=g).to(dtype)
    ref_x = x + res
    ref_h = norm(ref_x)
    out = torch.empty_like(x)
    op = cpu_ops.AddRMSNorm(norm.weight.detach(), 1e-6)
    op(x, res, out)
    assert torch.equal(x, ref_x)  # the residual add is exact in both paths
    _close(out, ref_h, dtype)
    op(x, None, out)
    _close(out, ref_h, dtype)
    with pytest.raises(ValueError, match="contiguous"):
        op(torch.zeros(rows, 2048, dtype=dtype)[:, ::2], None, out)  # strided rows of the right width


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("rows", [1, 20])
def test_silu_mul_matches_torch(dtype: torch.dtype, rows: int) -> None:
    g = torch.Generator().manual_seed(rows)
    gate_up = (torch.randn(rows, 2 * 3072, generator=g) * 6).to(dtype)
    gate_up[0, :4] = torch.tensor([-200.0, 200.0, 0.0, -0.0])  # exp's clamp at both ends
    gate, up = gate_up.split(3072, dim=-1)
    _close(cpu_ops.SiluMul(3072, dtype)(gate_up), F.silu(gate) * up, dtype)


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("qk_norm", [True, False])
@pytest.mark.parametrize("partial", [1.0, 0.5])
def test_qkv_rope_store_matches_norm_rotary_and_cache_write(
    dtype: torch.dtype, qk_norm: bool, partial: float
) -> None:
    hq, hk, d, t = 8, 2, 64, 9
    g = torch.Generator().manual_seed(7)
    rot = RotaryEmbedding(
        d, 512, {"rope_theta": 10000.0, "rope_type": "default", "partial_rotary_factor": partial}
    )
    qn, kn = RMSNorm(d).to(dtype), RMSNorm(d).to(dtype)
    with torch.no_grad():
        qn.weight.copy_(torch.randn(d, generator=g))
        kn.weight.copy_(torch.randn(d, generator=g))
    qkv = torch.randn(t, (hq + 2 * hk) * d, generator=g).to(dtype)
    positions = torch.randperm(500, generator=g)[:t]
    slots = torch.randperm(4 * 16, generator=g)[:t]
    q, k, v = qkv.split([hq * d, hk * d, hk * d], dim=-1)
    q, k, v = q.reshape(t, hq, d), k.reshape(t, hk, d), v.reshape(t, hk, d)
    if qk_norm:
        q, k = qn(q), kn(k)
    q, k = rot(q, k, *rot.cos_sin(positions, dtype))
    ref_cache = torch.zeros(2, 4, 16, hk, d, dtype=dtype)
    write_kv(ref_cache, k, v, slots)

    cache = torch.zeros_like(ref_cache)
    got = qkv.clone()
    weights = (qn.weight.detach(), kn.weight.detach()) if qk_norm else (None, None)
    ops = cpu_ops.PagedAttention(hq, cache, rot.tables(dtype), *weights, 1e-6, 1.0, None)
    ops.rope_store(got, positions, slots)
    _close(got[:, : hq * d].reshape(t, hq, d), q, dtype)
    _close(got[:, hq * d : (hq + hk) * d].reshape(t, hk, d), k, dtype)
    assert torch.equal(got[:, (hq + hk) * d :], qkv[:, (hq + hk) * d :])  # v untouched
    _close(cache, ref_cache, dtype)


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize(("nd", "hq", "hk"), [(1, 4, 4), (3, 8, 2), (9, 6, 1)])
@pytest.mark.parametrize("window", [None, 21])
@pytest.mark.parametrize("d", [64, 128, 80])  # 64, 128: bf16 code of their own; 80: the general loops
def test_decode_attention_matches_gathered_reference(
    dtype: torch.dtype, nd: int, hq: int, hk: int, window: int | None, d: int
) -> None:
    bs, nb = 16, 40
    g = torch.Generator().manual_seed(nd * 100 + hq)
    cache = torch.randn(2, nb, bs, hk, d, generator=g).to(dtype)
    lens = torch.tensor([1, 16, 17, 50, 100, 33, 2, 64, 80][:nd])
    max_blocks = int(lens.max() + bs - 1) // bs
    tables = torch.stack(
        [torch.randperm(nb, generator=g)[:max_blocks] for _ in range(nd)]
    )  # scattered blocks
    qkv = torch.randn(nd, (hq + 2 * hk) * d, generator=g).to(dtype)
    q = qkv[:, : hq * d].reshape(nd, hq, d)
    scale = d**-0.5
    ref = _decode_attention(q.float(), cache.float(), tables, lens, scale, window)
    out = torch.empty(nd, hq * d, dtype=dtype)
    ops = cpu_ops.PagedAttention(
        hq,
        cache,
        RotaryEmbedding(d, 8, {"rope_theta": 1e4, "rope_type": "default"}).tables(dtype),
        None,
        None,
        0.0,
        scale,
        window,
    )
    ops.decode(qkv, tables, lens, out)
    torch.testing.assert_close(
        out.float().reshape(nd, hq, d),
        ref,
        rtol=2e-2 if dtype == torch.bfloat16 else 1e-5,
        atol=2e-2 if dtype == torch.bfloat16 else 1e-5,
    )


def test_check_step_rejects_out_of_range_indices() -> None:
    pos, slots = torch.tensor([0, 5]), torch.tensor([3, 4])
    tables, lens = torch.tensor([[0, 1]]), torch.tensor([20])
    cpu_ops.check_step(pos, slots, 10, 64, tables, lens, 4, 16)
    with pytest.raises(ValueError, match="rotary"):
        cpu_ops.check_step(torch.tensor([0, 10]), slots, 10, 64, tables, lens, 4, 16)
    with pytest.raises(ValueError, match="slots"):
        cpu_ops.check_step(pos, torch.tensor([3, 64]), 10, 64, tables, lens, 4, 16)
    with pytest.raises(ValueError, match="block table"):
        cpu_ops.check_step(pos, slots, 10, 64, torch.tensor([[0, 4]]), lens, 4, 16)
    with pytest.raises(ValueError, match="context"):
        cpu_ops.check_step(pos, slots, 10, 64, tables, torch.tensor([33]), 4, 16)
    with pytest.raises(ValueError, match="int64"):
        cpu_ops.check_step(pos.int(), slots, 10, 64, tables, lens, 4, 16)


def test_a_shape_the_kernels_refuse_falls_back_to_pytorch_ops(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    """Rows longer than the kernels' per-thread stack rows (here the limit lowered below the tiny model's
    hidden size) are refused when the engine binds them at start: it says so and runs the PyTorch ops,
    still token-exact with transformers."""
    d = build_tiny_model("qwen3", tmp_path)
    monkeypatch.setattr(cpu_ops, "MAX_ROW", 16)
    prompt = [5, 17, 42, 7, 99, 3]
    ref = hf_greedy(d, [prompt], 6)[0][0]
    llm = LLM(str(d), dtype="float32", max_num_seqs=2)
    assert llm.engine.executor.attn_backend == "torch"
    assert "cannot run this model" in caplog.text
    out = llm.generate([prompt], SamplingParams(temperature=0, max_tokens=6, ignore_eos=True))[0]
    assert out.token_ids == ref
