"""CUDA path: triton kernels vs the torch SDPA reference, greedy parity with transformers on the GPU,
CUDA graphs vs eager, and the memory budget. Skipped without CUDA (CI has no GPU).

Without a GPU, ``TRITON_INTERPRET=1 pytest tests/engine/test_gpu.py`` (triton installed) runs the kernels and
the engine's triton path on the CPU under triton's interpreter (float32/float16: its bf16 dot is wrong),
with CUDA graph capture replaced by eager replays of the same static buffers.
"""

from __future__ import annotations

import gc
import importlib.util
import os
import random
from collections.abc import Callable
from pathlib import Path
from typing import Any, TypeVar

import pytest
import torch
from tiny_models import ARCHS, MOE_ARCHS, build_tiny_model, greedy_continuation, hf_greedy

from glassbox import LLM, SamplingParams
from glassbox.layers import kv_quant
from glassbox.layers.attention import (
    AttentionMetadata,
    PrefillSeq,
    build_paged_prefill,
    paged_attention,
    write_kv,
)

CUDA = torch.cuda.is_available()
INTERPRET = (
    not CUDA and os.environ.get("TRITON_INTERPRET") == "1" and importlib.util.find_spec("triton") is not None
)
needs_cuda = pytest.mark.skipif(not CUDA, reason="needs a CUDA device")
needs_triton = pytest.mark.skipif(
    not (CUDA or INTERPRET), reason="needs CUDA, or TRITON_INTERPRET=1 + triton"
)
DEV = "cuda" if CUDA else "cpu"
MAX_NEW = 12
T = TypeVar("T")


def _free_device_memory() -> None:
    gc.collect()
    if CUDA:
        torch.compiler.reset()  # compiled code of a freed model's modules
        torch.cuda.synchronize()
        torch.cuda.empty_cache()


def with_engine(model_dir: Path, use: Callable[[LLM], T], **kw: Any) -> T:
    """Build an engine, hand it to ``use``, free it, and return what ``use`` returned.

    The only way the tests below get an engine: each sizes its KV cache from the device memory left (0.9 of
    it by default), so a second one built while the first lives finds none, and one left alive starves the
    next test. The engine never outlives the call; its memory must be back when it returns."""
    _free_device_memory()
    before = torch.cuda.memory_allocated() if CUDA else 0
    llm = LLM(str(model_dir), **kw)
    try:
        result = use(llm)
    finally:
        del llm
        _free_device_memory()
    if CUDA:
        left = torch.cuda.memory_allocated() - before
        assert left < 64 << 20, f"a freed engine left {left / 2**20:.0f} MiB allocated"
    return result


