"""The fused triton MoE (kernels/triton_moe.py) against ``MoEExperts.reference`` (one (token, choice) at a
time with PyTorch ops): odd shapes, routing edges, biases and gpt-oss's clamped SwiGLU, both tile families.

Without a GPU these run under triton's interpreter (``TRITON_INTERPRET=1``, float32/float16: its bf16 dot is
wrong), as tests/engine/test_gpu.py's kernel tests do; skipped otherwise.
"""

from __future__ import annotations

import importlib.util
import os

import pytest
import torch

from glassbox.models.moe import ClampedSwiGLU, MoEExperts, gated, route

CUDA = torch.cuda.is_available()
INTERPRET = (
    not CUDA and os.environ.get("TRITON_INTERPRET") == "1" and importlib.util.find_spec("triton") is not None
)
needs_triton = pytest.mark.skipif(
    not (CUDA or INTERPRET), reason="needs CUDA, or TRITON_INTERPRET=1 + triton"
)
DEV = "cuda" if CUDA else "cpu"
LOW = torch.bfloat16 if CUDA else torch.float16


def _experts(e: int, h: int, i: int, swiglu: bool, bias: bool, seed: int) -> MoEExperts:
    glu = ClampedSwiGLU(1.702, 1.0) if swiglu else gated("silu")
    m = MoEExperts(e, h, i, glu, bias)
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for p in m.parameters():
            p.copy_(torch.randn(p.shape, generator=g) * 0.2)
    return m.to(DEV)


def _check(
    m: MoEExperts,
    x: torch.Tensor,
    ids: torch.Tensor,
    w: torch.Tensor,
    dtype: torch.dtype,
    small: bool | None,
    align_kernel: bool | None = None,
) -> None:
    """The fused kernels in ``dtype`` (decode or prefill tiles where ``small`` says, the alignment's path
    where ``align_kernel`` does) against the float32 reference on the same (rounded) weights; counts the
    experts read. Experts no pair chose hold NaN: a kernel that read one would spread it."""
    from glassbox.kernels import triton_moe as tm
    from glassbox.models.moe_triton import kernel_activation

    m = m.to(dtype).float()  # the reference runs on the dtype's values
    ref = m.reference(x.to(dtype).float(), ids, w.to(dtype).float())
    unused = sorted(set(range(m.num_experts)) - set(ids.flatten().tolist()))
    md = m.to(dtype)
    w1, w2 = md.gate_up_proj.detach().clone(), md.down_proj.detach().clone()
    w1[unused], w2[unused] = float("nan"), float("nan")
    spec = kernel_activation(m)
    assert spec is not None
    tiles = None
    if small is not None:  # one of the two families, whatever the row count
        tiles = tm.moe_tiles(1 if small else 1 << 20, m.num_experts, dtype, (9, 0))
    reads = torch.zeros((), dtype=torch.int64, device=DEV)
    b1, b2 = md.gate_up_proj_bias, md.down_proj_bias
    out = tm.fused_moe(
        x.to(dtype), ids, w.to(dtype), w1, w2, None if b1 is None else b1.detach(),
        None if b2 is None else b2.detach(), *spec, tiles=tiles, reads=reads, align_kernel=align_kernel,
    )  # fmt: skip
    assert out.dtype == dtype and out.shape == x.shape
    out = out.float()
    assert torch.isfinite(out).all()
    tol = 1e-5 if dtype == torch.float32 else 1e-2
    err = ((out - ref).norm() / ref.norm()).item()
    assert err < tol, err
    assert reads.item() == m.num_experts - len(unused)


CASES = [  # (T, E, k, H, I): H and I no multiple of any tile
    (1, 4, 1, 40, 24),
    (3, 8, 2, 72, 40),
    (17, 16, 4, 48, 40),
    (64, 6, 2, 40, 72),
    (17, 5, 4, 24, 20),
]


