"""The routed mixture-of-experts FFN (Mixtral, Qwen2-MoE, Qwen3-MoE, gpt-oss) with Hugging Face names.

A router linear picks each token's top-k experts: softmax over all experts in float32, top-k (ties as
``torch.topk`` breaks them), the k weights renormalized to sum to 1 where the family does so (Mixtral
always, which equals a softmax over the top-k logits; Qwen2/3-MoE iff ``norm_topk_prob``); or, for
gpt-oss (router "topk_softmax"), top-k of the logits and a softmax over those k. The experts are gated
MLPs held fused for execution: one (E, 2I, H) gate_up tensor and one (E, H, I) down tensor (transformers
5's own layout; checkpoints that store one tensor per expert are loaded into their rows,
:func:`checkpoint_slot`), optionally with biases (gpt-oss). An expert's activation (a ``Glu``) takes its
gate_up rows to I values: ``act(gate) * up`` over [gate | up] halves, or gpt-oss's clamped SwiGLU over
interleaved [g0, u0, g1, u1, ...] rows (:class:`ClampedSwiGLU`). Qwen2-MoE adds a shared expert that
every token runs, scaled by sigmoid(``shared_expert_gate``(x)).

Execution is grouped (:meth:`MoEExperts.grouped`): the (token, choice) pairs sorted by expert, each
expert that some token chose runs its two GEMMs once on its gathered rows, and the rows go back weighted
by their routing weights (one ``index_add_``). A batch-1 decode step thus reads k experts' weights, not E.
On CUDA with triton the forward runs the fused kernels instead (models/moe_triton.py: no host read of the
counts, eager and in CUDA graphs; experts in blocks too). :meth:`MoEExperts.dense` runs every expert on every row (no
data-dependent shapes) and :meth:`MoEExperts.reference` one (token, choice) at a time (for tests).
"""

from __future__ import annotations

import re
from collections.abc import Callable
from typing import TYPE_CHECKING

import torch
import torch.nn.functional as F
from torch import nn

from glassbox.layers.activation import get_activation
from glassbox.quant.held_experts import ExpertSlice, HeldExperts, kept_linear, kept_slice, linear_bytes

if TYPE_CHECKING:
    from glassbox.quant.blocks.moe_stack import StackedExperts
    from glassbox.quant.held_experts import Quantize


class RouterLinear(nn.Linear):
    """A router (or shared-expert gate) linear. A subclass so that oneDNN packing and ``--quantization``
    (which replace exactly ``nn.Linear``) leave it in the model's dtype: routing stays as trained."""


ROUTERS = ("softmax_topk", "topk_softmax")
FusedForward = Callable[["MoEExperts", torch.Tensor, torch.Tensor, torch.Tensor], torch.Tensor]
# an expert's activation: its gate_up rows (..., 2I) -> (..., I)
Glu = Callable[[torch.Tensor], torch.Tensor]


class Gated:
    """``act(gate) * up`` over rows holding [gate | up]; ``act`` is the config's name (the fused CUDA
    kernels read it)."""

    def __init__(self, act: str) -> None:
        self.act, self.fn = act, get_activation(act)

    def __call__(self, gate_up: torch.Tensor) -> torch.Tensor:
        gate, up = gate_up.chunk(2, dim=-1)
        return self.fn(gate) * up


def gated(act: str) -> Glu:
    """``act(gate) * up`` over rows holding [gate | up]."""
    return Gated(act)


class ClampedSwiGLU:
    """gpt-oss's expert activation over interleaved rows [g0, u0, g1, u1, ...] (or, not ``interleaved``,
    [gate | up] halves), as transformers computes it: g = min(gate, limit), u = clamp(up, -limit, limit),
    out = (u + 1) * g * sigmoid(alpha * g)."""

    def __init__(self, alpha: float, limit: float, interleaved: bool = True) -> None:
        self.alpha, self.limit, self.interleaved = alpha, limit, interleaved

    def __call__(self, gate_up: torch.Tensor) -> torch.Tensor:
        if self.interleaved:
            gate, up = gate_up[..., ::2], gate_up[..., 1::2]
        else:
            gate, up = gate_up.chunk(2, dim=-1)
        gate = gate.clamp(max=self.limit)
        up = up.clamp(min=-self.limit, max=self.limit)
        return (up + 1) * (gate * torch.sigmoid(gate * self.alpha))