def _batch(
    hq: int,
    hk: int,
    d: int,
    bs: int,
    dec: list[int],
    pre: list[tuple[int, int]],
    dtype: torch.dtype,
    seed: int,
    kv_dtype: torch.dtype | None = None,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor, AttentionMetadata, list[list[int]]]:
    """A random paged cache and a batch: decodes with context ``dec``, prefills (start, q_len) ``pre``;
    the cache in ``dtype``, or in 8-bit rows of ``kv_dtype`` (int8, float8_e4m3fn)."""
    g = torch.Generator(device=DEV).manual_seed(seed)
    rnd = random.Random(seed)
    need = sum(-(-n // bs) for n in dec) + sum(-(-(s + n) // bs) for s, n in pre)
    free = list(range(need + 8))
    rnd.shuffle(free)

    def table(n: int) -> list[int]:
        return [free.pop() for _ in range(-(-n // bs))]

    cache = torch.randn(2, need + 8, bs, hk, d, generator=g, device=DEV).to(dtype)
    if kv_dtype is not None:
        cache = kv_quant.quantize(cache, kv_dtype)
    rows = len(dec) + sum(n for _, n in pre)
    q, k, v = (torch.randn(rows, h, d, generator=g, device=DEV).to(dtype) for h in (hq, hk, hk))
    dtabs, ptabs = [table(n) for n in dec], [table(s + n) for s, n in pre]
    slots = [t[(n - 1) // bs] * bs + (n - 1) % bs for n, t in zip(dec, dtabs, strict=True)]
    for (s, n), t in zip(pre, ptabs, strict=True):
        slots += [t[p // bs] * bs + p % bs for p in range(s, s + n)]
    meta = AttentionMetadata(slot_mapping=torch.tensor(slots, device=DEV), num_decode=len(dec))
    if dec:
        w = max(map(len, dtabs))
        meta.decode_block_tables = torch.tensor([t + [0] * (w - len(t)) for t in dtabs], device=DEV)
        meta.decode_context_lens = torch.tensor(dec, device=DEV)
    row = len(dec)
    for (s, n), t in zip(pre, ptabs, strict=True):
        meta.prefills.append(PrefillSeq(row, n, s, torch.tensor(t, device=DEV)))
        row += n
    write_kv(cache, k, v, meta.slot_mapping)
    return q, k, v, cache, meta, ptabs


CASES = [  # (hq, hk, d, block_size, decode contexts, prefills (start, n), sliding window)
    (32, 8, 128, 16, [1, 17, 300, 2049], [], None),
    (16, 8, 128, 16, [5, 1000], [(0, 300), (64, 77), (200, 1)], None),
    (4, 2, 16, 16, [40, 129], [(0, 37), (20, 50)], 48),
    (8, 8, 64, 32, [3000], [(1000, 513)], 256),
    (12, 4, 96, 8, [77], [(0, 130)], None),
]


LOW = torch.bfloat16 if CUDA else torch.float16  # the interpreter's bf16 dot is broken


def _check_triton_attention(
    case: tuple[Any, ...],
    dtype: torch.dtype,
    seed: int,
    kv_dtype: torch.dtype | None = None,
    sinks: torch.Tensor | None = None,
) -> None:
    """The triton backend (decode and prefill rows of one batch, then decode alone at 1, 2 and 16 context
    splits) against the torch reference on the same cache: relative error 1e-5 in float32, 1e-2 else;
    with ``sinks`` (Hq,), the attention sinks on both."""
    from glassbox.kernels import triton_attention as ta

    hq, hk, d, bs, dec, pre, window = case
    q, k, v, cache, meta, ptabs = _batch(hq, hk, d, bs, dec, pre, dtype, seed, kv_dtype)
    if sinks is not None:
        sinks = sinks.to(DEV, dtype)
    ref = paged_attention(q.double().float(), k, v, cache, meta, d**-0.5, window, sinks).float()
    tri = AttentionMetadata(
        slot_mapping=meta.slot_mapping,
        num_decode=meta.num_decode,
        decode_block_tables=meta.decode_block_tables,
        decode_context_lens=meta.decode_context_lens,
        backend="triton",
    )
    if pre:
        tri.paged_prefill = build_paged_prefill(
            [(s, n, t) for (s, n), t in zip(pre, ptabs, strict=True)],
            ta.prefill_block_m(d, cache.dtype, q.dtype, q.device),
            q.device,
        )
    out = paged_attention(q, k, v, cache, tri, d**-0.5, window, sinks)
    assert out.dtype == q.dtype
    out = out.float()
    assert torch.isfinite(out).all()
    tol = 1e-5 if dtype == torch.float32 else 1e-2
    err = ((out - ref).norm() / ref.norm()).item()
    assert err < tol, err
    for splits in (1, 2, 16):  # every split count gives the same decode rows
        if not dec:
            continue
        o = torch.full_like(q[: len(dec)], float("nan"))
        ta.decode_attention(
            q[: len(dec)], cache[0], cache[1], meta.decode_block_tables, meta.decode_context_lens,
            d**-0.5, window, o, num_splits=splits, sinks=sinks,
        )  # fmt: skip
        err = ((o.float() - ref[: len(dec)]).norm() / ref[: len(dec)].norm()).item()
        assert err < tol, (splits, err)


@needs_triton
@pytest.mark.parametrize("dtype", [torch.float32, LOW])
@pytest.mark.parametrize("case", range(len(CASES)))
def test_triton_attention_matches_reference(case: int, dtype: torch.dtype) -> None:
    _check_triton_attention(CASES[case], dtype, seed=case)


KV8_CASES = [  # small (the interpreter is slow): GQA, several blocks, cached prefixes, a window
    (4, 2, 16, 16, [40, 129], [(0, 37), (20, 50)], 48),
    (8, 2, 32, 8, [1, 70], [(33, 20), (0, 45)], None),
]


@needs_triton
@pytest.mark.parametrize("kv_dtype", kv_quant.KV8_DTYPES, ids=["int8", "fp8"])
@pytest.mark.parametrize("dtype", [torch.float32, LOW])
@pytest.mark.parametrize("case", range(len(KV8_CASES)))
def test_triton_attention_reads_8bit_cache(case: int, dtype: torch.dtype, kv_dtype: torch.dtype) -> None:
    """The kernels read the codes and scales of an 8-bit cache as the torch reference dequantizes them."""
    _check_triton_attention(KV8_CASES[case], dtype, seed=10 + case, kv_dtype=kv_dtype)


def _sinks(hq: int, seed: int) -> torch.Tensor:
    """Sink logits around the scores' range, one far above every score (the sink takes nearly all the
    weight: the rows' outputs go to ~0) and one far below (no weight)."""
    s = torch.randn(hq, generator=torch.Generator().manual_seed(seed)) * 2
    s[0], s[-1] = 30.0, -30.0
    return s


@needs_triton
@pytest.mark.parametrize("dtype", [torch.float32, LOW])
@pytest.mark.parametrize("case", [2, 4])  # GQA with a window and cached prefixes; GQA 3, 96-dim heads
def test_triton_attention_with_sinks(case: int, dtype: torch.dtype) -> None:
    """Attention sinks (gpt-oss) in the decode kernel (split 1, 2, 16 ways: the sink counted once) and the
    prefill kernel, against the torch reference's extra score column."""
    _check_triton_attention(CASES[case], dtype, seed=20 + case, sinks=_sinks(CASES[case][0], case))


@needs_triton
@pytest.mark.parametrize("kv_dtype", kv_quant.KV8_DTYPES, ids=["int8", "fp8"])
def test_triton_attention_with_sinks_reads_8bit_cache(kv_dtype: torch.dtype) -> None:
    _check_triton_attention(KV8_CASES[1], LOW, seed=30, kv_dtype=kv_dtype, sinks=_sinks(KV8_CASES[1][0], 3))


@needs_triton
def test_padded_decode_rows_are_zero() -> None:
    from glassbox.kernels import triton_attention as ta

    q, _, _, cache, meta, _ = _batch(8, 2, 64, 16, [50, 7, 3], [], LOW, seed=9)
    assert meta.decode_context_lens is not None and meta.decode_block_tables is not None
    lens = meta.decode_context_lens.clone()
    lens[1] = 0
    for splits in (1, 4):
        out = torch.full_like(q, float("nan"))
        ta.decode_attention(q, cache[0], cache[1], meta.decode_block_tables, lens, 0.125, None, out, splits)
        assert torch.isfinite(out).all() and out[1].abs().max() == 0


# -- the engine against transformers on the GPU ---------------------------------------------------------
def _hf_model_gpu(model_dir: Path, dtype: torch.dtype) -> Any:
    import transformers as tf

    return tf.AutoModelForCausalLM.from_pretrained(model_dir, dtype=dtype).cuda().eval()


def _mismatch(model: Any, prompts: list[list[int]], ref: list[list[int]], got: list[list[int]]) -> str:
    """Where ``got`` first leaves transformers' greedy tokens ``ref``, and by how much transformers' own
    top two logits differ there: a gap near float32 rounding (~1e-5) is a near-tie, a large one a bug."""
    for i, (r, g) in enumerate(zip(ref, got, strict=True)):
        if r != g:
            j = next((j for j, (a, b) in enumerate(zip(r, g, strict=False)) if a != b), min(len(r), len(g)))
            ids = torch.tensor([prompts[i] + r[:j]], device=DEV)
            with torch.inference_mode():
                logits = model(ids).logits[0, -1].float()
            top = logits.topk(2).values
            ours = logits[g[j]].item() if j < len(g) else float("nan")
            return (
                f"prompt {i} ({len(prompts[i])} tokens), token {j}: transformers {r[j:]} vs {g[j:]}; "
                f"its top-2 logit gap {(top[0] - top[1]).item():.3g}, ours' token {top[0].item() - ours:.3g} below"
            )
    return "no difference"


def _prompts(vocab: int, seed: int = 0) -> list[list[int]]:
    rnd = random.Random(seed)
    return [[rnd.randrange(3, vocab) for _ in range(n)] for n in (1, 15, 16, 17, 64, 129, 300, 5)]


@pytest.fixture(scope="module")
def tiny_root(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("gpu-models")


@needs_cuda
@pytest.mark.parametrize("arch", ARCHS + MOE_ARCHS + ("gpt_oss",))  # MoE: the fused triton experts
def test_gpu_float32_greedy_parity(tiny_root: Path, arch: str) -> None:
    d = build_tiny_model(arch, tiny_root)
    import json

    vocab = json.loads((d / "config.json").read_text())["vocab_size"]
    prompts = _prompts(vocab)
    model = _hf_model_gpu(d, torch.float32)
    ref = [greedy_continuation(model, p, MAX_NEW)[0] for p in prompts]  # past any EOS, as ours
    sp = SamplingParams(temperature=0, max_tokens=MAX_NEW, ignore_eos=True)

    def rounds(llm: LLM) -> list[list[list[int]]]:
        got = [[o.token_ids for o in llm.generate(prompts, sp)] for _ in range(2)]  # 2nd: prefix cache
        llm.engine.check_integrity()
        return got

    for kw in (
        dict(max_num_seqs=3),  # graphs for decode-only steps
        dict(max_num_seqs=5, max_num_batched_tokens=37, enforce_eager=True),  # chunked, mixed steps
        dict(max_num_seqs=4, num_kv_blocks=24),  # preemption
    ):
        got = with_engine(d, rounds, dtype="float32", device=DEV, **kw)
        for n, tokens in enumerate(got):
            assert tokens == ref, f"{arch} {kw} round {n + 1}: {_mismatch(model, prompts, ref, tokens)}"


@needs_cuda
def test_gpu_bf16_logprobs_within_tolerance(tiny_root: Path) -> None:
    """bf16 greedy: each chosen token is (near-)argmax under the float32 model, logprobs agree."""
    import transformers as tf

    d = build_tiny_model("qwen3", tiny_root)
    prompts = _prompts(400, seed=1)
    sp = SamplingParams(temperature=0, max_tokens=MAX_NEW, ignore_eos=True, logprobs=0)
    outs = with_engine(d, lambda llm: llm.generate(prompts, sp), dtype="bfloat16", device=DEV, max_num_seqs=4)
    model = tf.AutoModelForCausalLM.from_pretrained(d, dtype=torch.float32).cuda().eval()
    for p, o in zip(prompts, outs, strict=True):
        ids = torch.tensor([p + o.token_ids], device=DEV)
        with torch.inference_mode():
            lp = torch.log_softmax(model(ids).logits[0].float(), -1)[len(p) - 1 : -1]  # (MAX_NEW, V)
        assert o.logprobs is not None
        for j, t in enumerate(o.token_ids):
            assert lp[j, t] >= lp[j].max() - 0.1
            assert abs(o.logprobs[j][t] - lp[j, t].item()) < 0.1


@needs_cuda
@pytest.mark.parametrize("kv", ["auto", "int8", "fp8"])
def test_graphs_and_eager_agree_bf16(tiny_root: Path, kv: str) -> None:
    d = build_tiny_model("llama", tiny_root)
    prompts = _prompts(400, seed=2)
    sp = SamplingParams(temperature=0, max_tokens=MAX_NEW, ignore_eos=True)

    def tokens(graphs: bool) -> Callable[[LLM], list[list[int]]]:
        def use(llm: LLM) -> list[list[int]]:
            assert (llm.engine.executor.graphs is not None) == graphs
            return [o.token_ids for o in llm.generate(prompts, sp)]

        return use

    eager = with_engine(d, tokens(False), dtype="bfloat16", device=DEV, enforce_eager=True, kv_cache_dtype=kv)
    graphs = with_engine(d, tokens(True), dtype="bfloat16", device=DEV, kv_cache_dtype=kv)
    assert eager == graphs


@needs_cuda
@pytest.mark.parametrize(  # an 8-bit cache: the quantizing write too; MoE: the fused experts
    "arch,kv", [("llama", "auto"), ("llama", "int8"), ("qwen3_moe", "auto"), ("gpt_oss", "auto")]
)
def test_eager_launches_never_synchronize(tiny_root: Path, arch: str, kv: str) -> None:
    """An eager step's launch (inputs, metadata, forward, sampling) queues device work without waiting for
    the stream: every host value goes through pinned non-blocking copies. Mixed steps (a chunked prefill
    beside decodes), top-k/top-p, a seeded request, logprobs; only reading the draws may synchronize."""
    d = build_tiny_model(arch, tiny_root)

    def use(llm: LLM) -> None:
        eng = llm.engine
        launch = eng.executor.launch

        def checked(batch: Any) -> Any:
            torch.cuda.set_sync_debug_mode("error")
            try:
                return launch(batch)
            finally:
                torch.cuda.set_sync_debug_mode("default")

        eng.executor.launch = checked  # type: ignore[method-assign]
        kinds = [
            SamplingParams(temperature=0.8, top_k=20, top_p=0.9, max_tokens=8, ignore_eos=True),
            SamplingParams(temperature=1.0, seed=3, max_tokens=8, ignore_eos=True, logprobs=2),
            SamplingParams(temperature=0, max_tokens=8, ignore_eos=True),
        ]
        for i, p in enumerate(_prompts(400)):
            eng.add_request(f"r{i}", p, kinds[i % 3])
        while eng.has_work:
            eng.step()
        assert any(r.phase == "mixed" for r in eng.step_records)

    with_engine(
        d, use, dtype="bfloat16", device=DEV, enforce_eager=True, max_num_seqs=4, max_num_batched_tokens=64,
        kv_cache_dtype=kv,
    )  # fmt: skip


@needs_cuda
def test_memory_budget_respects_utilization(tiny_root: Path) -> None:
    """KV cache = total x utilization - what is allocated - the profiled peak: reserved stays under it."""
    d = build_tiny_model("llama", tiny_root)
    total = torch.cuda.get_device_properties(0).total_memory
    util = 0.3

    def use(llm: LLM) -> None:
        llm.generate(_prompts(400), SamplingParams(temperature=0, max_tokens=4, ignore_eos=True))
        assert llm.engine.executor.kv_plan.gib > 1.0, "the KV cache should take most of the budget"
        assert torch.cuda.memory_reserved() <= util * total + (128 << 20)

    with_engine(d, use, dtype="bfloat16", device=DEV, memory_utilization=util, max_model_len=1024)


# -- without a GPU: the engine's triton path under the interpreter -------------------------------------
class _EagerReplay:
    """Stands in for a captured CUDA graph: re-runs the forward on the same static buffers."""

    def __init__(self, graphs: Any, size: int) -> None:
        self.graphs, self.size = graphs, size

    def replay(self) -> None:
        self.graphs.outputs[self.size].copy_(self.graphs._forward(self.size))


def _use_triton(llm: LLM, graphs: bool) -> None:
    from glassbox.engine.cuda_graph import DecodeGraphs
    from glassbox.models.moe_triton import use_triton_experts

    ex = llm.engine.executor
    ex.attn_backend = "triton"
    ex.forward = ex.model  # as on CUDA: the model's own forward, not one bound to the CPU kernels' caches
    use_triton_experts(ex.model)  # as on CUDA: routed experts on the fused triton MoE
    if not graphs:
        return
    ex.kv_caches = [torch.cat([c, torch.zeros_like(c[:, :1])], dim=1) for c in ex.kv_caches]  # + scratch
    width = -(-llm.engine.max_model_len // ex.block_size)
    g = DecodeGraphs(
        ex.model, ex.kv_caches, ex.config.max_num_seqs, width, ex.num_kv_blocks * ex.block_size, ex.device
    )
    with torch.inference_mode():
        for size in g.sizes:
            g.outputs[size] = g._forward(size)
            g.graphs[size] = _EagerReplay(g, size)  # type: ignore[assignment]
    ex.graphs = g


@pytest.mark.skipif(not INTERPRET, reason="needs TRITON_INTERPRET=1, triton, and no CUDA")
@pytest.mark.timeout(900)  # the interpreter: 2-6 minutes an architecture on 2 busy cores
@pytest.mark.parametrize("arch", ["llama", "qwen3", "mistral", "gemma3", "qwen2_moe", "qwen3_moe", "gpt_oss"])
def test_interpreted_triton_engine_parity(tiny_root: Path, arch: str) -> None:
    d = build_tiny_model(arch, tiny_root)
    import json

    vocab = json.loads((d / "config.json").read_text())["vocab_size"]
    prompts = _prompts(vocab)
    ref = [toks for toks, _ in hf_greedy(d, prompts, MAX_NEW)]
    sp = SamplingParams(temperature=0, max_tokens=MAX_NEW, ignore_eos=True)

    def rounds(graphs: bool) -> Callable[[LLM], list[list[list[int]]]]:
        def use(llm: LLM) -> list[list[list[int]]]:
            _use_triton(llm, graphs)
            got = [[o.token_ids for o in llm.generate(prompts, sp)] for _ in range(2)]  # 2nd: prefix cache
            llm.engine.check_integrity()
            return got

        return use

    for kw, graphs in (
        (dict(max_num_seqs=5), True),  # decode steps on the graph runner, padded 3 -> 4 rows
        (dict(max_num_seqs=5, async_output=True), True),  # ... with CUDA's default async output
        (dict(max_num_seqs=5, max_num_batched_tokens=37), False),  # chunks with context, mixed steps
    ):
        got = with_engine(d, rounds(graphs), dtype="float32", device="cpu", **kw)
        assert got == [ref, ref], (arch, kw)


def _use_torch(llm: LLM) -> None:
    """The torch reference attention on the model's own forward (not the CPU kernels' binding)."""
    ex = llm.engine.executor
    ex.attn_backend = "torch"
    ex.forward = ex.model


@pytest.mark.skipif(not INTERPRET, reason="needs TRITON_INTERPRET=1, triton, and no CUDA")
@pytest.mark.parametrize("kv", ["int8", "fp8"])
def test_interpreted_triton_engine_reads_8bit_cache(tiny_root: Path, kv: str) -> None:
    """--kv-cache-dtype int8|fp8 on the triton path (graph runner, chunked mixed steps, prefix cache):
    greedy tokens equal to the torch reference's on the same 8-bit cache."""
    d = build_tiny_model("qwen3", tiny_root)  # GQA, 32-dim heads, q/k norms
    prompts = _prompts(400, seed=3)

    def tokens(llm: LLM) -> list[list[int]]:
        return [o.token_ids for o in llm.generate(prompts, sp)]

    def on_triton(graphs: bool) -> Callable[[LLM], list[list[list[int]]]]:
        def use(llm: LLM) -> list[list[list[int]]]:
            _use_triton(llm, graphs)
            got = [tokens(llm) for _ in range(2)]  # 2nd: prefix cache
            llm.engine.check_integrity()
            return got

        return use

    sp = SamplingParams(temperature=0, max_tokens=MAX_NEW, ignore_eos=True)
    kw: dict[str, Any] = dict(dtype="float32", device="cpu", kv_cache_dtype=kv, max_num_seqs=5)
    ref = with_engine(d, lambda llm: (_use_torch(llm), tokens(llm))[1], **kw)
    assert with_engine(d, on_triton(True), **kw) == [ref, ref]
    assert with_engine(d, on_triton(False), **kw, max_num_batched_tokens=37) == [ref, ref]


@needs_triton
@pytest.mark.parametrize("graphs", [True, False])
def test_speculative_decoding_on_the_triton_path(tiny_root: Path, graphs: bool) -> None:
    """Speculative decoding (n-gram drafts) on the triton kernels: a token and its drafts run as decode rows,
    on the graph runner when the step has no prompt rows, else eagerly beside prefill chunks; greedy tokens
    equal to transformers'."""
    d = build_tiny_model("llama", tiny_root)
    rnd = random.Random(5)
    prompts = [
        [rnd.randrange(3, 400) for _ in range(12)] * 4,
        [7, 8, 9, 10] * 10,
        [rnd.randrange(3, 400) for _ in range(40)],
    ]
    ref = [toks for toks, _ in hf_greedy(d, prompts, 24)]
    sp = SamplingParams(temperature=0, max_tokens=24, ignore_eos=True)
    spec = {"method": "ngram", "num_speculative_tokens": 4, "prompt_lookup_min": 1, "prompt_lookup_max": 3}

    drafts_on_graphs: list[int] = []  # drafts in each step the graph runner ran

    def use(llm: LLM) -> tuple[list[list[int]], int]:
        ex = llm.engine.executor
        if INTERPRET:
            _use_triton(llm, graphs)
        run_graph = ex._execute_graph

        def spy(decodes: list[Any]) -> Any:
            drafts_on_graphs.append(sum(len(s.draft_tokens) for s in decodes))
            return run_graph(decodes)

        ex._execute_graph = spy  # type: ignore[method-assign]
        got = [o.token_ids for o in llm.generate(prompts, sp)]
        llm.engine.check_integrity()
        return got, llm.engine.counters.spec_accepted_tokens

    kw: dict[str, Any] = dict(dtype="float32", device=DEV, max_num_seqs=16, speculative_config=spec)
    if not graphs:
        kw.update(max_num_batched_tokens=37, enforce_eager=True)
    got, accepted = with_engine(d, use, **kw)
    assert got == ref
    assert accepted > 0
    assert (max(drafts_on_graphs, default=0) > 0) == graphs


@needs_triton
def test_prompt_logprobs_on_the_triton_path(tiny_root: Path) -> None:
    """Prompt logprobs on the triton kernels (chunked prefill beside decode steps on the graph runner, and a
    second identical request the prefix cache would serve): transformers' log_softmax of the prompt's logits."""
    from transformers import AutoModelForCausalLM

    d = build_tiny_model("llama", tiny_root)
    rnd = random.Random(7)
    prompts = [[rnd.randrange(3, 400) for _ in range(n)] for n in (41, 23)]
    ref_model = AutoModelForCausalLM.from_pretrained(d, dtype=torch.float32).eval()
    with torch.no_grad():
        refs = [ref_model(torch.tensor([p])).logits[0].log_softmax(dim=-1) for p in prompts]
    sp = SamplingParams(temperature=0, max_tokens=6, ignore_eos=True, prompt_logprobs=2)

    def use(llm: LLM) -> list[Any]:
        if INTERPRET:
            _use_triton(llm, graphs=True)
        outs = [llm.generate(prompts, sp) for _ in range(2)]
        llm.engine.check_integrity()
        return [o for round_ in outs for o in round_]

    kw: dict[str, Any] = dict(
        dtype="float32", device=DEV, max_num_seqs=4, max_num_batched_tokens=16, block_size=8
    )
    outs = with_engine(d, use, **kw)
    for out, prompt, ref in zip(outs, prompts * 2, refs * 2, strict=True):
        assert out.prompt_logprobs[0] is None and len(out.prompt_logprobs) == len(prompt)
        for i in range(1, len(prompt)):
            row, entry = ref[i - 1], out.prompt_logprobs[i]
            assert set(row.topk(2).indices.tolist()) <= set(entry)
            for t, v in entry.items():
                assert v == pytest.approx(row[t].item(), abs=2e-4), (i, t)
