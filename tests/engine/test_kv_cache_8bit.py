"""The 8-bit KV cache (--kv-cache-dtype int8|fp8): the C kernels against the PyTorch reference
(layers/kv_quant.py, whose fp8 codes are torch's own float8_e4m3fn conversion), the error against a 16-bit
cache, the engine on both backends, and the cache's size in the engine and the planner."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from tiny_models import build_tiny_model

from glassbox import LLM, SamplingParams
from glassbox.config import EngineConfig
from glassbox.kernels import cpu_ops, native
from glassbox.layers import kv_quant
from glassbox.layers.attention import _decode_attention
from glassbox.layers.rotary import RotaryEmbedding
from glassbox.perf.plan_request import PlanRequest, resolve

pytestmark = pytest.mark.skipif(native.compiler() is None, reason="no C compiler to build the kernels")
KINDS = [torch.int8, torch.float8_e4m3fn]
DTYPES = [torch.float32, torch.bfloat16]


def _heavy_tailed(g: torch.Generator, *shape: int) -> torch.Tensor:
    """Values over many orders of magnitude, so that codes near zero (fp8's subnormals) and at the top occur."""
    return torch.randn(*shape, generator=g) * torch.exp(torch.randn(*shape, generator=g) * 2.5)


def _identity_tables(d: int, dtype: torch.dtype) -> tuple[torch.Tensor, torch.Tensor]:
    """Rotary tables with cos 1 and sin 0: the kernel's rotation leaves k exactly as it was."""
    return torch.ones(4, d, dtype=dtype), torch.zeros(4, d, dtype=dtype)


@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize("dtype", DTYPES)
def test_cache_write_codes_and_scales_equal_the_reference(kind: torch.dtype, dtype: torch.dtype) -> None:
    hq, hk, d, t = 4, 2, 64, 300
    g = torch.Generator().manual_seed(3)
    qkv = _heavy_tailed(g, t, (hq + 2 * hk) * d).to(dtype)
    qkv[0, hq * d : (hq + 1) * d] = 0.0  # an all-zero K row: scale 1, codes 0
    qkv[1, (hq + hk) * d : (hq + hk + 1) * d] = 0.0
    qkv[1, (hq + hk) * d + 5] = -3.0  # a V row with one value: it takes the extreme code
    slots = torch.randperm(t, generator=g)
    cache = torch.zeros(2, t // 4 + 1, 4, hk, d + kv_quant.SCALE_BYTES, dtype=kind)
    ops = cpu_ops.PagedAttention(hq, cache, _identity_tables(d, dtype), None, None, 0.0, 1.0, None)
    ops.rope_store(qkv.clone(), torch.zeros(t, dtype=torch.long), slots)

    k = qkv[:, hq * d : (hq + hk) * d].reshape(t, hk, d)
    v = qkv[:, (hq + hk) * d :].reshape(t, hk, d)
    flat = cache.view(torch.uint8).view(2, -1, hk, d + kv_quant.SCALE_BYTES)
    for half, x in ((0, k), (1, v)):
        ref = kv_quant.quantize(x, kind).view(torch.uint8)
        assert torch.equal(flat[half, slots], ref)  # codes and scales, byte for byte
    codes = flat[:, slots, :, :d]
    assert len(torch.unique(codes)) >= (250 if kind == torch.float8_e4m3fn else 200)  # nearly every code
    back = kv_quant.dequantize(flat[0, slots].view(kind), torch.float32)
    qmax = kv_quant.QMAX[kind]
    err = (back - k.float()).abs().amax(-1) / k.float().abs().amax(-1).clamp_min(1e-30)
    assert (
        float(err.max()) <= (0.5 / qmax if kind == torch.int8 else 1 / 16) * 1.0001
    )  # half a step; fp8 2^-4


@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize(("nd", "hq", "hk"), [(1, 4, 4), (3, 8, 2), (9, 6, 1)])
@pytest.mark.parametrize("window", [None, 21])
@pytest.mark.parametrize("d", [64, 80])
def test_decode_attention_matches_the_reference(
    kind: torch.dtype, dtype: torch.dtype, nd: int, hq: int, hk: int, window: int | None, d: int
) -> None:
    bs, nb = 16, 40
    g = torch.Generator().manual_seed(nd * 100 + hq)
    cache = kv_quant.quantize(torch.randn(2, nb, bs, hk, d, generator=g) * 2, kind)
    lens = torch.tensor([1, 16, 17, 50, 100, 33, 2, 64, 80][:nd])
    max_blocks = int(lens.max() + bs - 1) // bs
    tables = torch.stack([torch.randperm(nb, generator=g)[:max_blocks] for _ in range(nd)])
    qkv = torch.randn(nd, (hq + 2 * hk) * d, generator=g).to(dtype)
    q = qkv[:, : hq * d].reshape(nd, hq, d)
    scale = d**-0.5
    ref = _decode_attention(q.float(), cache, tables, lens, scale, window)
    out = torch.empty(nd, hq * d, dtype=dtype)
    rot = RotaryEmbedding(d, 8, {"rope_theta": 1e4, "rope_type": "default"})
    cpu_ops.PagedAttention(hq, cache, rot.tables(dtype), None, None, 0.0, scale, window).decode(
        qkv, tables, lens, out
    )
    tol = 2e-2 if dtype == torch.bfloat16 else 2e-5
    torch.testing.assert_close(out.float().reshape(nd, hq, d), ref, rtol=tol, atol=tol)


@pytest.mark.parametrize(("kind", "bound"), [(torch.int8, 0.01), (torch.float8_e4m3fn, 0.04)])
def test_attention_error_against_a_16_bit_cache_is_bounded(kind: torch.dtype, bound: float) -> None:
    """The same keys and values (unit variance) cached in float32, bf16 and 8 bits: the 8-bit decode
    attention's RMS error stays under ``bound`` (measured: int8 0.0066, fp8 0.028; a bf16 cache 0.0017)."""
    nd, hq, hk, d, bs, nb = 4, 8, 2, 64, 16, 64
    g = torch.Generator().manual_seed(11)
    full = torch.randn(2, nb, bs, hk, d, generator=g)
    full[0] *= 3  # keys with spread, so that the softmax is peaked as in a trained model
    lens = torch.tensor([200, 513, 37, 1000])
    tables = torch.stack([torch.randperm(nb, generator=g)[: (1000 + bs - 1) // bs] for _ in range(nd)])
    q = torch.randn(nd, hq, d, generator=g)

    def rms_error(cache: torch.Tensor) -> float:
        ref = _decode_attention(q, full, tables, lens, d**-0.5, None)
        return float((_decode_attention(q, cache, tables, lens, d**-0.5, None) - ref).pow(2).mean().sqrt())

    err = rms_error(kv_quant.quantize(full, kind))
    assert rms_error(full.bfloat16().float()) < err < bound


@pytest.fixture(scope="module")
def qwen3(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return build_tiny_model("qwen3", tmp_path_factory.mktemp("kv8"))


PROMPTS = [
    [5, 17, 42, 7, 99, 3],
    [8, 9, 10, 11, 12, 13, 14, 15, 16, 17, 18, 19, 20] * 3,
    [200 + i for i in range(40)],
]


def _run(model: Path, dtype: str, kv: str, **kw: object) -> list[tuple[list[int], list[float]]]:
    llm = LLM(str(model), dtype=dtype, kv_cache_dtype=kv, max_num_seqs=4, **kw)  # type: ignore[arg-type]
    sp = SamplingParams(temperature=0, max_tokens=10, ignore_eos=True, logprobs=0)
    outs = llm.generate(PROMPTS, sp)
    return [(o.token_ids, [lp[t] for lp, t in zip(o.logprobs or [], o.token_ids, strict=True)]) for o in outs]


@pytest.mark.parametrize("kv", ["int8", "fp8"])
@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
def test_engine_kernels_equal_the_torch_backend_and_stay_near_a_16_bit_cache(
    qwen3: Path, kv: str, dtype: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    native_out = _run(qwen3, dtype, kv)
    full = _run(qwen3, dtype, "auto")
    monkeypatch.setenv("GLASSBOX_CPU_KERNELS", "torch")
    torch_out = _run(qwen3, dtype, kv)
    for (nt, nl), (tt, tl), (ft, fl) in zip(native_out, torch_out, full, strict=True):
        assert nt[0] == tt[0] == ft[0]
        assert abs(nl[0] - fl[0]) < 0.1  # the 16-bit cache's first-token logprob, within the codes' error
        if dtype == "float32":  # the same arithmetic but for the order of sums (which can move a value
            # across a code's rounding edge: one step of that code): the same tokens, logprobs near
            assert nt == tt
            torch.testing.assert_close(torch.tensor(nl), torch.tensor(tl), rtol=0, atol=2e-3)
        else:  # bf16 rounds differently on the two paths; this tiny model has near ties after a few tokens
            assert abs(nl[0] - tl[0]) < 0.15


@pytest.mark.parametrize("kv", ["int8", "fp8"])
def test_a_prompt_reads_the_same_cache_however_it_was_chunked_or_cached(qwen3: Path, kv: str) -> None:
    """The prefill reads its own keys back from the 8-bit cache, so a prompt's answer does not depend on
    chunking or on a prefix-cache hit."""
    whole = _run(qwen3, "float32", kv, enable_prefix_caching=False)
    chunked = _run(qwen3, "float32", kv, enable_prefix_caching=False, max_num_batched_tokens=16)
    llm = LLM(str(qwen3), dtype="float32", kv_cache_dtype=kv, max_num_seqs=4)
    sp = SamplingParams(temperature=0, max_tokens=10, ignore_eos=True)
    llm.generate(PROMPTS, sp)
    cached = llm.generate(PROMPTS, sp)
    assert llm.engine.block_manager.stats.hits > 0
    assert [o.token_ids for o in cached] == [t for t, _ in whole] == [t for t, _ in chunked]


@pytest.mark.parametrize("kv", ["int8", "fp8"])
def test_a_fixed_budget_holds_twice_the_blocks_and_the_planner_agrees(qwen3: Path, kv: str) -> None:
    budget = 0.01  # GiB
    full = LLM(str(qwen3), dtype="bfloat16", kv_cache_memory_gib=budget).engine.executor
    eight = LLM(str(qwen3), dtype="bfloat16", kv_cache_memory_gib=budget, kv_cache_dtype=kv).engine.executor
    d = full.model_config.head_dim
    assert eight.kv_caches[0].shape[-1] == d + 4 and eight.kv_caches[0].dtype in kv_quant.KV8_DTYPES
    per_token = eight.kv_plan.bytes_per_block / eight.block_size
    assert per_token == full.kv_plan.bytes_per_block / full.block_size * (d + 4) / (2 * d)
    assert eight.num_kv_blocks == int(budget * (1 << 30) // eight.kv_plan.bytes_per_block)
    # 2 d / (d + 4) times the blocks (both rounded down): 1.78x at this model's d = 32, 1.94x at 128
    assert abs(eight.num_kv_blocks / full.num_kv_blocks - 2 * d / (d + 4)) < 2 / full.num_kv_blocks
    actual = eight.kv_caches[0].numel() * len(eight.kv_caches) / eight.num_kv_blocks  # bytes per block held
    assert actual == eight.kv_plan.bytes_per_block
    setup = resolve(PlanRequest(str(qwen3), "h100-sxm", "native", "glassbox-cpu", kv_cache_dtype=kv))
    assert setup.facts.kv_bytes_per_token(setup.kv_bytes) == per_token


def test_an_unknown_cache_dtype_names_the_flag() -> None:
    with pytest.raises(ValueError, match="--kv-cache-dtype must be one of .*fp8, int8, got 'fp4'"):
        EngineConfig(kv_cache_dtype="fp4")


def test_trace_names_the_cache_and_counts_its_bytes(qwen3: Path) -> None:
    from glassbox.trace import run_trace

    engine = LLM(str(qwen3), dtype="bfloat16", kv_cache_dtype="int8").engine
    r = run_trace(engine, "def add(a, b): return a + b", 20, None)
    kv = r["kv_cache"]
    assert kv["dtype"] == "int8"
    assert kv["bytes"] == kv["blocks"] * engine.executor.kv_plan.bytes_per_block
    d = engine.executor.model_config.head_dim
    per_token = engine.facts.kv_bytes_per_token(1 + 4 / d)  # a byte per element, 4 per head row
    assert engine.executor.kv_plan.bytes_per_block == round(per_token * kv["block_size"])
