"""Nemotron-H's feed-forward blocks with Hugging Face's names: the squared-ReLU MLP (up, down; no gate) and
the routed MoE (Nemotron 3's latent MoE where ``moe_latent_size`` is set).

Routing (transformers' NemotronHTopkRouter, DeepSeek-V3's rule): scores = sigmoid(x W^T) in float32; the
choice adds ``e_score_correction_bias``; with n_group > 1 only the ``topk_group`` groups whose best two
choices sum highest stay eligible; top-k of the choice; the weights are the chosen experts' scores,
renormalized to sum to 1 where ``norm_topk_prob``, times ``routed_scaling_factor``. Experts run grouped
(each chosen expert once on its gathered rows), in the latent width between fc1_latent_proj and
fc2_latent_proj where the model has them; the shared expert runs on every token at full width.
"""

from __future__ import annotations

import re

import torch
import torch.nn.functional as F
from torch import nn

from glassbox.layers.activation import get_activation
from glassbox.models.hybrid_spec import HybridSpec
from glassbox.models.model_config import ModelConfig
from glassbox.quant.held_experts import HeldExperts, Quantize, kept_linear


class NemotronHMLP(nn.Module):
    def __init__(self, hidden: int, inter: int, act: str, bias: bool) -> None:
        super().__init__()
        self.up_proj = nn.Linear(hidden, inter, bias=bias)
        self.down_proj = nn.Linear(inter, hidden, bias=bias)
        self.act = get_activation(act)

    def forward(self, x: torch.Tensor) -> torch.Tensor:  # (T, hidden)
        return self.down_proj(self.act(self.up_proj(x)))