def route(
    logits: torch.Tensor, top_k: int, renormalize: bool, router: str = "softmax_topk"
) -> tuple[torch.Tensor, torch.Tensor]:
    """(weights (T, k) float32, expert ids (T, k) int64) from router logits (T, E), as transformers does:
    softmax in float32, ``torch.topk`` (ties to the lower id), renormalized over the k where asked; or
    with ``router`` "topk_softmax", ``torch.topk`` of the logits and a softmax over those k."""
    if router == "topk_softmax":
        top, ids = torch.topk(logits, top_k, dim=-1)
        return torch.softmax(top, dim=-1, dtype=torch.float32), ids
    probs = torch.softmax(logits, dim=-1, dtype=torch.float32)
    weights, ids = torch.topk(probs, top_k, dim=-1)
    if renormalize:
        weights = weights / weights.sum(dim=-1, keepdim=True)
    return weights, ids


def gate_up_rows(glu: Glu, inter: int) -> tuple[slice, slice]:
    """Where ``glu`` reads the gate and the up rows of a (2I) gate_up."""
    if isinstance(glu, ClampedSwiGLU) and glu.interleaved:
        return slice(0, 2 * inter, 2), slice(1, 2 * inter, 2)
    return slice(0, inter), slice(inter, 2 * inter)


def as_halves(glu: Glu) -> Glu:
    """``glu`` reading [gate | up] halves (what a gate_up held as two stacked matrices computes)."""
    return ClampedSwiGLU(glu.alpha, glu.limit, interleaved=False) if isinstance(glu, ClampedSwiGLU) else glu


