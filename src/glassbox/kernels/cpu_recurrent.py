"""Hybrid models' decode recurrences on glassbox's C kernels (cpu_recurrent.c), in place on the state cache.

Each reads and writes the state rows of the sequences' slots directly (one pass or two over each head's
matrix, threads over sequences and heads) where the PyTorch references (layers/gated_delta_rule.py
``delta_step``, layers/ssd_scan.py ``ssd_step``) gather the rows, run several elementwise passes and
scatter them back. The mixers call these where ``native`` is set (models/hybrid_native.py binds them).
"""

from __future__ import annotations

import torch

from glassbox.kernels import native

MAX_COLS = 1024  # cpu_recurrent.c keeps a head's value row on the stack


def _f32(t: torch.Tensor) -> torch.Tensor:
    return t.to(torch.float32).contiguous()


def _rows(matrices: torch.Tensor) -> tuple[int, int]:
    """(base address, row stride in floats) of a (num_rows, heads, r, c) view whose rows hold contiguous
    (heads, r, c) matrices."""
    _, h, r, c = matrices.shape
    assert matrices.dtype == torch.float32 and matrices.stride()[1:] == (r * c, c, 1), "state rows layout"
    return matrices.data_ptr(), matrices.stride(0)


def delta_step(
    q: torch.Tensor,  # (N, H, dk) normalized and scaled
    k: torch.Tensor,  # (N, H, dk) normalized
    v: torch.Tensor,  # (N, H, dv)
    g: torch.Tensor,  # (N, H) log decay
    beta: torch.Tensor,  # (N, H)
    matrices: torch.Tensor,  # (num_rows, H, dk, dv) float32: the state rows, updated in place
    slots: torch.Tensor,  # (N,) int64
) -> torch.Tensor:  # (N, H, dv) float32
    lib = native.library()
    assert lib is not None and v.shape[-1] <= MAX_COLS
    n, h, dk = k.shape
    dv = v.shape[-1]
    q, k, v, g, beta = (_f32(t) for t in (q, k, v, g, beta))
    slots = slots.to(torch.int64).contiguous()
    out = torch.empty(n, h, dv, dtype=torch.float32)
    base, stride = _rows(matrices)
    lib.gb_delta_step(
        base, stride, slots.data_ptr(), q.data_ptr(), k.data_ptr(), v.data_ptr(), g.data_ptr(),
        beta.data_ptr(), out.data_ptr(), n, h, dk, dv, torch.get_num_threads(),
    )  # fmt: skip
    return out


def ssd_step(
    x: torch.Tensor,  # (N, H, P)
    dt: torch.Tensor,  # (N, H) step sizes
    a: torch.Tensor,  # (H,)
    b: torch.Tensor,  # (N, H, Ns)
    c: torch.Tensor,  # (N, H, Ns)
    d: torch.Tensor,  # (H,)
    matrices: torch.Tensor,  # (num_rows, H, P, Ns) float32: the state rows, updated in place
    slots: torch.Tensor,  # (N,) int64
) -> torch.Tensor:  # (N, H, P) float32
    lib = native.library()
    assert lib is not None
    n, h, p = x.shape
    ns = b.shape[-1]
    x, dt, a, b, c, d = (_f32(t) for t in (x, dt, a, b, c, d))
    slots = slots.to(torch.int64).contiguous()
    out = torch.empty(n, h, p, dtype=torch.float32)
    base, stride = _rows(matrices)
    lib.gb_ssd_step(
        base, stride, slots.data_ptr(), x.data_ptr(), dt.data_ptr(), a.data_ptr(), b.data_ptr(), c.data_ptr(),
        d.data_ptr(), out.data_ptr(), n, h, p, ns, torch.get_num_threads(),
    )  # fmt: skip
    return out
