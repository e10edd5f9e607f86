"""The chunked prompt scans under strong decays (Qwen3-Next's per-token log decays reach -30; Mamba-2's
dt * A likewise): the same outputs as the token-by-token recurrence in float64, and no subnormal float32
values, which slow x86 matrix products several-fold (layers/gated_delta_rule.UNDERFLOW)."""

from __future__ import annotations

import torch

from glassbox.layers.gated_delta_rule import UNDERFLOW, delta_chunked, delta_step, exp_or_zero, l2_normalize
from glassbox.layers.ssd_scan import ssd_chunked, ssd_step

TINY = torch.finfo(torch.float32).tiny  # the smallest normal float32
# float32 chunked scan against the float64 recurrence: each output sums <= 64 decayed terms of magnitude
# <= ~10 (|v| ~ 3, unit keys), so ~64 * 1.2e-7 * 10 ~ 1e-4 absolute at worst from rounding; terms dropped
# for decays below exp(-30) ~ 1e-13 add nothing visible at that scale
TOL = dict(rtol=1e-4, atol=2e-4)


def _subnormals(t: torch.Tensor) -> int:
    return int(((t != 0) & (t.abs() < TINY)).sum())


def test_exp_or_zero_is_exp_down_to_the_threshold_then_zero() -> None:
    x = torch.linspace(-200, 0, 20001)
    y = exp_or_zero(x)
    keep = x >= -UNDERFLOW
    torch.testing.assert_close(y[keep], x[keep].exp(), rtol=0, atol=0)
    assert (y[~keep] == 0).all()
    assert _subnormals(y) == 0


def test_delta_chunked_strong_decays_match_float64_steps_without_subnormals() -> None:
    gen = torch.Generator().manual_seed(0)
    length, h, dk, dv = 150, 4, 16, 8
    q = l2_normalize(torch.randn(length, h, dk, generator=gen)) * dk**-0.5
    k = l2_normalize(torch.randn(length, h, dk, generator=gen))
    v = torch.randn(length, h, dv, generator=gen)
    g = -30 * torch.rand(length, h, generator=gen)  # -exp(A_log) softplus(.), A up to 16
    g[:, 0] = -95 / 64  # head 0: a chunk's total decay exp(-95), in float32's subnormal range
    beta = torch.rand(length, h, generator=gen)
    s0 = torch.randn(h, dk, dv, generator=gen)
    out, state = delta_chunked(q, k, v, g, beta, s0)
    s, steps = s0[None].double(), []
    for t in range(length):
        r = slice(t, t + 1)
        o, s = delta_step(q[r].double(), k[r].double(), v[r].double(), g[r].double(), beta[r].double(), s)
        steps.append(o)
    torch.testing.assert_close(out.double(), torch.cat(steps), **TOL)
    torch.testing.assert_close(state.double(), s[0], **TOL)
    # no key, only decay: the start state decays by exp(-95) over the first chunk
    zero_k = torch.zeros_like(k)
    out0, state0 = delta_chunked(q[:64], zero_k[:64], v[:64], g[:64], beta[:64], s0)
    assert _subnormals(out0) == 0 and _subnormals(state0) == 0


def test_ssd_chunked_strong_decays_match_float64_steps_without_subnormals() -> None:
    gen = torch.Generator().manual_seed(1)
    length, h, p, n, chunk = 150, 4, 8, 16, 64
    x = torch.randn(length, h, p, generator=gen)
    dt = 3 * torch.rand(length, h, generator=gen)
    a = -torch.tensor([95 / 64, 5.0, 10.0, 1.0])  # head 0 with dt = 1: exp(-95) per chunk
    dt[:, 0] = 1.0
    b, c = torch.randn(length, h, n, generator=gen), torch.randn(length, h, n, generator=gen)
    d = torch.randn(h, generator=gen)
    s0 = torch.randn(h, p, n, generator=gen)
    y, state = ssd_chunked(x, dt, a, b, c, d, s0, chunk)
    s, steps = s0[None].double(), []
    for t in range(length):
        r = slice(t, t + 1)
        f64 = (x[r].double(), dt[r].double(), a.double(), b[r].double(), c[r].double(), d.double())
        o, s = ssd_step(*f64, s)
        steps.append(o)
    torch.testing.assert_close(y.double(), torch.cat(steps), **TOL)
    torch.testing.assert_close(state.double(), s[0], **TOL)
    zero_b = torch.zeros_like(b)
    y0, state0 = ssd_chunked(x[:64], dt[:64], a, zero_b[:64], c[:64], d, s0, chunk)
    assert _subnormals(y0) == 0 and _subnormals(state0) == 0