class NemotronHRouter(nn.Module):
    def __init__(self, hidden: int, cfg: ModelConfig, spec: HybridSpec) -> None:
        super().__init__()
        e = cfg.num_experts
        self.weight = nn.Parameter(torch.zeros(e, hidden))
        self.e_score_correction_bias = nn.Parameter(torch.zeros(e))  # a checkpoint tensor (HF: a buffer)
        self.top_k, self.renormalize = cfg.experts_per_token, cfg.norm_topk_prob
        self.n_group, self.topk_group, self.scale = spec.n_group, spec.topk_group, spec.routed_scaling_factor

    def forward(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:  # (T, H) -> weights, ids (T, k)
        scores = F.linear(x.float(), self.weight.float()).sigmoid()  # (T, E)
        choice = scores + self.e_score_correction_bias.float()
        if self.n_group > 1:
            t, e = choice.shape
            grouped = choice.view(t, self.n_group, e // self.n_group)
            best = grouped.topk(2, dim=-1).values.sum(dim=-1)  # (T, groups)
            keep = torch.zeros_like(best).scatter_(1, best.topk(self.topk_group, dim=-1).indices, 1.0)
            mask = keep.bool().unsqueeze(-1).expand_as(grouped).reshape(t, e)
            choice = choice.masked_fill(~mask, float("-inf"))
        ids = choice.topk(self.top_k, dim=-1, sorted=False).indices
        weights = scores.gather(1, ids)
        if self.renormalize:
            weights = weights / (weights.sum(dim=-1, keepdim=True) + 1e-20)
        return weights * self.scale, ids


class NemotronHExperts(nn.Module):
    """E squared-ReLU experts held stacked: up_proj (E, I, D), down_proj (E, D, I), D the latent width or
    the hidden size; or, from a quantized checkpoint (``hold``), each expert's (up, down) kept linears."""

    def __init__(self, num_experts: int, width: int, inter: int, act: str) -> None:
        super().__init__()
        self.up_proj = nn.Parameter(torch.empty(num_experts, inter, width))
        self.down_proj = nn.Parameter(torch.empty(num_experts, width, inter))
        self.act = get_activation(act)
        self.num_experts = num_experts
        self.kept = nn.ModuleList()  # flat [up_0, down_0, up_1, ...] where held; empty otherwise

    def hold(self, held: HeldExperts) -> None:
        """Run each expert's matrices as stored (a gate-less ``gate_up``: its up alone); the stacked float
        parameters are emptied. ValueError where a side is missing or a shape differs."""
        e, inter, width = self.up_proj.shape
        if held.gate_up is None or held.down is None or len(held.gate_up) != e or len(held.down) != e:
            raise ValueError(f"{e} experts need each an up and a down matrix held")
        for i, (up, down) in enumerate(zip(held.gate_up, held.down, strict=True)):
            if (
                len(up) != 1
                or (up[0].out_features, up[0].in_features) != (inter, width)
                or (
                    down.out_features,
                    down.in_features,
                )
                != (width, inter)
            ):
                raise ValueError(
                    f"expert {i}: held matrices do not fit up ({inter}, {width}), down ({width}, {inter})"
                )
            self.kept.extend([kept_linear(up, None), kept_linear((down,), None)])
        self.up_proj = nn.Parameter(self.up_proj.new_empty(0, inter, width), requires_grad=False)
        self.down_proj = nn.Parameter(self.down_proj.new_empty(0, width, inter), requires_grad=False)

    def quantize_experts(self, quantize: Quantize, down: Quantize | None = None) -> int:
        """``--quantization``: each expert's up and down packed by ``quantize`` (down's by ``down`` where
        given) and held; returns the count (none where held already)."""
        if len(self.kept):
            return 0
        q2 = down or quantize
        self.hold(
            HeldExperts(
                [(quantize(w),) for w in self.up_proj.detach()], [q2(w) for w in self.down_proj.detach()]
            )
        )
        return 2 * self.num_experts

    def _up(self, e: int, x: torch.Tensor) -> torch.Tensor:
        return self.kept[2 * e](x) if len(self.kept) else F.linear(x, self.up_proj[e])

    def _down(self, e: int, x: torch.Tensor) -> torch.Tensor:
        return self.kept[2 * e + 1](x) if len(self.kept) else F.linear(x, self.down_proj[e])

    def forward(self, x: torch.Tensor, ids: torch.Tensor, weights: torch.Tensor) -> torch.Tensor:
        """x (T, D), ids and float32 weights (T, k) -> (T, D), summed in float32 as transformers does."""
        out = torch.zeros(x.shape, dtype=torch.float32, device=x.device)
        flat = ids.reshape(-1)
        order = flat.argsort(stable=True)
        counts = torch.bincount(flat, minlength=self.num_experts).tolist()
        start = 0
        for e, n in enumerate(counts):
            if n == 0:
                continue
            pairs = order[start : start + n]  # (token, choice) pairs of expert e
            start += n
            tokens = pairs // ids.shape[1]
            h = self._down(e, self.act(self._up(e, x[tokens]))) * weights.reshape(-1)[pairs].unsqueeze(-1)
            out.index_add_(0, tokens, h.float())
        return out.to(x.dtype)


class NemotronHMoE(nn.Module):
    def __init__(self, cfg: ModelConfig, spec: HybridSpec) -> None:
        super().__init__()
        h, latent = cfg.hidden_size, spec.moe_latent_size
        self.gate = NemotronHRouter(h, cfg, spec)
        self.experts = NemotronHExperts(cfg.num_experts, latent or h, cfg.moe_intermediate_size, spec.mlp_act)
        self.shared_experts = NemotronHMLP(h, cfg.shared_expert_intermediate_size, spec.mlp_act, cfg.mlp_bias)
        self.fc1_latent_proj = nn.Linear(h, latent, bias=cfg.mlp_bias) if latent else None
        self.fc2_latent_proj = nn.Linear(latent, h, bias=cfg.mlp_bias) if latent else None

    def forward(self, x: torch.Tensor) -> torch.Tensor:  # (T, hidden)
        weights, ids = self.gate(x)
        h = self.fc1_latent_proj(x) if self.fc1_latent_proj is not None else x
        h = self.experts(h, ids, weights)
        if self.fc2_latent_proj is not None:
            h = self.fc2_latent_proj(h)
        return h + self.shared_experts(x)


# one expert's tensor as Nemotron-H checkpoints store it
_PER_EXPERT = re.compile(r"^(.*\.experts)\.(\d+)\.(up_proj|down_proj)\.weight$")


def expert_slot(name: str, params: dict[str, nn.Parameter]) -> tuple[str, torch.Tensor] | None:
    """A per-expert checkpoint tensor's place: (the stacked parameter's name, its expert's matrix)."""
    m = _PER_EXPERT.match(name)
    if m is None:
        return None
    target = f"{m.group(1)}.{m.group(3)}"
    return (target, params[target][int(m.group(2))]) if target in params else None
