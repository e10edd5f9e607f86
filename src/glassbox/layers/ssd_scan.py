"""The Mamba-2 selective state space recurrence (SSD, arXiv 2405.21060) in PyTorch ops, float32: the
reference paths.

Per head h, with a state H (P, N), step size dt_t > 0, A_h < 0, input x_t (P), and B_t, C_t (N) of the
head's group, each token does

    H <- exp(dt_t A_h) H + dt_t x_t B_t^T;  y_t = H C_t + D_h x_t.

Decode rows run that step (:func:`ssd_step`). Prompt rows run the chunked form (:func:`ssd_chunked`):
inside a chunk of C tokens with cumulative log decay a_i = sum_{j<=i} dt_j A,
y_i = exp(a_i) H0 C_i + sum_{j<=i} exp(a_i - a_j) (C_i . B_j) dt_j x_j + D x_i, and the chunk's end state
exp(a_C) H0 + sum_j exp(a_C - a_j) dt_j x_j B_j^T; chunks run in order, each a few batched products.
"""

from __future__ import annotations

import torch

from glassbox.layers.gated_delta_rule import UNDERFLOW, exp_or_zero


def ssd_step(
    x: torch.Tensor,  # (S, H, P) float32
    dt: torch.Tensor,  # (S, H) step sizes (softplus applied)
    a: torch.Tensor,  # (H,) A (negative)
    b: torch.Tensor,  # (S, H, N) each head's B (its group's)
    c: torch.Tensor,  # (S, H, N)
    d: torch.Tensor,  # (H,) skip
    state: torch.Tensor,  # (S, H, P, N) float32
) -> tuple[torch.Tensor, torch.Tensor]:  # (y (S, H, P), the new state)
    """One token per sequence."""
    decay = torch.exp(dt * a)[..., None, None]  # (S, H, 1, 1)
    write = (dt[..., None] * b)[:, :, None, :] * x[
        ..., None
    ]  # (S, H, P, N): dt B x^T as transformers orders it
    new = state * decay + write
    y = (new @ c.unsqueeze(-1)).squeeze(-1) + x * d[:, None]
    return y, new


def ssd_chunked(
    x: torch.Tensor,  # (L, H, P) float32
    dt: torch.Tensor,  # (L, H) step sizes (softplus applied, clamped)
    a: torch.Tensor,  # (H,)
    b: torch.Tensor,  # (L, H, N)
    c: torch.Tensor,  # (L, H, N)
    d: torch.Tensor,  # (H,)
    state: torch.Tensor,  # (H, P, N) float32: before the first token
    chunk: int,
) -> tuple[torch.Tensor, torch.Tensor]:  # (y (L, H, P), the state after the last token (H, P, N))
    """One sequence's tokens, ``chunk`` at a time."""
    length, heads, p = x.shape
    n_state = b.shape[-1]
    skip = x * d[:, None]
    xdt = x * dt[..., None]
    pad = (-length) % chunk  # zero steps leave the state as it is
    if pad:
        xdt = torch.cat([xdt, xdt.new_zeros(pad, heads, p)])
        b, c = (torch.cat([t, t.new_zeros(pad, heads, n_state)]) for t in (b, c))
        dt = torch.cat([dt, dt.new_zeros(pad, heads)])
    n = (length + pad) // chunk
    xc = xdt.view(n, chunk, heads, p).permute(0, 2, 1, 3)  # (n, H, C, P)
    bc = b.view(n, chunk, heads, n_state).permute(0, 2, 1, 3)  # (n, H, C, N)
    cc = c.view(n, chunk, heads, n_state).permute(0, 2, 1, 3)
    cum = (dt * a).view(n, chunk, heads).permute(0, 2, 1).cumsum(dim=-1)  # (n, H, C): a_i
    causal = torch.ones(chunk, chunk, dtype=torch.bool, device=x.device).tril()
    diff = cum.unsqueeze(-1) - cum.unsqueeze(-2)  # decays below exp(-UNDERFLOW) are 0: no subnormals
    decay = diff.masked_fill(~causal | (diff < -UNDERFLOW), float("-inf")).exp()
    scores = (cc @ bc.transpose(-1, -2)) * decay  # (n, H, C, C): exp(a_i - a_j) C_i . B_j, j <= i
    inner = scores @ xc  # (n, H, C, P): the chunk's own tokens
    c_in = cc * exp_or_zero(cum).unsqueeze(-1)  # exp(a_i) C_i reads the start state
    last = cum[..., -1:]  # (n, H, 1)
    b_out = bc * exp_or_zero(last - cum).unsqueeze(-1)  # exp(a_C - a_j) B_j writes the end state
    out = torch.empty_like(xc)
    s = state
    for i in range(n):
        out[i] = inner[i] + c_in[i] @ s.transpose(-1, -2)  # (H, C, N) @ (H, N, P)
        s = (
            s * exp_or_zero(last[i]).unsqueeze(-1) + xc[i].transpose(-1, -2) @ b_out[i]
        )  # (H, P, C) @ (H, C, N)
    y = out.permute(0, 2, 1, 3).reshape(n * chunk, heads, p)[:length]
    return y + skip, s
