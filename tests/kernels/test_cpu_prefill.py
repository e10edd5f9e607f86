"""bf16 prefill attention (tiled GEMMs around the native softmax) against float32 SDPA on the same inputs."""

from __future__ import annotations

import pytest
import torch

from glassbox.kernels import cpu_prefill, native
from glassbox.layers.attention import PrefillSeq, prefill_attention

pytestmark = pytest.mark.skipif(native.compiler() is None, reason="no C compiler to build the kernels")
BS = 16


def _case(
    hq: int, hk: int, d: int, seqs: list[tuple[int, int]], window: int | None, seed: int
) -> tuple[torch.Tensor, ...]:
    """A cache holding each sequence's prefix and new tokens in scattered blocks, and the step's q/k/v.
    ``seqs``: (cached prefix length, new tokens) per sequence."""
    g = torch.Generator().manual_seed(seed)
    need = [(s + n + BS - 1) // BS for s, n in seqs]
    nb = sum(need) + 2
    cache = (torch.randn(2, nb, BS, hk, d, generator=g) * 2).to(torch.bfloat16)
    order = torch.randperm(nb, generator=g)
    flat = cache.view(2, nb * BS, hk, d)
    prefills, ks, vs, row, used = [], [], [], 0, 0
    for (start, n), blocks in zip(seqs, need, strict=True):
        table = order[used : used + blocks]
        used += blocks
        slots = (table[:, None] * BS + torch.arange(BS)).reshape(-1)[start : start + n]
        ks.append(flat[0, slots])
        vs.append(flat[1, slots])
        prefills.append(PrefillSeq(row, n, start, table))
        row += n
    q = (torch.randn(row, hq, d, generator=g) * 2).to(torch.bfloat16)
    return q, torch.cat(ks), torch.cat(vs), cache, prefills


@pytest.mark.parametrize(
    ("hq", "hk", "d", "seqs", "window"),
    [
        (16, 8, 128, [(0, 100)], None),  # one tile, GQA 2
        (8, 2, 64, [(0, 300)], None),  # several tiles (forced small below), GQA 4
        (4, 4, 128, [(0, 37), (50, 70), (0, 1)], None),  # no GQA; a prefix; a one-token prompt
        (8, 2, 64, [(200, 150)], 64),  # sliding window past a cached prefix
        (8, 2, 80, [(0, 257)], 32),  # window inside the prompt; head size 80
    ],
)
def test_bf16_prefill_matches_float32_sdpa(
    monkeypatch: pytest.MonkeyPatch,
    hq: int,
    hk: int,
    d: int,
    seqs: list[tuple[int, int]],
    window: int | None,
) -> None:
    monkeypatch.setattr(cpu_prefill, "SCORE_TILE_BYTES", 96 * 2 * hq * 4)  # tiles of ~24 rows at 96 keys
    monkeypatch.setattr(cpu_prefill, "MIN_TILE", 8)
    q, k, v, cache, prefills = _case(hq, hk, d, seqs, window, seed=hq + d)
    scale = d**-0.5
    ref = torch.empty(q.shape, dtype=torch.float32)
    prefill_attention(q.float(), k.float(), v.float(), cache.float(), prefills, scale, window, ref)
    sdpa = torch.empty_like(q)
    prefill_attention(q, k, v, cache, prefills, scale, window, sdpa)
    got = torch.full_like(q, float("nan"))
    cpu_prefill.prefill_attention_bf16(q, k, v, cache, prefills, scale, window, got)
    err = (got.float() - ref).abs().max().item()
    sdpa_err = (sdpa.float() - ref).abs().max().item()
    # within SDPA's own bf16 roundings (scores taken in one bf16 GEMM without the -max column: 6x them)
    assert err < max(2.5 * sdpa_err, 1e-3), (err, sdpa_err)


def test_tile_rows_bounds_the_score_tile() -> None:
    assert cpu_prefill.tile_rows(16, 128) == cpu_prefill.MAX_TILE
    assert cpu_prefill.tile_rows(16, 1 << 20) == cpu_prefill.MIN_TILE
    rows = cpu_prefill.tile_rows(16, 4096)
    assert 2 * 16 * 4096 * rows <= cpu_prefill.SCORE_TILE_BYTES


def test_rejects_float32() -> None:
    q, k, v, cache, prefills = _case(4, 2, 64, [(0, 8)], None, seed=0)
    with pytest.raises(ValueError, match="bf16"):
        cpu_prefill.prefill_attention_bf16(q.float(), k, v, cache, prefills, 0.125, None, q.float())
