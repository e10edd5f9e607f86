"""The Gated DeltaNet mixer of Qwen3-Next and Qwen3.5 with Hugging Face's parameter names, on the state
cache (layers/state_cache.py).

x -> [q | k | v] (through the causal conv + SiLU), z (output gate), b (write strength: beta = sigmoid(b)),
a (decay: g = -exp(A_log) softplus(a + dt_bias)); q and k L2-normalized per head, q scaled by
head_k_dim ** -0.5, each q/k head shared by num_v_heads // num_k_heads consecutive v heads (or, in the
tiled order of llama.cpp's Qwen3.5 files, by every num_k_heads-th: GatedDeltaNetShape.tiled_v_heads); the gated
delta rule (layers/gated_delta_rule.py) per v head; RMSNorm of each head's output times SiLU(z); out_proj.
Qwen3-Next stores the input projections fused per k head (in_proj_qkvz: [q, k, v group, z group] rows of
each k head in turn; in_proj_ba alike), Qwen3.5 as four linears.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from glassbox.kernels import cpu_recurrent
from glassbox.layers.causal_conv import conv_decode, conv_prompt
from glassbox.layers.gated_delta_rule import delta_chunked, delta_step, l2_normalize
from glassbox.layers.state_cache import StateBatch, apply_copies, conv_rows, seed_wave, ssm_rows
from glassbox.models.hybrid_spec import GatedDeltaNetShape


class GatedRMSNorm(nn.Module):
    """RMSNorm over the last dim (float32 statistics, weight applied in the input dtype), then times
    SiLU(gate) in float32 (norm before gate, as Qwen3-Next)."""

    def __init__(self, dim: int, eps: float) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.ones(dim))
        self.eps = eps

    def forward(self, x: torch.Tensor, gate: torch.Tensor) -> torch.Tensor:  # (..., dim) both
        h = F.rms_norm(x.float(), (x.shape[-1],), eps=self.eps)
        h = self.weight * h.to(x.dtype)
        return (h * F.silu(gate.float())).to(x.dtype)


class GatedDeltaNet(nn.Module):
    def __init__(self, shape: GatedDeltaNetShape, hidden: int, eps: float) -> None:
        super().__init__()
        self.shape = s = shape
        nv = s.num_v_heads
        if s.fused_projections:
            self.in_proj_qkvz = nn.Linear(hidden, 2 * s.key_dim + 2 * s.value_dim, bias=False)
            self.in_proj_ba = nn.Linear(hidden, 2 * nv, bias=False)
        else:
            self.in_proj_qkv = nn.Linear(hidden, s.conv_dim, bias=False)
            self.in_proj_z = nn.Linear(hidden, s.value_dim, bias=False)
            self.in_proj_b = nn.Linear(hidden, nv, bias=False)
            self.in_proj_a = nn.Linear(hidden, nv, bias=False)
        # depthwise over [q | k | v]: HF's Conv1d weight (conv_dim, 1, K), no bias
        self.conv1d = nn.Conv1d(s.conv_dim, s.conv_dim, s.conv_kernel, groups=s.conv_dim, bias=False)
        self.dt_bias = nn.Parameter(torch.ones(nv))
        self.A_log = nn.Parameter(torch.zeros(nv))
        self.norm = GatedRMSNorm(s.head_v_dim, eps)
        self.out_proj = nn.Linear(s.value_dim, hidden, bias=False)
        self.native = False  # decode rows on the C recurrence (models/hybrid_native.py), else PyTorch ops

    def _project(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
        """(mixed [q | k | v] (T, conv_dim), z (T, nv, dv), b (T, nv), a (T, nv))."""
        s, t = self.shape, x.shape[0]
        if not s.fused_projections:
            z = self.in_proj_z(x).view(t, s.num_v_heads, s.head_v_dim)
            return self.in_proj_qkv(x), z, self.in_proj_b(x), self.in_proj_a(x)
        r = s.num_v_heads // s.num_k_heads
        dk, vgroup = s.head_k_dim, r * s.head_v_dim
        qkvz = self.in_proj_qkvz(x).view(t, s.num_k_heads, 2 * dk + 2 * vgroup)
        q, k, v, z = qkvz.split([dk, dk, vgroup, vgroup], dim=-1)
        b, a = self.in_proj_ba(x).view(t, s.num_k_heads, 2 * r).split([r, r], dim=-1)
        mixed = torch.cat([q.reshape(t, -1), k.reshape(t, -1), v.reshape(t, -1)], dim=-1)
        nv = s.num_v_heads
        return mixed, z.reshape(t, nv, s.head_v_dim), b.reshape(t, nv), a.reshape(t, nv)

    def _per_v_head(self, x: torch.Tensor) -> torch.Tensor:  # (T, nk, dk) -> (T, nv, dk)
        """The q/k head each v head reads: grouped (v head j: k head j // r) or tiled (j % nk)."""
        r = self.shape.num_v_heads // self.shape.num_k_heads
        return x.repeat(1, r, 1) if self.shape.tiled_v_heads else x.repeat_interleave(r, dim=1)

    def forward(
        self,
        x: torch.Tensor,  # (T, hidden) normed
        cache: torch.Tensor,  # (num_slots, state width) float32: this layer's state rows
        state: StateBatch,
    ) -> torch.Tensor:  # (T, hidden)
        s, t = self.shape, x.shape[0]
        mixed, z, b, a = self._project(x)
        apply_copies(cache, state)  # checkpoint saves and restores due before this step
        weight = self.conv1d.weight.squeeze(1)  # (conv_dim, K)
        windows = conv_rows(cache, s.conv_kernel, s.conv_dim)  # (slots, K-1, conv_dim)
        matrices = ssm_rows(cache, s.conv_elements, s.ssm_shape)  # (slots, nv, dk, dv)
        waves = state.waves()
        conv_out = torch.empty_like(mixed)
        for w in waves:  # decode rows (a verify step's draft positions each from the one before)
            seed_wave(windows, w)
            conv_out[w.rows], new = conv_decode(mixed[w.rows], windows[w.slots], weight, None)
            windows.index_copy_(0, w.slots, new.to(windows.dtype))
        for p in state.prefills:
            rows = slice(p.row, p.row + p.length)
            before = None if p.fresh else windows[p.slot]
            conv_out[rows], new = conv_prompt(mixed[rows], before, weight, None)
            windows[p.slot] = new
        q, k, v = conv_out.split([s.key_dim, s.key_dim, s.value_dim], dim=-1)
        # float32 from here to the norm, each q/k head repeated for its r v heads
        q = self._per_v_head(l2_normalize(q.float().view(t, s.num_k_heads, s.head_k_dim)))
        k = self._per_v_head(l2_normalize(k.float().view(t, s.num_k_heads, s.head_k_dim)))
        q = q * s.head_k_dim**-0.5
        v = v.float().view(t, s.num_v_heads, s.head_v_dim)
        beta = b.float().sigmoid()
        g = -self.A_log.float().exp() * F.softplus(a.float() + self.dt_bias.float())  # (T, nv)
        out = torch.empty_like(v)
        for w in waves:
            seed_wave(matrices, w)
            wr = w.rows
            if self.native:  # in place on the slots' rows
                out[wr] = cpu_recurrent.delta_step(q[wr], k[wr], v[wr], g[wr], beta[wr], matrices, w.slots)
            else:
                out[wr], new_s = delta_step(q[wr], k[wr], v[wr], g[wr], beta[wr], matrices[w.slots])
                matrices.index_copy_(0, w.slots, new_s)
        for p in state.prefills:
            rows = slice(p.row, p.row + p.length)
            start = matrices.new_zeros(s.ssm_shape) if p.fresh else matrices[p.slot]
            out[rows], matrices[p.slot] = delta_chunked(q[rows], k[rows], v[rows], g[rows], beta[rows], start)
        o = self.norm(out.to(x.dtype), z)  # (T, nv, dv)
        return self.out_proj(o.reshape(t, s.value_dim))
