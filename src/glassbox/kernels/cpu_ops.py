"""The C kernels (native.py) as callables with one layer's static arguments bound and checked once.

A decode step calls them ~6 times per layer, so per call they check only what is new each step (the
fresh activation tensors' dtype, contiguity and width); weights, caches and tables are checked here at
binding, and index values (positions, slots, block tables) once per step by ``check_step`` below.
"""

from __future__ import annotations

import ctypes

import torch

from glassbox.kernels.native import DTYPE_CODES, KV8_CODES, MAX_ROW, library
from glassbox.layers.kv_quant import row_width


def lib() -> ctypes.CDLL:
    lib = library()
    if lib is None:
        raise RuntimeError("glassbox's CPU kernels are not built (no C compiler, or the build failed)")
    return lib


def _static(t: torch.Tensor, dtype: torch.dtype, shape: tuple[int, ...]) -> int:
    """A bound tensor: on CPU, contiguous, of ``dtype`` and ``shape``; returns its address."""
    if t.device.type != "cpu" or not t.is_contiguous() or t.dtype != dtype or tuple(t.shape) != shape:
        raise ValueError(
            f"expected a contiguous CPU {dtype} tensor of shape {shape}, got {t.dtype} {t.shape}"
        )
    return int(t.data_ptr())


def _fresh(t: torch.Tensor, dtype: torch.dtype, width: int) -> int:
    """A step's activation: 2-D, contiguous, ``dtype``, rows of ``width``; returns its address."""
    if t.dtype != dtype or t.dim() != 2 or t.shape[1] != width or not t.is_contiguous():
        raise ValueError(f"expected contiguous (T, {width}) {dtype}, got {t.dtype} {tuple(t.shape)}")
    return int(t.data_ptr())


class AddRMSNorm:
    """x += residual (rounded as the reference); out = RMSNorm(x) * weight. Rows of ``weight``'s size."""

    def __init__(self, weight: torch.Tensor, eps: float) -> None:
        self.weight, self.eps, self.dim, self.dtype = weight, eps, weight.shape[0], weight.dtype
        if self.dim > MAX_ROW or weight.dtype not in DTYPE_CODES:
            raise ValueError(f"RMSNorm of {self.dim} {weight.dtype} values is not supported by the kernels")
        self.w = _static(weight, weight.dtype, (self.dim,))
        self.dt = DTYPE_CODES[weight.dtype]
        self.fn = lib().gb_add_rms_norm

    def __call__(self, x: torch.Tensor, residual: torch.Tensor | None, out: torch.Tensor) -> None:
        xp, op = _fresh(x, self.dtype, self.dim), _fresh(out, self.dtype, self.dim)
        rp = None
        if residual is not None:
            rp = _fresh(residual, self.dtype, self.dim)
            if residual.shape[0] != x.shape[0]:
                raise ValueError("residual rows differ from x's")
        if out.shape[0] != x.shape[0]:
            raise ValueError("out rows differ from x's")
        self.fn(xp, rp, self.w, op, x.shape[0], self.dim, self.eps, self.dt, torch.get_num_threads())


class SiluMul:
    """(T, 2I) [gate | up] -> (T, I) silu(gate) * up."""

    def __init__(self, intermediate: int, dtype: torch.dtype) -> None:
        if intermediate > MAX_ROW or dtype not in DTYPE_CODES:
            raise ValueError(f"silu*mul of {intermediate} {dtype} values is not supported by the kernels")
        self.inter, self.dtype, self.dt = intermediate, dtype, DTYPE_CODES[dtype]
        self.fn = lib().gb_silu_mul

    def __call__(self, gate_up: torch.Tensor) -> torch.Tensor:
        gp = _fresh(gate_up, self.dtype, 2 * self.inter)
        out = torch.empty(gate_up.shape[0], self.inter, dtype=self.dtype)
        self.fn(gp, out.data_ptr(), gate_up.shape[0], self.inter, self.dt, torch.get_num_threads())
        return out