@needs_triton
@pytest.mark.parametrize("dtype", [torch.float32, LOW])
@pytest.mark.parametrize("case", range(len(CASES)))
def test_fused_moe_matches_reference(case: int, dtype: torch.dtype) -> None:
    t, e, k, h, i = CASES[case]
    swiglu, bias = case % 2 == 1, case >= 2  # each of silu / clamped SwiGLU with and without biases
    m = _experts(e, h, i, swiglu, bias, seed=case)
    g = torch.Generator().manual_seed(100 + case)
    x = torch.randn(t, h, generator=g).to(DEV)
    w, ids = route(torch.randn(t, e, generator=g).to(DEV), k, renormalize=case % 3 == 0)
    _check(m, x, ids, w, dtype, small=None if dtype == torch.float32 else case % 2 == 0)


def _routing(kind: str, t: int, e: int, k: int) -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(7)
    logits = torch.randn(t, e, generator=g)
    if kind == "one expert for every row":
        logits[:, 3] += 100.0
    elif kind == "experts nobody chose":  # only the even ones are ever chosen
        logits[:, 1::2] -= 100.0
    elif kind == "ties":  # every logit equal: topk picks by id, equal weights
        logits = torch.zeros(t, e)
    elif kind == "lopsided":  # two experts take all but a row or two of every other expert
        ids = torch.full((t, k), e - 1, dtype=torch.long)
        ids[: e - 1, 0] = torch.arange(e - 1)
        for j in range(1, k):
            ids[:, j] = (ids[:, 0] + j) % e
        return torch.softmax(torch.randn(t, k, generator=g), -1), ids
    return route(logits, k, renormalize=True)


@needs_triton
@pytest.mark.parametrize("small", [True, False], ids=["decode-tiles", "prefill-tiles"])
@pytest.mark.parametrize("kind", ["one expert for every row", "experts nobody chose", "ties", "lopsided"])
def test_fused_moe_routing_edges(kind: str, small: bool) -> None:
    t, e, k, h, i = 70, 12, 2, 40, 24
    m = _experts(e, h, i, swiglu=False, bias=True, seed=3)
    w, ids = _routing(kind, t, e, k)
    x = torch.randn(t, h, generator=torch.Generator().manual_seed(8)).to(DEV)
    _check(m, x, ids.to(DEV), w.to(DEV), LOW, small, align_kernel=not small)  # both alignment paths


def test_the_block_bound_is_reached() -> None:
    """max_blocks is what the worst routing needs (E - 1 experts one row each, one expert the rest) and no
    routing needs more (brute force over every split of a few rows among a few experts)."""
    import itertools

    pytest.importorskip("triton")
    from glassbox.kernels.triton_moe import max_blocks

    for pairs, e, bm in [(5, 3, 2), (7, 4, 3), (6, 6, 4), (9, 2, 4)]:
        worst = max(
            sum(-(-c // bm) for c in counts)
            for counts in itertools.product(range(pairs + 1), repeat=e)
            if sum(counts) == pairs
        )
        assert worst == max_blocks(pairs, e, bm), (pairs, e, bm)


@needs_triton
@pytest.mark.parametrize("block_m", [16, 64])
def test_both_alignments_lay_out_the_pairs_alike(block_m: int) -> None:
    """align()'s kernel and its torch path give the same layout, and it is the one asked for: every pair
    once, in a block of its expert, each expert's pairs in order and in as few blocks as its count needs,
    the blocks in expert order, none past them live; the experts used counted."""
    from glassbox.kernels.triton_moe import align

    for kind, t, e, k in [
        ("ties", 1, 4, 1),
        ("random", 3, 8, 2),
        ("lopsided", 70, 12, 2),
        ("random", 700, 16, 4),
    ]:
        w, ids = _routing(kind, t, e, k)
        ids = ids.to(DEV)
        got = []
        for kernel in (True, False):
            reads = torch.zeros((), dtype=torch.int64, device=DEV)
            rows, experts, live = align(ids, e, block_m, reads, kernel)
            assert reads.item() == len(set(ids.flatten().tolist()))
            layout = [
                (int(experts[b]), rows[b * block_m : b * block_m + int(live[b])].tolist())
                for b in range(experts.shape[0])
            ]
            got.append(layout)
        assert got[0] == got[1], kind
        flat = ids.flatten().tolist()
        want = []
        for x in range(e):
            mine = [p for p in range(len(flat)) if flat[p] == x]
            want += [(x, mine[i : i + block_m]) for i in range(0, len(mine), block_m)]
        want += [(-1, [])] * (len(got[0]) - len(want))
        assert got[0] == want, kind
