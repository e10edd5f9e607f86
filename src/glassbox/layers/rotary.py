"""Rotary position embedding (rotate-half layout) with the rope_scaling kinds Llama-family models use."""

from __future__ import annotations

import math
from typing import Any

import torch
from torch import nn


def inv_frequencies(head_dim: int, params: dict[str, Any]) -> tuple[torch.Tensor, float]:
    """(inverse frequencies (head_dim/2,), attention scaling factor) for the given rope settings."""
    base = float(params["rope_theta"])
    partial = float(params.get("partial_rotary_factor", 1.0))
    if params["rope_type"] == "proportional":  # Gemma 4's full layers: see _proportional
        return _proportional(head_dim, base, partial, float(params.get("factor") or 1.0)), 1.0
    dim = int(head_dim * partial)
    inv = 1.0 / (base ** (torch.arange(0, dim, 2, dtype=torch.int64).float() / dim))
    kind = params["rope_type"]
    if kind == "default":
        return inv, 1.0
    if kind == "linear":
        return inv / float(params["factor"]), 1.0
    if kind == "llama3":
        factor = float(params["factor"])
        low = float(params["low_freq_factor"])
        high = float(params["high_freq_factor"])
        old_len = float(params["original_max_position_embeddings"])
        low_wavelen = old_len / low
        high_wavelen = old_len / high
        wavelen = 2 * math.pi / inv
        scaled = torch.where(wavelen > low_wavelen, inv / factor, inv)
        smooth = (old_len / wavelen - low) / (high - low)
        smoothed = (1 - smooth) * scaled / factor + smooth * scaled
        medium = (wavelen >= high_wavelen) & (wavelen <= low_wavelen)
        return torch.where(medium, smoothed, scaled), 1.0
    if kind == "yarn":
        return _yarn(dim, base, params)
    if kind == "longrope":
        return _longrope(dim, base, params)
    raise ValueError(
        f"rope_scaling type {kind!r} is not supported (supported: default, linear, llama3, yarn, longrope, "
        "proportional)"
    )


