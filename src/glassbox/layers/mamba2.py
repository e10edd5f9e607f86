"""The Mamba-2 mixer of Nemotron-H / Nemotron 3 with Hugging Face's parameter names, on the state cache
(layers/state_cache.py).

in_proj(x) -> [z (d_inner) | x B C (conv_dim) | dt (heads)]; x B C through the causal conv + SiLU; the SSD
recurrence (layers/ssd_scan.py) per head with dt = softplus(dt + dt_bias) (the prompt scan clamps it
below at time_step_min, the one-step recurrence does not: both as transformers' torch paths do),
A = -exp(A_log) and skip D; then y * SiLU(z), RMSNorm over each of n_groups groups of channels, and
out_proj.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from glassbox.kernels import cpu_recurrent
from glassbox.layers.causal_conv import conv_decode, conv_prompt
from glassbox.layers.ssd_scan import ssd_chunked, ssd_step
from glassbox.layers.state_cache import StateBatch, apply_copies, conv_rows, seed_wave, ssm_rows
from glassbox.models.hybrid_spec import Mamba2Shape


class GroupGatedRMSNorm(nn.Module):
    """(y * SiLU(z)) in float32, RMS-normalized within each of ``groups`` equal groups of channels, times
    the weight (in y's dtype)."""

    def __init__(self, dim: int, groups: int, eps: float) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.ones(dim))
        self.groups, self.eps = groups, eps

    def forward(self, y: torch.Tensor, z: torch.Tensor) -> torch.Tensor:  # (T, dim) both
        h = y.float() * F.silu(z.float())
        t, dim = h.shape
        h = F.rms_norm(h.view(t, self.groups, dim // self.groups), (dim // self.groups,), eps=self.eps)
        return self.weight * h.view(t, dim).to(y.dtype)


class Mamba2Mixer(nn.Module):
    def __init__(self, shape: Mamba2Shape, hidden: int, eps: float) -> None:
        super().__init__()
        self.shape = s = shape
        self.in_proj = nn.Linear(hidden, s.d_inner + s.conv_dim + s.num_heads, bias=s.proj_bias)
        self.conv1d = nn.Conv1d(s.conv_dim, s.conv_dim, s.conv_kernel, groups=s.conv_dim, bias=s.conv_bias)
        self.dt_bias = nn.Parameter(torch.ones(s.num_heads))
        self.A_log = nn.Parameter(torch.zeros(s.num_heads))
        self.D = nn.Parameter(torch.ones(s.num_heads))
        self.norm = GroupGatedRMSNorm(s.d_inner, s.n_groups, eps)
        self.out_proj = nn.Linear(s.d_inner, hidden, bias=s.proj_bias)
        self.native = False  # decode rows on the C recurrence (models/hybrid_native.py), else PyTorch ops

    def forward(
        self,
        x: torch.Tensor,  # (T, hidden) normed
        cache: torch.Tensor,  # (num_slots, state width) float32: this layer's state rows
        state: StateBatch,
    ) -> torch.Tensor:  # (T, hidden)
        s, t = self.shape, x.shape[0]
        z, xbc, dt_raw = self.in_proj(x).split([s.d_inner, s.conv_dim, s.num_heads], dim=-1)
        apply_copies(cache, state)  # checkpoint saves and restores due before this step
        weight = self.conv1d.weight.squeeze(1)  # (conv_dim, K)
        bias = self.conv1d.bias
        windows = conv_rows(cache, s.conv_kernel, s.conv_dim)  # (slots, K-1, conv_dim)
        matrices = ssm_rows(cache, s.conv_elements, s.ssm_shape)  # (slots, H, P, N)
        waves = state.waves()
        conv_out = torch.empty_like(xbc)
        for w in waves:  # decode rows (a verify step's draft positions each from the one before)
            seed_wave(windows, w)
            conv_out[w.rows], new = conv_decode(xbc[w.rows], windows[w.slots], weight, bias)
            windows.index_copy_(0, w.slots, new.to(windows.dtype))
        for p in state.prefills:
            rows = slice(p.row, p.row + p.length)
            before = None if p.fresh else windows[p.slot]
            conv_out[rows], new = conv_prompt(xbc[rows], before, weight, bias)
            windows[p.slot] = new
        gn = s.n_groups * s.state_size
        xs, b, c = conv_out.float().split([s.d_inner, gn, gn], dim=-1)
        r = s.num_heads // s.n_groups  # heads per group
        xs = xs.view(t, s.num_heads, s.head_dim)
        b = b.view(t, s.n_groups, s.state_size).repeat_interleave(r, dim=1)  # (T, H, N)
        c = c.view(t, s.n_groups, s.state_size).repeat_interleave(r, dim=1)
        dt = F.softplus(dt_raw.float() + self.dt_bias.float())  # (T, H)
        a = -self.A_log.float().exp()
        d = self.D.float()
        y = torch.empty_like(xs)
        for w in waves:
            seed_wave(matrices, w)
            wr = w.rows
            if self.native:  # in place on the slots' rows
                y[wr] = cpu_recurrent.ssd_step(xs[wr], dt[wr], a, b[wr], c[wr], d, matrices, w.slots)
            else:
                y[wr], new_s = ssd_step(xs[wr], dt[wr], a, b[wr], c[wr], d, matrices[w.slots])
                matrices.index_copy_(0, w.slots, new_s)
        for p in state.prefills:
            rows = slice(p.row, p.row + p.length)
            start = matrices.new_zeros(s.ssm_shape) if p.fresh else matrices[p.slot]
            step = dt[rows].clamp(min=s.time_step_min)
            y[rows], matrices[p.slot] = ssd_chunked(
                xs[rows], step, a, b[rows], c[rows], d, start, s.chunk_size
            )
        out = self.norm(y.view(t, s.d_inner), z)
        return self.out_proj(out.to(x.dtype))