class MoEExperts(nn.Module):
    """E gated MLPs: ``gate_up_proj`` (E, 2I, H) holds each expert's gate and up rows (in the order its
    ``glu`` reads them), ``down_proj`` (E, H, I); with ``bias``, ``gate_up_proj_bias`` (E, 2I) and
    ``down_proj_bias`` (E, H).

    Once the checkpoint is loaded each expert may run as a pair of linears (``linears``): its matrices kept
    as stored (``hold`` before the load, built by ``fuse`` after it, biases included; on CUDA stacked for
    the fused block MoE), or packed for the CPU by ``pack_weights`` (bf16); the float parameters freed."""

    def __init__(self, num_experts: int, hidden: int, inter: int, glu: Glu, bias: bool = False) -> None:
        super().__init__()
        self.num_experts, self.inter = num_experts, inter
        self.gate_up_proj = nn.Parameter(torch.empty(num_experts, 2 * inter, hidden))
        self.down_proj = nn.Parameter(torch.empty(num_experts, hidden, inter))
        self.gate_up_proj_bias = nn.Parameter(torch.empty(num_experts, 2 * inter)) if bias else None
        self.down_proj_bias = nn.Parameter(torch.empty(num_experts, hidden)) if bias else None
        self.glu = glu
        self.held: HeldExperts | None = None  # matrices kept as stored, until fuse() builds their linears
        # per expert (gate_up, down) linears, and what reads gate_up's output; registered (flat) in ``kept``
        self.linears: list[tuple[nn.Module, nn.Module]] = []
        self.linear_glu = glu
        self.kept = nn.ModuleList()
        self.experts_read = 0  # experts whose weights a forward ran, summed over forwards (trace.py reads it)
        self.bytes_read = 0  # their weights' bytes as held
        self._bytes: list[int] = []  # each expert's bytes as held, once it runs as linears
        # CUDA with triton: models/moe_triton.use_triton_experts sets a device counter (int64) of the experts
        # the fused kernels read (the forward then runs them), and experts in blocks stacked (quant/blocks/moe_stack.py)
        self.fused: torch.Tensor | None = None
        self.fused_forward: FusedForward | None = None  # its forward then (moe_triton.py fused_forward)
        self.blocks: StackedExperts | None = None

    def hold(self, held: HeldExperts) -> None:
        """Keep the experts' matrices ``held`` as stored; the float parameters they replace are freed (the
        checkpoint then loads the rest: biases, a side not held), and ``fuse`` builds the linears."""
        want = (self.gate_up_proj.shape[1:], self.down_proj.shape[1:])
        for side, rows in ((held.gate_up, want[0]), (held.down, want[1])):
            if side is None:
                continue
            if len(side) != self.num_experts:
                raise ValueError(f"{len(side)} experts held for {self.num_experts}")
            for e, parts in enumerate(side):
                parts = parts if isinstance(parts, tuple) else (parts,)
                got = (sum(w.out_features for w in parts), parts[0].in_features)
                if any(w.in_features != got[1] for w in parts) or got != tuple(rows):
                    raise ValueError(f"expert {e}: held matrices of {got} (rows, columns) for {tuple(rows)}")
        self.held = held
        if held.gate_up is not None:
            self.gate_up_proj = _emptied(self.gate_up_proj)
        if held.down is not None:
            self.down_proj = _emptied(self.down_proj)

    def fuse(self) -> None:
        """After the checkpoint is loaded: each expert's held matrices as linears (with their biases)."""
        held = self.held
        if held is None:
            return
        two = held.gate_up is not None and len(held.gate_up[0]) == 2
        gate, up = gate_up_rows(self.glu, self.inter)
        self.linear_glu = as_halves(self.glu) if two else self.glu
        pairs = []
        for e in range(self.num_experts):
            b1, b2 = self._bias(self.gate_up_proj_bias, e), self._bias(self.down_proj_bias, e)
            if held.gate_up is None:
                gate_up: nn.Module = ExpertSlice(self.gate_up_proj[e], b1)
            else:
                b1 = torch.cat([b1[gate], b1[up]]) if two and b1 is not None else b1
                gate_up = kept_linear(held.gate_up[e], b1)
            if held.down is None:
                down: nn.Module = ExpertSlice(self.down_proj[e], b2)
            else:
                down = kept_linear((held.down[e],), b2)
            pairs.append((gate_up, down))
        self._set_linears(pairs)
        self.held = None
        for name in ("gate_up_proj_bias", "down_proj_bias"):  # now inside the linears
            bias = getattr(self, name)
            if bias is not None:
                setattr(self, name, _emptied(bias))

    def quantize_experts(self, quantize: Quantize, down: Quantize | None = None) -> int:
        """``--quantization``: each expert's two (N, K) matrices packed by ``quantize`` (down's by ``down``
        where given) and held (the float parameters freed; none where held already). Returns the count."""
        if self.linears:  # held already
            return 0
        w1, w2, q2 = self.gate_up_proj.detach(), self.down_proj.detach(), down or quantize
        self.hold(HeldExperts([(quantize(w),) for w in w1], [q2(w) for w in w2]))
        self.fuse()
        return 2 * self.num_experts

    def expert_bytes(self, e: int = 0) -> int:
        """The bytes of expert ``e``'s weights (and biases) as held: float, packed, or in blocks."""
        if self.blocks is not None:
            return self.blocks.expert_bytes
        if self.linears:
            return sum(linear_bytes(m) for m in self.linears[e])
        w1, w2 = self.gate_up_proj, self.down_proj
        weights = (w1[e].numel() + w2[e].numel()) * w1.element_size()
        biases = [b for b in (self.gate_up_proj_bias, self.down_proj_bias) if b is not None]
        return weights + sum(b[e].numel() * b.element_size() for b in biases)

    def pack_weights(self) -> int:
        """Each expert's float matrices in the CPU's fastest layout (quant/dense/onednn.py ``cpu_matrix``:
        glassbox's tiles or oneDNN's, faster bf16 GEMVs than plain ``F.linear``); the float parameters are
        then freed. Returns the matrices packed (none where every matrix is held as stored)."""
        pairs = self.linears or [
            (ExpertSlice(self.gate_up_proj[e], self._bias(self.gate_up_proj_bias, e)),
             ExpertSlice(self.down_proj[e], self._bias(self.down_proj_bias, e)))
            for e in range(self.num_experts)
        ]  # fmt: skip
        count = sum(isinstance(m, ExpertSlice) for pair in pairs for m in pair)
        if count:
            self._set_linears([tuple(kept_slice(m) for m in pair) for pair in pairs])  # type: ignore[misc]
        for name in ("gate_up_proj", "down_proj", "gate_up_proj_bias", "down_proj_bias"):
            if getattr(self, name) is not None and count:
                setattr(self, name, _emptied(getattr(self, name)))
        return count

    def _set_linears(self, pairs: list[tuple[nn.Module, nn.Module]]) -> None:
        self.linears = pairs
        self.kept = nn.ModuleList(m for pair in pairs for m in pair)
        self._bytes = [self.expert_bytes(e) for e in range(self.num_experts)]

    @staticmethod
    def _bias(bias: nn.Parameter | None, e: int) -> torch.Tensor | None:
        return None if bias is None or bias.numel() == 0 else bias.detach()[e]

    def _expert(self, e: int, rows: torch.Tensor) -> torch.Tensor:  # (n, H) -> (n, H)
        if self.linears:
            gate_up, down = self.linears[e]
            return down(self.linear_glu(gate_up(rows)))
        h = self.glu(F.linear(rows, self.gate_up_proj[e], self._bias(self.gate_up_proj_bias, e)))
        return F.linear(h, self.down_proj[e], self._bias(self.down_proj_bias, e))

    def forward(self, x: torch.Tensor, ids: torch.Tensor, weights: torch.Tensor) -> torch.Tensor:
        """x (T, H), ids (T, k), weights (T, k) in x's dtype -> (T, H). Grouped; on CUDA the fused triton
        kernels (models/moe_triton.py, eager and in graphs), else while a graph is being captured, dense
        (the grouped path reads the counts on the host)."""
        if self.fused is not None and self.fused_forward is not None:
            return self.fused_forward(self, x, ids, weights)
        if x.is_cuda and torch.cuda.is_current_stream_capturing():
            return self.dense(x, ids, weights)
        return self.grouped(x, ids, weights)

    def grouped(self, x: torch.Tensor, ids: torch.Tensor, weights: torch.Tensor) -> torch.Tensor:
        k = ids.shape[1]
        flat = ids.reshape(-1)
        order = torch.argsort(flat, stable=True)  # (T k,): the pairs by expert, then by token
        counts = torch.bincount(flat, minlength=self.num_experts).tolist()
        rows = order // k  # each sorted pair's token
        xs = x.index_select(0, rows)
        ys = torch.empty_like(xs)
        start = 0
        for e, n in enumerate(counts):
            if n:  # an expert nobody chose is skipped: its weights are not read
                ys[start : start + n] = self._expert(e, xs[start : start + n])
                start += n
                self.experts_read += 1
                self.bytes_read += self._bytes[e] if self.linears else self.expert_bytes(e)
        ys.mul_(weights.reshape(-1).index_select(0, order).unsqueeze(1))
        return torch.zeros_like(x).index_add_(0, rows, ys)

    def dense(self, x: torch.Tensor, ids: torch.Tensor, weights: torch.Tensor) -> torch.Tensor:
        """Every expert on every row, the unchosen ones weighted 0 (reads all E experts)."""
        assert not self.linears, "packed or held experts run grouped"
        self.experts_read += self.num_experts
        self.bytes_read += self.num_experts * self.expert_bytes()
        w = torch.zeros(x.shape[0], self.num_experts, dtype=x.dtype, device=x.device)
        w.scatter_(1, ids, weights)
        gate_up = torch.einsum("th,eoh->teo", x, self.gate_up_proj)
        if self.gate_up_proj_bias is not None:
            gate_up = gate_up + self.gate_up_proj_bias
        y = torch.einsum("tei,ehi->teh", self.glu(gate_up), self.down_proj)
        if self.down_proj_bias is not None:
            y = y + self.down_proj_bias
        return torch.einsum("teh,te->th", y, w)

    def reference(self, x: torch.Tensor, ids: torch.Tensor, weights: torch.Tensor) -> torch.Tensor:
        """One (token, choice) at a time, in expert order per token (as transformers adds them)."""
        out = torch.zeros_like(x)
        for t in range(x.shape[0]):
            for j in sorted(range(ids.shape[1]), key=lambda j: int(ids[t, j])):
                out[t] += self._expert(int(ids[t, j]), x[t : t + 1])[0] * weights[t, j]
        return out