class PagedAttention:
    """One layer's attention kernels over its paged KV cache (2, num_blocks, block_size, Hk, W): W = D in the
    model's dtype, or D + 4 for an 8-bit cache (layers/kv_quant.py).

    ``rope_store``: rows [q | k | v] of a fused qkv projection get q/k RMSNorm (when given) and rotary
    in place, and k/v are written to their cache slots. ``decode``: one query row per sequence attends
    over its blocks, read through the block table. ``sinks``: a logit per query head that joins each
    softmax's denominator (gpt-oss), kept in float32.
    """

    def __init__(
        self,
        num_heads: int,
        kv_cache: torch.Tensor,
        tables: tuple[torch.Tensor, torch.Tensor],  # rotary cos/sin (max_positions, rotary_dim)
        q_norm: torch.Tensor | None,
        k_norm: torch.Tensor | None,
        eps: float,
        scale: float,
        sliding_window: int | None,
        sinks: torch.Tensor | None = None,  # (num_heads,)
    ) -> None:
        _, nb, bs, hk, w = kv_cache.shape
        dtype = tables[0].dtype  # the model's: q/k/v rows, rotary tables, norms
        self.kv8 = KV8_CODES.get(kv_cache.dtype, 0)
        d = w - (row_width(0, kv_cache.dtype) if self.kv8 else 0)
        if (
            dtype not in DTYPE_CODES
            or (kv_cache.dtype != dtype and not self.kv8)
            or d > MAX_ROW
            or bs > MAX_ROW
            or num_heads % hk
        ):
            raise ValueError(
                f"attention of {num_heads}/{hk} heads of {d} {dtype} over a {kv_cache.dtype} cache is not supported"
            )
        self.hq, self.hk, self.d, self.bs, self.num_blocks = num_heads, hk, d, bs, nb
        self.dtype, self.dt = dtype, DTYPE_CODES[dtype]
        self.width = (num_heads + 2 * hk) * d
        self.kv_cache, self.tables = kv_cache, tables
        self.k_ptr = _static(kv_cache, kv_cache.dtype, tuple(kv_cache.shape))
        self.v_ptr = int(kv_cache[1].data_ptr())
        rd = tables[0].shape[1]
        if rd > d or rd % 2:
            raise ValueError(f"rotary dim {rd} does not fit head dim {d}")
        self.cos = _static(tables[0], dtype, tuple(tables[0].shape))
        self.sin = _static(tables[1], dtype, tuple(tables[0].shape))
        self.rd, self.max_positions = rd, tables[0].shape[0]
        if (q_norm is None) != (k_norm is None):
            raise ValueError("q_norm and k_norm come together")
        self.norms = (q_norm, k_norm)  # kept alive with the cache and tables, as their addresses are held
        self.qn = None if q_norm is None else _static(q_norm, dtype, (d,))
        self.kn = None if k_norm is None else _static(k_norm, dtype, (d,))
        self.eps, self.scale, self.window = eps, scale, sliding_window or 0
        self.sinks = None if sinks is None else sinks.detach().float().contiguous()
        self.sinks_ptr = None if self.sinks is None else _static(self.sinks, torch.float32, (num_heads,))
        kernels = lib()
        self.rope_fn, self.decode_fn = kernels.gb_qkv_rope_store, kernels.gb_decode_attention

    def rope_store(self, qkv: torch.Tensor, positions: torch.Tensor, slots: torch.Tensor) -> None:
        """Index values must have passed ``check_step`` for this step."""
        qp = _fresh(qkv, self.dtype, self.width)
        t = qkv.shape[0]
        if positions.shape != (t,) or slots.shape != (t,):
            raise ValueError("positions and slots need one entry per qkv row")
        self.rope_fn(
            qp, t, self.width, self.hq, self.hk, self.d, self.qn, self.kn, self.eps, self.cos, self.sin,
            self.rd, positions.data_ptr(), self.k_ptr, self.v_ptr, slots.data_ptr(), self.dt, self.kv8,
            torch.get_num_threads(),
        )  # fmt: skip

    def decode(
        self,
        qkv: torch.Tensor,  # rows [0, nd) hold the decoding sequences' q heads first
        block_tables: torch.Tensor,  # (nd, max_blocks) int64, checked by check_step
        context_lens: torch.Tensor,  # (nd,) int64
        out: torch.Tensor,  # (>= nd, hq * d): rows [0, nd) written
    ) -> None:
        nd, max_blocks = block_tables.shape
        qp, op = _fresh(qkv, self.dtype, self.width), _fresh(out, self.dtype, self.hq * self.d)
        if nd == 0:
            return
        if qkv.shape[0] < nd or out.shape[0] < nd or context_lens.shape != (nd,):
            raise ValueError("decode rows, block tables and context lengths disagree")
        self.decode_fn(
            qp, self.width, self.k_ptr, self.v_ptr, block_tables.data_ptr(), max_blocks,
            context_lens.data_ptr(), nd, self.hq, self.hk, self.d, self.bs, self.scale, self.window,
            self.sinks_ptr, op, self.dt, self.kv8, torch.get_num_threads(),
        )  # fmt: skip


def check_step(
    positions: torch.Tensor,
    slots: torch.Tensor,
    table_len: int,
    cache_slots: int,
    block_tables: torch.Tensor | None,
    context_lens: torch.Tensor | None,
    num_blocks: int,
    block_size: int,
) -> None:
    """The index tensors the kernels trust, checked once per forward: a bad value would read out of bounds."""
    index = [positions, slots] + [t for t in (block_tables, context_lens) if t is not None]
    for t in index:
        if t.dtype != torch.int64 or not t.is_contiguous() or t.device.type != "cpu":
            raise ValueError(f"index tensors must be contiguous CPU int64, got {t.dtype} {tuple(t.shape)}")
    if positions.numel():
        if int(positions.min()) < 0 or int(positions.max()) >= table_len:
            raise ValueError(f"positions outside the rotary table of {table_len}")
        if int(slots.min()) < 0 or int(slots.max()) >= cache_slots:
            raise ValueError(f"KV slots outside the cache of {cache_slots}")
    if block_tables is not None and context_lens is not None and block_tables.numel():
        if int(block_tables.min()) < 0 or int(block_tables.max()) >= num_blocks:
            raise ValueError(f"block table entries outside the cache of {num_blocks} blocks")
        if int(context_lens.min()) < 1 or int(context_lens.max()) > block_tables.shape[1] * block_size:
            raise ValueError("decode context lengths outside their block tables")
