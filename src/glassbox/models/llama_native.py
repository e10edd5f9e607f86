"""The Llama-family forward on glassbox's CPU kernels (kernels/cpu_ops.py) around the model's own linears.

Applied to a built model (as quantization and weight packing are): :func:`bind` returns a forward with
the model's signature that the executor calls instead of the model. Same math as ``LlamaModel.forward``
with the PyTorch ops, arranged for a CPU decode step: each residual
add is fused with the next norm (x += sublayer(h); h = norm(x)), q/k norm, rotary and the cache write are
one call, decode rows attend through the block tables, and the linears are called as bound methods (no
module hooks or attribute lookups on the hot path). Prefill rows still use PyTorch's SDPA. A layer whose
FFN is routed experts (models/moe.py) calls that block's own forward between the kernels.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import torch
import torch.nn.functional as F

from glassbox.kernels import cpu_ops
from glassbox.kernels.cpu_prefill import prefill_attention_bf16
from glassbox.layers.attention import AttentionMetadata, prefill_attention
from glassbox.layers.kv_quant import KV8_DTYPES
from glassbox.models.llama import LlamaDecoderLayer, LlamaForCausalLM, LlamaMLP
from glassbox.models.llama_burst import DecodeBurst, bind_burst
from glassbox.models.llama_step import DecodeStep, bind_step
from glassbox.quant.blocks.linear import kernel_chosen

Fn = Callable[[torch.Tensor], torch.Tensor]


@dataclass
class LayerOps:
    in_norm: cpu_ops.AddRMSNorm
    qkv: Fn
    attn: cpu_ops.PagedAttention
    o_proj: Fn
    post_norm: cpu_ops.AddRMSNorm
    gate_up: Fn | None
    act_mul: Fn | None  # (T, 2I) [gate | up] -> (T, I)
    down: Fn | None
    moe: Fn | None = None  # a routed-experts FFN (models/moe.py) in place of gate_up/act_mul/down


@dataclass
class NativeForward:
    """The model's forward on the kernels, bound to its weights and to one set of KV caches."""

    embed: Fn
    kv_caches: list[torch.Tensor]
    layers: list[LayerOps]
    final_norm: cpu_ops.AddRMSNorm
    step: DecodeStep | None = None  # decode-only steps in one native call (all linears block weights)
    burst: DecodeBurst | None = None  # several greedy decode steps in one native call (over ``step``)

    def __call__(
        self,
        input_ids: torch.Tensor,  # (T,)
        positions: torch.Tensor,  # (T,)
        kv_caches: list[torch.Tensor],
        meta: AttentionMetadata,
    ) -> torch.Tensor:  # (T, hidden)
        assert kv_caches is self.kv_caches, "bound to other caches"
        return forward(self, self.embed(input_ids), positions, meta)


def _torch_act_mul(act: Fn, inter: int) -> Fn:
    def act_mul(gate_up: torch.Tensor) -> torch.Tensor:
        gate, up = gate_up.split(inter, dim=-1)
        return act(gate) * up

    return act_mul


def bind(lm: LlamaForCausalLM, kv_caches: list[torch.Tensor], dtype: torch.dtype) -> NativeForward:
    """Every layer's kernels bound to its weights and cache; ValueError for what the kernels cannot run."""
    model = lm.model
    tables = model.rotary_emb.tables(dtype)
    layers = []
    for layer, cache in zip(model.layers, kv_caches, strict=True):
        assert isinstance(layer, LlamaDecoderLayer)
        attn, mlp = layer.self_attn, layer.mlp
        if attn.qkv_proj is None or (isinstance(mlp, LlamaMLP) and mlp.gate_up_proj is None):
            raise ValueError("the kernels need fused q/k/v and gate/up projections (LlamaForCausalLM.fuse)")
        inorm, post = layer.input_layernorm, layer.post_attention_layernorm
        qn = None if attn.q_norm is None else attn.q_norm.weight.detach()
        kn = None if attn.k_norm is None else attn.k_norm.weight.detach()
        eps = 0.0 if attn.q_norm is None else attn.q_norm.eps
        gate_up = act_mul = down = moe = None
        if isinstance(mlp, LlamaMLP):
            assert mlp.gate_up_proj is not None
            gate_up, down = mlp.gate_up_proj.forward, mlp.down_proj.forward
            silu = mlp.act is F.silu
            act_mul = (
                cpu_ops.SiluMul(mlp.intermediate, dtype)
                if silu
                else _torch_act_mul(mlp.act, mlp.intermediate)
            )
        else:  # routed experts: the block's own forward (router, grouped expert GEMMs, shared expert)
            moe = mlp.forward
        layers.append(
            LayerOps(
                in_norm=cpu_ops.AddRMSNorm(inorm.weight.detach(), inorm.eps),
                qkv=attn.qkv_proj.forward,
                attn=cpu_ops.PagedAttention(
                    attn.num_heads, cache, tables, qn, kn, eps, attn.scale, attn.sliding_window, attn.sinks
                ),
                o_proj=attn.o_proj.forward,
                post_norm=cpu_ops.AddRMSNorm(post.weight.detach(), post.eps),
                gate_up=gate_up,
                act_mul=act_mul,
                down=down,
                moe=moe,
            )
        )
    final = cpu_ops.AddRMSNorm(model.norm.weight.detach(), model.norm.eps)
    step = bind_step(lm, [(lo.attn, lo.in_norm, lo.post_norm) for lo in layers], final)
    burst = bind_burst(lm, step, layers[0].attn)
    return NativeForward(model.embed_tokens.forward, kv_caches, layers, final, step, burst)


