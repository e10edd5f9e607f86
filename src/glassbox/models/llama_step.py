"""A decode step of the whole Llama layer stack in one native call (kernels/cpu_step.c), for models whose
linears are all block weights (GGUF Q4_0/Q4_1/Q8_0 and the K-quants Q4_K/Q5_K/Q6_K, ``--quantization
int4|int8``, GPTQ/AWQ without act-order: the default model's case) or bf16 weights in glassbox's tiles
(quant/dense/bf16_tiles.py: dense bf16 models on a CPU with AVX-512 BF16). A q/k/v whose parts cannot share one
weight (a Q4_K_M file's Q6_K attn_v beside Q4_K q and k: a ConcatLinear) runs as its parts.

The per-op forward (models/llama_native.py) calls ~10 kernels per layer from Python, 5-20 us each of
ctypes, allocation and checks: on SmolLM2-135M's 30 thin layers that is a quarter of a batch-1 step. The
step here chains the same kernels in the same order in C, so its output is the per-op forward's, bit for
bit (tests/kernels/test_native_step.py). Everything static (weights, norms, caches, rotary tables) is checked and
laid out once, at binding, in ctypes structures that mirror cpu_step.c's; a step passes only its
activations and index tensors (checked by ``cpu_ops.check_step`` in the caller).
"""

from __future__ import annotations

import ctypes

import torch
import torch.nn.functional as F

from glassbox.kernels import cpu_ops
from glassbox.models.llama import LlamaDecoderLayer, LlamaForCausalLM, LlamaMLP
from glassbox.quant.blocks.kquant import KQuantWeights
from glassbox.quant.blocks.linear import BlockQuantLinear
from glassbox.quant.blocks.weights import BlockWeights
from glassbox.quant.dense.bf16_tiles import TiledBf16Linear
from glassbox.quant.dense.onednn import ConcatLinear

_P, _I, _F, _C = ctypes.c_void_p, ctypes.c_int64, ctypes.c_float, ctypes.c_int


class StepLinear(ctypes.Structure):
    _fields_ = [
        ("codes", _P), ("scales", _P), ("offsets", _P), ("zeros", _P), ("bias", _P),
        ("n", _I), ("k", _I), ("kp", _I), ("offset_factor", _F), ("bits", _C), ("kind", _C),
    ]  # fmt: skip


class _Layer(ctypes.Structure):
    _fields_ = [
        ("in_norm", _P), ("post_norm", _P), ("q_norm", _P), ("k_norm", _P), ("k_cache", _P), ("v_cache", _P),
        ("sinks", _P), ("qkv", StepLinear), ("o", StepLinear), ("gate_up", StepLinear), ("down", StepLinear),
        ("window", _I), ("in_eps", _F), ("post_eps", _F), ("qk_eps", _F),
        ("qkv_k", StepLinear), ("qkv_v", StepLinear), ("qkv_parts", _I),
    ]  # fmt: skip


class _Model(ctypes.Structure):
    _fields_ = [
        ("layers", _I), ("hidden", _I), ("inter", _I), ("hq", _I), ("hk", _I), ("d", _I), ("bs", _I), ("rd", _I),
        ("cos_t", _P), ("sin_t", _P), ("final_norm", _P),
        ("final_eps", _F), ("scale", _F), ("dt", _C), ("kv8", _C),
    ]  # fmt: skip


def step_linear(module: object, k: int) -> StepLinear | None:
    """A block-weight, K-quant or bf16-tiles linear as cpu_step.c reads it; None for any other linear (or
    act-order blocks)."""
    if isinstance(module, TiledBf16Linear) and module.in_features == k:
        tiles, bias_f32 = module.pointers()
        return StepLinear(tiles, None, None, None, bias_f32, module.out_features, k, k, 0.0, 0, 16)
    if not isinstance(module, BlockQuantLinear) or module.w.perm is not None or module.in_features != k:
        return None
    bias = None if module.bias is None else module.bias.data_ptr()
    w, n = module.w, module.out_features
    if isinstance(w, KQuantWeights):  # its meta bytes where block weights have their scales
        return StepLinear(w.codes.data_ptr(), w.meta.data_ptr(), None, None, bias, n, k, k, 0.0, 0, w.kind)
    return block_linear(w, bias) if isinstance(w, BlockWeights) else None


def block_linear(w: BlockWeights, bias: int | None = None) -> StepLinear:
    """Block weights (rows in tiles, quant/blocks/weights.py) as cpu_step.c reads a linear."""
    codes, scales, offsets, zeros, factor = w.pointers()
    return StepLinear(
        codes, scales, offsets, zeros, bias, w.out_features, w.in_features, w.padded, factor, w.kernel_bits, 0
    )


def _qkv(module: object, k: int) -> list[StepLinear] | None:
    """The fused q/k/v as one linear, or its parts (a ConcatLinear of q, k, v); None if any is not one."""
    parts = list(module.parts) if isinstance(module, ConcatLinear) else [module]
    linears = [step_linear(p, k) for p in parts]
    if len(linears) not in (1, 3) or any(lin is None for lin in linears):
        return None
    return [lin for lin in linears if lin is not None]