def _emptied(p: nn.Parameter) -> nn.Parameter:
    """``p`` with no expert left (its shape past the first dim kept): the linears hold its values now."""
    return nn.Parameter(p.new_empty(0, *p.shape[1:]), requires_grad=False)


class SparseMoeBlock(nn.Module):
    """Router + routed experts (+ the optional shared expert and its gate), HF names: ``gate``,
    ``experts``, ``shared_expert``, ``shared_expert_gate``. ``router``: one of ROUTERS; ``bias``: the
    router and the experts carry biases; ``swiglu``: (alpha, limit) of gpt-oss's clamped SwiGLU over
    interleaved gate/up rows, else ``act(gate) * up``."""

    def __init__(
        self,
        hidden: int,
        num_experts: int,
        top_k: int,
        inter: int,
        act: str,
        renormalize: bool,
        shared_expert: nn.Module | None = None,
        shared_gated: bool = False,
        *,
        router: str = "softmax_topk",
        bias: bool = False,
        swiglu: tuple[float, float] | None = None,
    ) -> None:
        super().__init__()
        if router not in ROUTERS:
            raise ValueError(f"MoE router {router!r} is not one of {ROUTERS}")
        self.top_k, self.renormalize, self.router = top_k, renormalize, router
        self.gate = RouterLinear(hidden, num_experts, bias=bias)
        glu = ClampedSwiGLU(*swiglu) if swiglu is not None else gated(act)
        self.experts = MoEExperts(num_experts, hidden, inter, glu, bias)
        self.shared_expert = shared_expert
        self.shared_expert_gate = RouterLinear(hidden, 1, bias=False) if shared_gated else None

    def routing(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """(weights (T, k) in x's dtype, ids (T, k))."""
        weights, ids = route(self.gate(x), self.top_k, self.renormalize, self.router)
        return weights.to(x.dtype), ids

    def forward(self, x: torch.Tensor) -> torch.Tensor:  # (T, H) -> (T, H)
        weights, ids = self.routing(x)
        out = self.experts(x, ids, weights)
        if self.shared_expert is not None:
            shared = self.shared_expert(x)
            if self.shared_expert_gate is not None:
                shared = torch.sigmoid(self.shared_expert_gate(x)) * shared
            out = out + shared
        return out


# one expert's tensor as older checkpoints (and transformers' save_pretrained) store it
_PER_EXPERT = re.compile(r"^(.*\.experts)\.(\d+)\.(w1|w3|w2|gate_proj|up_proj|down_proj)\.weight$")
_GATE, _UP = ("w1", "gate_proj"), ("w3", "up_proj")


def checkpoint_slot(name: str, inter: int) -> tuple[str, int, slice] | None:
    """For a per-expert checkpoint tensor (Mixtral's ``block_sparse_moe.experts.N.w1/w3/w2``, Qwen's
    ``mlp.experts.N.gate_proj/up_proj/down_proj``): (the fused parameter's name, expert N, its rows
    there); None for any other name. Mixtral's ``block_sparse_moe`` is glassbox's ``mlp`` (as in
    transformers 5)."""
    m = _PER_EXPERT.match(name.replace(".block_sparse_moe.", ".mlp."))
    if m is None:
        return None
    prefix, e, kind = m.group(1), int(m.group(2)), m.group(3)
    if kind in _GATE:
        return f"{prefix}.gate_up_proj", e, slice(0, inter)
    if kind in _UP:
        return f"{prefix}.gate_up_proj", e, slice(inter, 2 * inter)
    return f"{prefix}.down_proj", e, slice(None)


def checkpoint_name(name: str) -> str:
    """A checkpoint tensor's name in glassbox's MoE module (Mixtral's ``block_sparse_moe`` -> ``mlp``)."""
    return name.replace(".block_sparse_moe.", ".mlp.")


# a layer's experts stacked, one tensor per projection, as GGUF files hold them (models/gguf_names.py)
_STACKED = re.compile(r"^(.*\.experts)\.(gate_proj|up_proj|down_proj)\.(weight|bias)$")


def stacked_slot(
    name: str, params: dict[str, nn.Parameter], inter: int, interleaved: bool
) -> tuple[str, torch.Tensor] | None:
    """For a stacked expert tensor (``mlp.experts.gate_proj.weight`` (E, I, H), ``up_proj``, ``down_proj``
    (E, H, I), their ``.bias`` (E, I) / (E, H)): the fused parameter and the view of it the tensor fills
    (the gate and up rows where the model's activation reads them: ``interleaved`` for gpt-oss's).
    None for any other name, or a parameter the model does not have."""
    m = _STACKED.match(name)
    if m is None:
        return None
    prefix, proj, kind = m.groups()
    bias = "_bias" if kind == "bias" else ""
    if proj == "down_proj":
        target = f"{prefix}.down_proj{bias}"
        return (target, params[target]) if target in params else None
    target = f"{prefix}.gate_up_proj{bias}"
    if target not in params:
        return None
    gate, up = gate_up_rows(ClampedSwiGLU(0.0, 0.0, interleaved) if interleaved else gated("silu"), inter)
    return target, params[target][:, gate if proj == "gate_proj" else up]