def forward(
    ops: NativeForward, x: torch.Tensor, positions: torch.Tensor, meta: AttentionMetadata
) -> torch.Tensor:  # (T, hidden): the final norm's output
    """x: the embedded tokens (T, hidden), used as the residual stream (updated in place)."""
    a0 = ops.layers[0].attn
    cpu_ops.check_step(
        positions, meta.slot_mapping, a0.max_positions, a0.num_blocks * a0.bs,
        meta.decode_block_tables, meta.decode_context_lens, a0.num_blocks, a0.bs,
    )  # fmt: skip
    t, nd = x.shape[0], meta.num_decode
    tables, lens = meta.decode_block_tables, meta.decode_context_lens
    if ops.step is not None and nd == t and tables is not None and lens is not None and kernel_chosen(t):
        return ops.step(x, positions, meta.slot_mapping, tables, lens)  # the block linears' kernel rows
    h = torch.empty_like(x)
    ops.layers[0].in_norm(x, None, h)
    nexts = [lo.in_norm for lo in ops.layers[1:]] + [ops.final_norm]
    for lo, next_norm in zip(ops.layers, nexts, strict=True):
        qkv = lo.qkv(h)  # (T, (hq + 2 hk) d)
        lo.attn.rope_store(qkv, positions, meta.slot_mapping)
        o = torch.empty(t, lo.attn.hq * lo.attn.d, dtype=qkv.dtype)
        if nd:
            assert tables is not None and lens is not None
            lo.attn.decode(qkv, tables, lens, o)
        if meta.prefills:
            _prefill(lo, qkv, o, meta)
        lo.post_norm(x, lo.o_proj(o), h)
        if lo.moe is not None:
            next_norm(x, lo.moe(h), h)
        else:
            assert lo.down is not None and lo.act_mul is not None and lo.gate_up is not None
            next_norm(x, lo.down(lo.act_mul(lo.gate_up(h))), h)
    return h


def _prefill(lo: LayerOps, qkv: torch.Tensor, o: torch.Tensor, meta: AttentionMetadata) -> None:
    """The prefill rows' attention (their k/v already in the cache): tiled bf16 GEMMs around a native
    softmax for bf16 (over a bf16 or 8-bit cache), PyTorch SDPA for float32."""
    hq, hk, d, t = lo.attn.hq, lo.attn.hk, lo.attn.d, qkv.shape[0]
    q = qkv[:, : hq * d].unflatten(1, (hq, d))
    k = qkv[:, hq * d : (hq + hk) * d].unflatten(1, (hk, d))
    v = qkv[:, (hq + hk) * d :].unflatten(1, (hk, d))
    out = o.view(t, hq, d)
    window, sinks = lo.attn.window or None, lo.attn.sinks
    if qkv.dtype == torch.bfloat16 and lo.attn.kv_cache.dtype in (torch.bfloat16, *KV8_DTYPES):
        prefill_attention_bf16(q, k, v, lo.attn.kv_cache, meta.prefills, lo.attn.scale, window, out, sinks)
    else:  # float32: SDPA (or with sinks its explicit softmax), the reference's own attention
        prefill_attention(q, k, v, lo.attn.kv_cache, meta.prefills, lo.attn.scale, window, out, sinks)