class DecodeStep:
    """The layer stack's decode step bound to its weights, norms and caches (kept alive here)."""

    def __init__(self, model: _Model, layers: ctypes.Array[_Layer], keep: list[object]) -> None:
        self.model, self.layers, self._keep = model, layers, keep
        self.width = (model.hq + 2 * model.hk) * model.d
        # per row: qkv, attention output, gate|up, activation, one hidden row for the linears' outputs
        self.scratch_row = self.width + model.hq * model.d + 3 * model.inter + model.hidden
        self.dtype = torch.bfloat16 if model.dt else torch.float32
        self.fn = cpu_ops.lib().gb_decode_step

    def __call__(
        self,
        x: torch.Tensor,  # (T, hidden): the embedded tokens, updated in place (the residual stream)
        positions: torch.Tensor,
        slots: torch.Tensor,
        block_tables: torch.Tensor,  # (T, max_blocks): every row decodes
        context_lens: torch.Tensor,
    ) -> torch.Tensor:  # (T, hidden): the final norm's output
        """Index tensors must have passed ``cpu_ops.check_step`` for this step."""
        t, hidden = x.shape
        if x.dtype != self.dtype or not x.is_contiguous() or hidden != self.model.hidden:
            raise ValueError(
                f"expected contiguous (T, {hidden}) {self.dtype}, got {x.dtype} {tuple(x.shape)}"
            )
        if block_tables.shape[0] != t or any(a.shape != (t,) for a in (context_lens, positions, slots)):
            raise ValueError("a native decode step needs one decoding sequence per row")
        h = torch.empty_like(x)
        scratch = torch.empty(t * self.scratch_row, dtype=self.dtype)
        self.fn(
            ctypes.byref(self.model), self.layers, x.data_ptr(), h.data_ptr(), t, positions.data_ptr(),
            slots.data_ptr(), block_tables.data_ptr(), block_tables.shape[1], context_lens.data_ptr(),
            scratch.data_ptr(), torch.get_num_threads(),
        )  # fmt: skip
        return h


Bound = tuple[cpu_ops.PagedAttention, cpu_ops.AddRMSNorm, cpu_ops.AddRMSNorm]  # attention, in/post norms


def bind_step(lm: LlamaForCausalLM, bound: list[Bound], final: cpu_ops.AddRMSNorm) -> DecodeStep | None:
    """The one-call decode step over the per-op forward's bound kernels (per layer: attention, input and
    post-attention norms), or None when some layer is not a dense SiLU MLP over block-weight, K-quant or
    bf16-tiles linears, or the model is not bf16 (a float32 model's block linears run dequantized, in float32:
    quant/blocks/linear.py)."""
    model = lm.model
    a0 = bound[0][0]
    if a0.dtype != torch.bfloat16:
        return None
    hidden = model.norm.weight.shape[0]
    rows: list[_Layer] = []
    keep: list[object] = [final]
    inter = None
    for layer, (attn, inorm, post) in zip(model.layers, bound, strict=True):
        assert isinstance(layer, LlamaDecoderLayer)
        sa, mlp = layer.self_attn, layer.mlp
        if not isinstance(mlp, LlamaMLP) or mlp.act is not F.silu or (inter not in (None, mlp.intermediate)):
            return None
        inter = mlp.intermediate
        qkv = _qkv(sa.qkv_proj, hidden)
        parts = (
            step_linear(sa.o_proj, a0.hq * a0.d),
            step_linear(mlp.gate_up_proj, hidden),
            step_linear(mlp.down_proj, inter),
        )
        same_shape = (attn.hq, attn.hk, attn.d, attn.bs, attn.kv8) == (a0.hq, a0.hk, a0.d, a0.bs, a0.kv8)
        if qkv is None or any(p is None for p in parts) or not same_shape:
            return None
        if sum(lin.n for lin in qkv) != (a0.hq + 2 * a0.hk) * a0.d:
            return None
        o, gate_up, down = parts
        assert o is not None and gate_up is not None and down is not None
        k_part, v_part = (qkv[1], qkv[2]) if len(qkv) == 3 else (StepLinear(), StepLinear())
        keep += [inorm, post, attn]
        rows.append(
            _Layer(
                inorm.w,
                post.w,
                attn.qn,
                attn.kn,
                attn.k_ptr,
                attn.v_ptr,
                attn.sinks_ptr,
                qkv[0],
                o,
                gate_up,
                down,
                attn.window,
                inorm.eps,
                post.eps,
                attn.eps,
                k_part,
                v_part,
                len(qkv),
            )  # fmt: skip
        )
    assert inter is not None
    spec = _Model(
        len(rows), hidden, inter, a0.hq, a0.hk, a0.d, a0.bs, a0.rd, a0.cos, a0.sin, final.w,
        final.eps, a0.scale, a0.dt, a0.kv8,
    )  # fmt: skip
    return DecodeStep(spec, (_Layer * len(rows))(*rows), keep)
