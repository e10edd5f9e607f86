"""The gated delta rule (Gated DeltaNet, arXiv 2412.06464) in PyTorch ops, float32: the reference paths.

Per head, with a state S (dk, dv), decay g_t <= 0 (log space), write strength beta_t in (0, 1), unit-norm
key k_t, query q_t (scaled by dk ** -0.5) and value v_t, each token does

    S <- exp(g_t) S;  d_t = beta_t (v_t - S^T k_t);  S <- S + k_t d_t^T;  o_t = S^T q_t.

Decode rows run that step (:func:`delta_step`). Prompt rows run the chunked form (:func:`delta_chunked`),
which gives the same outputs: inside a chunk of C tokens with cumulative log decay G_i, the corrections
d satisfy d_i = beta_i (v_i - exp(G_i) S0^T k_i - sum_{j<i} exp(G_i - G_j) (k_i . k_j) d_j), a unit
lower-triangular system (I + A) d = beta v - beta exp(G) K S0 solved once per chunk for both right-hand
sides; then o_i = exp(G_i) S0^T q_i + sum_{j<=i} exp(G_i - G_j) (q_i . k_j) d_j and the chunk's end state
exp(G_C) S0 + sum_j exp(G_C - G_j) k_j d_j^T. Chunks run in order (the state carries); their inner work is
batched matrix products.
"""

from __future__ import annotations

import torch

CHUNK = 64  # tokens per chunk of the prompt scan (flash-linear-attention's and transformers' size)
# Decay factors exp(x) with x < -UNDERFLOW are taken as exactly 0. Qwen3-Next's decays reach -30 per token,
# so a chunk's cumulative log decay runs to -1000s: exp() of those lands in float32's subnormal range
# (below 1.2e-38), and subnormal operands make the x86 matrix products and the triangular solve several
# times slower (no flush-to-zero on the CPU). exp(-30) = 9e-14 is far below float32's relative rounding
# (6e-8) of the undecayed terms each of these sums with (the diagonal's decay is exactly 1), and products
# of two such factors (>= exp(-60) = 9e-27) stay normal.
UNDERFLOW = 30.0


def exp_or_zero(x: torch.Tensor) -> torch.Tensor:
    """exp(x), with 0 where x < -UNDERFLOW (no subnormal results)."""
    return x.masked_fill(x < -UNDERFLOW, float("-inf")).exp()


def l2_normalize(x: torch.Tensor, eps: float = 1e-6) -> torch.Tensor:
    """x / sqrt(sum(x^2) + eps) over the last dim (flash-linear-attention's form)."""
    return x * torch.rsqrt((x * x).sum(dim=-1, keepdim=True) + eps)


def delta_step(
    q: torch.Tensor,  # (N, H, dk) float32, normalized and scaled
    k: torch.Tensor,  # (N, H, dk) float32, normalized
    v: torch.Tensor,  # (N, H, dv) float32
    g: torch.Tensor,  # (N, H) log decay
    beta: torch.Tensor,  # (N, H)
    state: torch.Tensor,  # (N, H, dk, dv) float32
) -> tuple[torch.Tensor, torch.Tensor]:  # (o (N, H, dv), the new state (N, H, dk, dv))
    """One token per sequence."""
    s = state * g.exp()[..., None, None]
    read = (s * k.unsqueeze(-1)).sum(dim=-2)  # (N, H, dv): S^T k
    d = (v - read) * beta.unsqueeze(-1)
    s = s + k.unsqueeze(-1) * d.unsqueeze(-2)
    return (s * q.unsqueeze(-1)).sum(dim=-2), s


def delta_chunked(
    q: torch.Tensor,  # (L, H, dk) float32, normalized and scaled
    k: torch.Tensor,  # (L, H, dk) float32, normalized
    v: torch.Tensor,  # (L, H, dv) float32
    g: torch.Tensor,  # (L, H) log decay
    beta: torch.Tensor,  # (L, H)
    state: torch.Tensor,  # (H, dk, dv) float32: the state before the first token
    chunk: int = CHUNK,
) -> tuple[torch.Tensor, torch.Tensor]:  # (o (L, H, dv), the state after the last token (H, dk, dv))
    """One sequence's tokens, ``chunk`` at a time."""
    length, heads, dk = k.shape
    dv = v.shape[-1]
    pad = (-length) % chunk  # zero keys and decays leave the state as it is
    if pad:
        q, k, v = (torch.cat([t, t.new_zeros(pad, heads, t.shape[-1])]) for t in (q, k, v))
        g, beta = (torch.cat([t, t.new_zeros(pad, heads)]) for t in (g, beta))
    n = (length + pad) // chunk

    def chunks(t: torch.Tensor) -> torch.Tensor:  # (L, H, ...) -> (n, H, chunk, ...), contiguous
        return t.reshape(n, chunk, heads, *t.shape[2:]).transpose(1, 2).contiguous()

    qc, kc, vc, gc, bc = (chunks(t) for t in (q, k, v, g, beta))
    cum = gc.cumsum(dim=-1)  # (n, H, C): G_i
    causal = torch.ones(chunk, chunk, dtype=torch.bool, device=k.device).tril()
    # exp(G_i - G_j) for j <= i, else 0 (masked before the exp: G_i - G_j > 0 above the diagonal)
    diff = cum.unsqueeze(-1) - cum.unsqueeze(-2)
    decay = diff.masked_fill(~causal | (diff < -UNDERFLOW), float("-inf")).exp()
    start = exp_or_zero(cum)  # exp(G_i): reads of the chunk's start state
    last = cum[..., -1:]  # (n, H, 1): G_C
    kb = kc * bc.unsqueeze(-1)
    # (n, H, C, C): beta_i exp(G_i - G_j) k_i . k_j below the diagonal; the solve reads only the strictly
    # lower part (unitriangular: the system is I + a)
    a = (kb @ kc.transpose(-1, -2)) * decay
    rhs = torch.cat([vc * bc.unsqueeze(-1), kb * start.unsqueeze(-1)], dim=-1)
    sol = torch.linalg.solve_triangular(a, rhs, upper=False, unitriangular=True)
    u, w = sol[..., :dv], sol[..., dv:]  # d = u - w S0
    scores = (qc @ kc.transpose(-1, -2)) * decay  # (n, H, C, C): exp(G_i - G_j) q_i . k_j, j <= i
    q_in = qc * start.unsqueeze(-1)
    # (n, H, dk, C): exp(G_C - G_j) k_j^T writes the end state
    k_out = (kc * exp_or_zero(last - cum).unsqueeze(-1)).transpose(-1, -2).contiguous()
    total = exp_or_zero(last).unsqueeze(-1)  # (n, H, 1, 1): exp(G_C)
    out = torch.empty_like(vc)  # (n, H, C, dv)
    s = state
    for i in range(n):  # chunks in order; each [i] is a contiguous (H, ...) block
        d = u[i] - w[i] @ s  # (H, C, dv)
        out[i] = q_in[i] @ s + scores[i] @ d
        s = s * total[i] + k_out[i] @ d
    o = out.transpose(1, 2).reshape(n * chunk, heads, dv)
    return o[:length], s
