"""glassbox's own CPU prompt path, as the cost model charges it (profile ``glassbox-cpu``; zero elsewhere).

A CPU decode step streams the weights through glassbox's kernels (bf16 tiles, block GEMVs) in one native
call. A step with prompt rows runs the per-op forward instead, and its linears take a different path:

- **Block weights** (Q4_0/Q4_1/Q8_0: quant/blocks/linear.py) are dequantized into a fresh bf16 matrix
  (kernels/cpu_dequant.c) and multiplied by oneDNN: per weight the blocks are read (q bytes) and 2 bytes
  written, oneDNN reorders the plain matrix into its own layout (read 2, write 2) and its GEMM reads that
  (2, where decode read q): ``prompt_prep_bytes_per_weight`` = 8 bytes moved beyond the decode step's q,
  on any step with prompt rows (decode steps run the int8 kernel). The dequantization's vector loop takes
  whole 512-value chunks of a row (16 blocks: kernels/cpu_quant.h CHUNK); the values past a row's last
  whole chunk (64 of every 576 on SmolLM2's 576-wide rows) run one at a time in scalar C:
  ``dequant_tail_bytes_per_value`` charges each such value as that many bytes at the streaming rate.
- **bf16 tiles** (quant/dense/bf16_tiles.py) run every row count on their own kernel (no copy): on a CPU
  with AMX they multiply on AMX (kernels/cpu_bf16_amx.c) at ``tile_flops_share`` of the probe's bf16 matmul
  rate (oneDNN's AMX GEMM); on a CPU without AMX the probe's GEMM is AVX-512 dot products like the tiles',
  which run at its rate (``for_this_cpu``). A profile whose tiles stop at ``prompt_prep_rows`` (the engine
  before the tiles multiplied on AMX, or ``GLASSBOX_BF16_AMX=off`` on an AMX CPU) charges the copy past it:
  the tiles untiled into a temporary (read 2, write 2) that oneDNN reorders (4), the same 8 bytes.
- The per-op forward dispatches ~10 kernels a layer from Python: ``prompt_layer_overhead_s`` a layer; each
  kernel reads and writes the step's activations (norms, rotary, SiLU, residual adds, attention's copies):
  ``activation_passes`` passes a layer over (hidden + MLP width) bf16 values per token.

The LM head is never copied (it runs on the sampled rows only, under the kernels' row limits).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, replace

from glassbox.models.facts import ModelFacts
from glassbox.perf.engine_profiles import EngineProfile
from glassbox.perf.quant import QuantScheme
from glassbox.quant.formats import WeightFormat

CHUNK_VALUES = 512  # the dequantization's vector unit: 16 blocks of 32 values (kernels/cpu_quant.h CHUNK)
DENSE_GROUPS = ("attention", "mlp", "moe_shared", "mamba")


def tail(k: int) -> int:
    """Values of a K-wide row that the dequantization runs in scalar code (cpu_dequant.c dequant_row)."""
    whole = k // CHUNK_VALUES * CHUNK_VALUES
    return k - whole if whole else k  # no whole chunk: the whole row


def tail_values(facts: ModelFacts) -> float:
    """Scalar-dequantized values of one pass over every dense linear (all layers; not routed experts)."""
    h, inter, attn = facts.hidden_size, facts.intermediate_size, facts.num_heads * facts.head_dim
    qkv_out = attn + 2 * facts.num_kv_heads * facts.head_dim
    dense_layers = facts.num_layers - facts.moe_layers
    per_layer = (qkv_out * tail(h) + h * tail(attn)) * facts.num_layers
    if inter:
        per_layer += (2 * inter * tail(h) + h * tail(inter)) * dense_layers
    return float(per_layer)


@dataclass(frozen=True)
class PromptPath:
    """What a step's linears cost beyond the decode path (see the module docstring)."""

    prep_bytes: float  # moved at the streaming rate (eta_bw)
    tail_bytes: float  # the scalar dequantization, as bytes at the streaming rate
    tile_rows: bool  # 16-bit linears run the tiles' kernel (FLOPs at tile_flops_share)
    python_layers: int  # layers run by the per-op forward (prompt_layer_overhead_s each)
    activation_bytes: float = 0.0  # the per-op forward's passes over the activations (at eta_bw)


def prompt_path(
    facts: ModelFacts,
    quant: QuantScheme,
    engine: EngineProfile,
    batch: Sequence[tuple[int, int]],
    verify: bool = False,
) -> PromptPath:
    """The prompt-path terms of one step of ``batch`` = [(new tokens, context), ...] (all zero for an
    engine without them, and for decode steps: one row a sequence, or ``verify``, a speculative step's
    rows, which the engine runs on the decode kernels)."""
    rows = 0 if verify else max((n for n, _ in batch), default=0)
    fmt: WeightFormat = quant.main
    blocks = fmt.family == "blocks" and engine.prompt_prep_bytes_per_weight > 0
    prompt = rows > 1
    dense = float(sum(facts.params[g] for g in DENSE_GROUPS))  # routed experts: their own path, not here
    prep = tail_b = 0.0
    if blocks and prompt:
        prep = dense * engine.prompt_prep_bytes_per_weight
        if "_k" not in fmt.name:  # K-quants dequantize per 256-value super-block (cpu_kquant_dequant.c)
            tail_b = tail_values(facts) * engine.dequant_tail_bytes_per_value
    elif fmt.is_16bit and rows > engine.prompt_prep_rows:
        prep = dense * engine.prompt_prep_bytes_per_weight
    tiles = fmt.is_16bit and 1 < rows <= engine.prompt_prep_rows
    if not prompt:
        return PromptPath(prep, tail_b, tiles, 0)
    tokens = sum(n for n, _ in batch)
    width = facts.hidden_size + (facts.intermediate_size or facts.moe_intermediate_size)
    act = engine.activation_passes * tokens * facts.num_layers * width * 2.0  # bf16 activations
    return PromptPath(prep, tail_b, tiles, facts.num_layers, act)


def has_amx() -> bool:
    """Whether this machine's CPU has AMX (Linux /proc/cpuinfo; False where unknown)."""
    try:
        with open("/proc/cpuinfo") as f:
            return any(line.startswith("flags") and " amx_bf16" in line for line in f)
    except OSError:
        return False


def for_this_cpu(engine: EngineProfile, amx: bool | None = None) -> EngineProfile:
    """``engine`` as glassbox runs on this CPU: without AMX, bf16 prompts stay on the tiles (no copy) and
    the probe's bf16 matmul is the tiles' kind of AVX-512 arithmetic (quant/dense/bf16_tiles.onednn_prompts)."""
    if not engine.prompt_prep_bytes_per_weight or (has_amx() if amx is None else amx):
        return engine
    return replace(engine, prompt_prep_rows=1 << 30, tile_flops_share=1.0)