def _proportional(head_dim: int, base: float, partial: float, factor: float) -> torch.Tensor:
    """Proportional rope (Gemma 4's full layers) as transformers computes it: (head_dim/2,) frequencies over
    the whole head, the first int(partial * head_dim // 2) at the exponents of a full head's
    (base ** (-2i / head_dim)), the rest 0 (those pairs do not turn: cos 1, sin 0); all divided by
    ``factor``. The head rotates whole (rotate-half over head_dim), not a leading part of it."""
    turning = int(partial * head_dim // 2)
    inv = 1.0 / (base ** (torch.arange(0, 2 * turning, 2, dtype=torch.int64).float() / head_dim))
    return torch.cat([inv, torch.zeros(head_dim // 2 - turning)]) / factor


def _longrope(dim: int, base: float, params: dict[str, Any]) -> tuple[torch.Tensor, float]:
    """LongRoPE (Phi-3, Phi-4-mini): each frequency divided by its own factor, the ``long_factor`` list
    where ``use_long_factor`` (set by ModelConfig: the engine's context is longer than the model's
    pre-training length, as vLLM and llama.cpp choose it once, so that the cache never mixes the two) and
    ``short_factor`` otherwise; cos/sin scaled by ``attention_factor``, by default
    sqrt(1 + ln(factor) / ln(original_max_position_embeddings)) as transformers computes it."""
    factors = params["long_factor" if params.get("use_long_factor") else "short_factor"]
    if len(factors) != dim // 2:
        raise ValueError(f"longrope factors: {len(factors)} values for {dim // 2} rotary frequencies")
    factor = float(params.get("factor") or 1.0)
    original = float(params["original_max_position_embeddings"])
    attention = params.get("attention_factor")
    if attention is None:
        attention = 1.0 if factor <= 1.0 else math.sqrt(1 + math.log(factor) / math.log(original))
    ext = torch.tensor(factors, dtype=torch.float32)
    inv = 1.0 / (ext * base ** (torch.arange(0, dim, 2, dtype=torch.int64).float() / dim))
    return inv, float(attention)


def _yarn(dim: int, base: float, params: dict[str, Any]) -> tuple[torch.Tensor, float]:
    """YaRN (arXiv 2309.00071) as transformers computes it: each frequency blends the interpolated
    (divided by ``factor``) and the original one along a linear ramp between the dimensions that turn
    ``beta_fast`` and ``beta_slow`` times within ``original_max_position_embeddings`` (the ramp's ends
    floored/ceiled unless ``truncate`` is false); cos/sin are scaled by ``attention_factor``, by default
    0.1 ln(factor) + 1 (or the ratio of the ``mscale``/``mscale_all_dim`` forms where both are given)."""
    factor = float(params["factor"])
    old_len = float(params["original_max_position_embeddings"])

    def mscale(scale: float, m: float = 1.0) -> float:
        return 1.0 if scale <= 1 else 0.1 * m * math.log(scale) + 1.0

    attention = params.get("attention_factor")
    if attention is None:
        m, m_all = params.get("mscale"), params.get("mscale_all_dim")
        attention = mscale(factor, m) / mscale(factor, m_all) if m and m_all else mscale(factor)
    fast, slow = float(params.get("beta_fast") or 32), float(params.get("beta_slow") or 1)

    def correction_dim(rotations: float) -> float:
        return (dim * math.log(old_len / (rotations * 2 * math.pi))) / (2 * math.log(base))

    low, high = correction_dim(fast), correction_dim(slow)
    if params.get("truncate", True):
        low, high = math.floor(low), math.ceil(high)
    low, high = max(low, 0), min(high, dim - 1)
    if low == high:
        high += 0.001  # no zero-width ramp
    ramp = ((torch.arange(dim // 2, dtype=torch.float32) - low) / (high - low)).clamp(0, 1)
    pos_freqs = base ** (torch.arange(0, dim, 2).float() / dim)
    extrapolation = 1 - ramp  # the share of the original frequency
    inv = (1.0 / (factor * pos_freqs)) * (1 - extrapolation) + (1.0 / pos_freqs) * extrapolation
    return inv, float(attention)


class RotaryEmbedding(nn.Module):
    """Applies rotary embedding to q and k given absolute positions; cos/sin come from a cached table."""

    def __init__(self, head_dim: int, max_positions: int, params: dict[str, Any]) -> None:
        super().__init__()
        self.head_dim, self.max_positions, self.params = head_dim, max_positions, dict(params)
        cos, sin = self._compute()
        self.rotary_dim = cos.shape[-1]
        self.cos: torch.Tensor
        self.sin: torch.Tensor
        self.register_buffer("cos", cos, persistent=False)  # (max_positions, rotary_dim) float32
        self.register_buffer("sin", sin, persistent=False)
        self._tables: tuple[torch.Tensor, torch.Tensor] | None = None

    def _compute(self) -> tuple[torch.Tensor, torch.Tensor]:
        """The float32 cos/sin tables (max_positions, rotary_dim), on the current default device."""
        inv, scale = inv_frequencies(self.head_dim, self.params)
        pos = torch.arange(self.max_positions, dtype=torch.int64).float()
        freqs = pos[:, None] * inv[None, :]  # (max_positions, rotary_dim/2)
        emb = torch.cat((freqs, freqs), dim=-1)
        return emb.cos() * scale, emb.sin() * scale

    def materialize(self, device: torch.device) -> None:
        """Recompute the tables in float32 on ``device``: a model built on the meta device has none, and a
        model cast to a lower precision keeps its positions exact this way."""
        with torch.device("cpu"):
            cos, sin = self._compute()
        self.cos, self.sin = cos.to(device), sin.to(device)
        self._tables = None

    def tables(self, dtype: torch.dtype) -> tuple[torch.Tensor, torch.Tensor]:
        """The whole cos/sin tables in ``dtype`` (for the CPU kernels), converted once and kept."""
        if self._tables is None or self._tables[0].dtype != dtype:
            self._tables = (self.cos.to(dtype).contiguous(), self.sin.to(dtype).contiguous())
        return self._tables

    def cos_sin(self, positions: torch.Tensor, dtype: torch.dtype) -> tuple[torch.Tensor, torch.Tensor]:
        """The tables' rows for ``positions`` (T,), as (T, 1, rotary_dim) in ``dtype``: once per forward."""
        return self.cos[positions].to(dtype).unsqueeze(1), self.sin[positions].to(dtype).unsqueeze(1)

    def forward(
        self, q: torch.Tensor, k: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor
    ) -> tuple[torch.Tensor, torch.Tensor]:
        # q (T, Hq, D), k (T, Hk, D), cos/sin (T, 1, rotary_dim) from cos_sin()
        return _rotate(q, cos, sin, self.rotary_dim), _rotate(k, cos, sin, self.rotary_dim)

    def rotate(self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
        """One tensor (T, H, D) rotated (the queries of a layer that reads another's rotated keys)."""
        return _rotate(x, cos, sin, self.rotary_dim)


def _rotate(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, rd: int) -> torch.Tensor:
    if rd < x.shape[-1]:
        xr, xp = x[..., :rd], x[..., rd:]
        return torch.cat((_rotate(xr, cos, sin, rd), xp), dim=-1)
    half = x.shape[-1] // 2
    rotated = torch.cat((-x[..., half:], x[..., :half]), dim=-1)
    return x * cos + rotated * sin
