"""Prompt rows of a block linear (``BlockWeights``: Q4_0, Q4_1, Q8_0, Q5_0, Q5_1, IQ4_NL, int4/int8) on the
CPU's int8 GEMM (kernels/cpu_quant_gemm.c: activations quantized per row in 32-value blocks, as llama.cpp's
q8_0, times the blocks as they are, AVX-512 VNNI in 4 x 4 register tiles) instead of the reference path
(the weight dequantized to bf16 for every call, then oneDNN's GEMM).

Which runs is chosen by measurement (benchmarks/vnni_gemm.py, results/vnni-gemm-q4_0-2026-11-28.json:
Phi-4-mini's Q4_0 shapes, one thread of this Xeon): without AMX (an EPYC, or AMX denied:
``ONEDNN_MAX_CPU_ISA`` below AVX512_CORE_AMX, or the tile state refused to the process) oneDNN's AVX-512 bf16
GEMM plus the dequantization is x2.8-10 slower at every row count measured (16-512), so the int8 GEMM takes
all rows. Where oneDNN has AMX its GEMM is slower up to 64 rows (the int8 GEMM x1.35-5.3 faster), about even
at 128 (x0.82-1.04) and faster past that (x0.35-0.55 at 512); a row-count threshold would make a row's bits
depend on how many rows share its step (tests/engine/test_bursts.py: bursts and single steps then parted at a
near tie), so with AMX the reference path keeps every prompt row (``AMX_INT8_ROWS`` = 0).
Accuracy (benchmarks/int8_prompt_accuracy.py, docs/performance.md): the activations' int8 blocks move a real
model's next-token logprobs about as llama.cpp's do (SmolLM2-135M Q4_1: top-1 as float32's at 221 of 227
positions, llama.cpp 221, the dequantized bf16 GEMM 220), so a greedy answer at a near tie may part from the
dequantized engine's, as llama.cpp's does; that is no reason to leave the path.
Yet free-running greedy text parts from the float32 reference sooner: on SmolLM2's 10 prompts of
tests/models/test_real_model.py (16 tokens each, AMX denied) the first difference came at a median of 5
tokens with the int8 GEMM, 8 or more with the dequantized GEMM (the test's bound, derived from bf16's
rounding), so the int8 GEMM is opt-in until its error is bounded for that test (2026-11-29).
``GLASSBOX_BLOCK_PROMPTS``: "dequant" (the default: the reference path), "auto" (the rule above: every prompt
row without AMX, none with it), "int8" (always). The C kernels built without AVX-512 VNNI run the reference
path whatever is asked.
"""

from __future__ import annotations

import ctypes
import functools
import os
import sys

import torch

from glassbox.kernels.native import cpu_has_amx
from glassbox.quant.blocks.weights import BlockWeights, native_library

AMX_INT8_ROWS = 0  # with AMX: rows on the int8 GEMM (none: one path for every prompt row, see above)
_CHOICES = ("auto", "int8", "dequant")


def amx_for_onednn() -> bool:
    """Whether oneDNN's GEMMs may use AMX here: the CPU has it (/proc/cpuinfo's amx_bf16),
    ``ONEDNN_MAX_CPU_ISA``, when set, does not stop below it (the Makefile's test-no-amx sets
    AVX512_CORE_BF16), and Linux grants this process AMX's tile state (arch_prctl ARCH_REQ_XCOMP_PERM, the
    request oneDNN makes; benchmarks/moe_compare.py's shim refuses it)."""
    isa = os.environ.get("ONEDNN_MAX_CPU_ISA", "ALL").upper()
    if isa not in ("ALL", "DEFAULT") and "AMX" not in isa:
        return False
    return cpu_has_amx() and _tile_state_granted()


def _tile_state_granted() -> bool:
    """arch_prctl(ARCH_REQ_XCOMP_PERM, XFEATURE_XTILEDATA) through libc's syscall() (x86-64 Linux)."""
    sys_arch_prctl, arch_req_xcomp_perm, xfeature_xtiledata = 158, 0x1023, 18
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        return int(libc.syscall(sys_arch_prctl, arch_req_xcomp_perm, xfeature_xtiledata)) == 0
    except (OSError, AttributeError):
        return False


@functools.cache
def int8_prompt_rows() -> int:
    """Up to how many rows a bf16 block linear outside decode steps runs the int8 GEMM (0: never)."""
    choice = os.environ.get("GLASSBOX_BLOCK_PROMPTS", "dequant")
    if choice not in _CHOICES:
        raise ValueError(f"GLASSBOX_BLOCK_PROMPTS must be one of {', '.join(_CHOICES)}, got {choice!r}")
    lib = native_library()
    if choice == "dequant" or lib is None or not lib.gb_gemm_blocks_native():
        return 0
    if choice == "int8" or not amx_for_onednn():
        return sys.maxsize
    return AMX_INT8_ROWS


def int8_gemm(x: torch.Tensor, w: BlockWeights, bias: torch.Tensor | None) -> torch.Tensor:
    """x (M, K) contiguous float32 or bf16 on the CPU -> (M, N) in x's dtype: x W^T (+ bias, float32)."""
    lib = native_library()
    assert lib is not None
    out = torch.empty(x.shape[0], w.out_features, dtype=x.dtype)
    lib.gb_gemm_blocks(
        x.data_ptr(), x.shape[0], w.in_features, *w.pointers(), None if bias is None else bias.data_ptr(),
        w.out_features, w.padded, w.kernel_bits, out.data_ptr(), int(x.dtype == torch.bfloat16),
        torch.get_num_threads(),
    )  # fmt: skip
    return out
