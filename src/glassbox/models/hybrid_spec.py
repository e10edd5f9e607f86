"""The recurrent mixers of hybrid models (torch-free), part of ModelFacts: their shapes and state sizes.

A hybrid model mixes attention layers (paged KV) with layers that keep a fixed-size state per sequence:
Gated DeltaNet (Qwen3-Next, Qwen3.5: ``layer_mixers`` "linear") and Mamba-2 (Nemotron-H: "mamba"). Each
such layer's state is a short convolution window (the last ``conv_kernel - 1`` inputs of its depthwise
causal convolution) and a recurrent matrix per head. The engine keeps both in one float32 row per state
slot (engine/block_manager.py owns the slots; layers/state_cache.py lays the row out); the planner counts
them at the element sizes a serving engine stores (conv in the model's dtype, the recurrent matrix in
``ssm_bytes``).
"""

from __future__ import annotations

from dataclasses import dataclass

STATE_MIXERS = ("linear", "mamba")  # layer_mixers kinds that hold a recurrent state, not KV


@dataclass(frozen=True)
class GatedDeltaNetShape:
    """One Gated DeltaNet layer: q/k heads of ``head_k_dim``, v heads of ``head_v_dim`` (each q/k head
    serves ``num_v_heads // num_k_heads`` consecutive v heads, or with ``tiled_v_heads`` every
    ``num_k_heads``-th: v head j reads k head j % num_k_heads), a depthwise conv over [q | k | v]."""

    num_k_heads: int
    num_v_heads: int
    head_k_dim: int
    head_v_dim: int
    conv_kernel: int
    # Qwen3-Next's in_proj_qkvz / in_proj_ba (rows grouped per k head); Qwen3.5's in_proj_qkv/z/b/a apart
    fused_projections: bool
    # llama.cpp's qwen35 files: v heads (z, b, a, A_log, dt_bias, the conv's v channels, out_proj's columns)
    # stored tiled [k0 v0, k1 v0, ..., k0 v1, ...], not grouped per k head as Hugging Face holds them
    tiled_v_heads: bool = False

    @property
    def key_dim(self) -> int:
        return self.num_k_heads * self.head_k_dim

    @property
    def value_dim(self) -> int:
        return self.num_v_heads * self.head_v_dim

    @property
    def conv_dim(self) -> int:
        return 2 * self.key_dim + self.value_dim

    @property
    def conv_elements(self) -> int:
        return (self.conv_kernel - 1) * self.conv_dim

    @property
    def ssm_shape(self) -> tuple[int, int, int]:
        """(heads, rows, cols) of the recurrent matrix: (num_v_heads, head_k_dim, head_v_dim)."""
        return self.num_v_heads, self.head_k_dim, self.head_v_dim

    def flops_per_token(self) -> float:
        """Recurrent FLOPs per token beyond the projections: decay, read (S^T k), write (k d^T) and
        readout (S^T q) of each head's (dk, dv) matrix, and the conv."""
        return (
            8.0 * self.num_v_heads * self.head_k_dim * self.head_v_dim
            + 2.0 * self.conv_dim * self.conv_kernel
        )


@dataclass(frozen=True)
class Mamba2Shape:
    """One Mamba-2 mixer: ``num_heads`` heads of ``head_dim`` channels, B and C in ``n_groups`` groups of
    ``state_size``, a depthwise conv over [x | B | C]."""

    num_heads: int
    head_dim: int
    n_groups: int
    state_size: int
    conv_kernel: int
    chunk_size: int
    time_step_min: float  # the prompt scan clamps dt from below to it (as transformers does)
    conv_bias: bool
    proj_bias: bool

    @property
    def d_inner(self) -> int:
        return self.num_heads * self.head_dim

    @property
    def conv_dim(self) -> int:
        return self.d_inner + 2 * self.n_groups * self.state_size

    @property
    def conv_elements(self) -> int:
        return (self.conv_kernel - 1) * self.conv_dim

    @property
    def ssm_shape(self) -> tuple[int, int, int]:
        """(heads, rows, cols) of the recurrent matrix: (num_heads, head_dim, state_size)."""
        return self.num_heads, self.head_dim, self.state_size

    def flops_per_token(self) -> float:
        """Decay, write (dt x B^T) and readout (h C) of each head's (P, N) matrix, and the conv."""
        return 6.0 * self.d_inner * self.state_size + 2.0 * self.conv_dim * self.conv_kernel


Mixer = GatedDeltaNetShape | Mamba2Shape


@dataclass(frozen=True)
class HybridSpec:
    """The state-holding layers of a hybrid model and the settings its family code needs."""

    layer_mixers: tuple[str, ...]  # ModelFacts.layer_mixers: "full" | "linear" | "mamba" | "none"
    gdn: GatedDeltaNetShape | None = None
    mamba: Mamba2Shape | None = None
    # Qwen3-Next / 3.5 attention: q_proj also yields a per-channel output gate, sigmoid(gate) * attn
    attn_output_gate: bool = False
    mlp_act: str = "silu"  # Nemotron-H's MLP and experts: "relu2" (up, down; no gate)
    # Nemotron-H's router: sigmoid scores + a correction bias for the choice, groups, scaled weights
    n_group: int = 1
    topk_group: int = 1
    routed_scaling_factor: float = 1.0
    moe_latent_size: int = 0  # Nemotron 3: experts run in a latent width (fc1/fc2 latent projections)
    norm_eps: float = 1e-6  # the mixers' gated norms (and Nemotron-H's block norms)
    ssm_bytes: int = 4  # recurrent matrix element size a serving engine keeps (the planner's figure)
    # multi-token-prediction layers the checkpoint ships (mtp_num_hidden_layers; mtp.* weights), read only
    # for --speculative-config's "mtp" method (models/qwen3_next_mtp.py)
    mtp_layers: int = 0

    def shape(self, kind: str) -> Mixer | None:
        """The mixer shape of a layer kind ("linear", "mamba"), None for attention / FFN-only layers."""
        if kind == "linear":
            return self.gdn
        if kind == "mamba":
            return self.mamba
        return None

    def state_layers(self) -> int:
        return sum(1 for k in self.layer_mixers if k in STATE_MIXERS)

    def layer_state_elements(self) -> tuple[tuple[int, int], ...]:
        """Per layer: (conv elements, recurrent-matrix elements) of one sequence's state; (0, 0) where the
        layer holds none."""
        out = []
        for kind in self.layer_mixers:
            s = self.shape(kind)
            if s is None:
                out.append((0, 0))
            else:
                h, r, c = s.ssm_shape
                out.append((s.conv_elements, h * r * c))
        return tuple(out)

    def state_bytes(self, conv_bytes: float, ssm_bytes: float) -> int:
        """One sequence's state in every layer at the given element sizes."""
        return int(sum(c * conv_bytes + s * ssm_bytes for c, s in self.layer_state_elements()))

    def mixer_flops_per_token(self) -> float:
        return sum(s.flops_per_token() for k in self.layer_mixers if (s := self.shape(k)) is not None)
