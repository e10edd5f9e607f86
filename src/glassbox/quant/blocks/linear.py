"""The modules that run ``BlockWeights`` (quant/blocks/weights.py) and ``KQuantWeights`` (quant/blocks/kquant.py):
a linear layer and an embedding table.

On the CPU, decode rows run the kernels' int8-activation GEMV (llama.cpp's arithmetic); other rows of bf16
models run the int8 GEMM where it is faster (quant/blocks/prompt_gemm.py), else multiply the dequantized
weight, as float32 models do (exact in float32), so a float32 model gives what the dequantized model gives.
On CUDA (``to_triton``) the blocks move to the device as they are (K-quants re-laid
for the kernels first: quant/blocks/kquant_triton.py) and the linears run kernels/triton_block_linear.py (decode
rows: a GEMV or split-K kernel; prompt rows: a tiled GEMM; both dequantize in registers); an embedding table
dequantizes the rows it looks up with the PyTorch ops.
"""

from __future__ import annotations

import contextlib
import contextvars
from collections.abc import Iterator
from typing import Any, Protocol

import torch
import torch.nn.functional as F
from torch import nn

from glassbox.quant.blocks.kquant import KQuantWeights
from glassbox.quant.blocks.kquant import concat as concat_kquant
from glassbox.quant.blocks.kquant_triton import TritonKQuant, for_triton
from glassbox.quant.blocks.prompt_gemm import int8_gemm, int8_prompt_rows
from glassbox.quant.blocks.weights import BlockWeights, concat, native_library

AnyBlocks = BlockWeights | KQuantWeights
HeldWeights = AnyBlocks | TritonKQuant  # what a module holds: K-quants re-laid on CUDA
_BUFFERS = ("codes", "scales", "offsets", "zeros", "perm", "meta", "sub", "mins", "sup")  # _register's names

# Up to this many rows run the int8-activation kernel and more multiply the dequantized weight (bf16 GEMM).
# Measured on a 3072 x 1024 Q4 layer (2 cores): kernel 0.60 / 2.69 / 5.54 ms at 16 / 64 / 128 rows,
# dequantize + GEMM 0.68 / 1.51 / 2.45 ms. Inside an engine step the step says (block_kernel_rows): the
# executor asks for the kernel in decode-only steps of at most this many rows.
KERNEL_ROWS = 16
# The LM head chooses by its own rows alone (the sampled ones, one a sequence: the same whether a prompt's
# prefix was cached or not), up to this many on the kernel, whatever the step: dequantizing a whole token
# table for a prompt's last row cost 40x the kernel. Measured on a Q6_K 200,064 x 3,072 head (Phi-4-mini's,
# 2 cores): kernel 25 / 104 / 442 / 1,695 ms at 1 / 16 / 64 / 256 rows, dequantize + GEMM 1,043 / 546 /
# 673 / 964 ms.
HEAD_KERNEL_ROWS = 64
# The per-forward choice: None (the row count decides), or whether this step's rows run the kernel.
_STEP_KERNEL: contextvars.ContextVar[bool | None] = contextvars.ContextVar(
    "glassbox_block_kernel", default=None
)


_STEP_PROMPT: contextvars.ContextVar[bool] = contextvars.ContextVar("glassbox_prompt_step", default=False)


@contextlib.contextmanager
def block_kernel_rows(use_kernel: bool, prompt: bool = False) -> Iterator[None]:
    """Within: block weights run the int8 kernel (``use_kernel``: decode-only steps) or the dequantized
    weight (steps with prompt rows), whatever their row count; the kernel takes at most 64 rows a call.
    ``prompt``: the step has prompt rows (bf16 tiles then take oneDNN's GEMM for many rows:
    quant/dense/bf16_tiles.py)."""
    token, prompt_token = _STEP_KERNEL.set(use_kernel), _STEP_PROMPT.set(prompt)
    try:
        yield
    finally:
        _STEP_KERNEL.reset(token)
        _STEP_PROMPT.reset(prompt_token)


def prompt_step() -> bool:
    """Whether this engine step has prompt rows (``block_kernel_rows``); False outside a step."""
    return _STEP_PROMPT.get()


def step_kernel_choice() -> bool | None:
    """This step's choice (``block_kernel_rows``): True for a decode-only step, False for one with prompt
    rows, None outside an engine step."""
    return _STEP_KERNEL.get()


def kernel_chosen(rows: int) -> bool:
    """Whether ``rows`` rows of a block linear run the int8 kernel here (the step's choice, else the count)."""
    step = step_kernel_choice()
    return rows <= KERNEL_ROWS if step is None else step


def _register(module: nn.Module, w: HeldWeights) -> None:
    """The blocks as (non-persistent) buffers, so that ``model.buffers()`` sees the bytes they hold (and
    only those: the buffers of weights held before are let go)."""
    for name in _BUFFERS:
        module._buffers.pop(name, None)
        module._non_persistent_buffers_set.discard(name)
    if isinstance(w, BlockWeights | TritonKQuant):  # its tiled tensors (``scales`` etc. are row copies)
        for name, t in w.stored().items():
            module.register_buffer(name, t, persistent=False)
        return
    module.register_buffer("codes", w.codes, persistent=False)
    for name in ("meta", "perm"):
        if getattr(w, name, None) is not None:
            module.register_buffer(name, getattr(w, name), persistent=False)


class KeptWeights(Protocol):
    """What the engine reads of weights kept in a format of their own (BlockWeights, KQuantWeights, FP8
    weights)."""

    label: str

    @property
    def nbytes(self) -> int: ...
    @property
    def out_features(self) -> int: ...
    @property
    def in_features(self) -> int: ...


def block_weights(model: nn.Module) -> list[KeptWeights]:
    """Every distinct BlockWeights or KQuantWeights of a model (a tied table counted once), and the weights
    of modules that keep theirs otherwise (a ``kept_weights`` attribute: quant/fp8/linear.py; a
    ``held_weights()`` list: FP4 linears and MoE experts, quant/fp4/linear.py and models/moe.py)."""
    seen: dict[int, KeptWeights] = {}
    for m in model.modules():
        if isinstance(m, BlockQuantLinear | BlockQuantEmbedding):
            seen.setdefault(id(m.w), m.w)
        elif (kept := getattr(m, "kept_weights", None)) is not None:
            seen.setdefault(id(m), kept)
        for w in getattr(m, "held_weights", list)():
            seen.setdefault(id(w), w)
    return list(seen.values())


class BlockQuantLinear(nn.Module):
    """y = x W^T + b with W in ``BlockWeights`` or ``KQuantWeights`` (CPU)."""

    kernel_rows = KERNEL_ROWS
    head_rows: int | None = None  # an LM head's own rule on the CPU (HEAD_KERNEL_ROWS; mark_lm_head)

    def __init__(self, weights: HeldWeights, bias: torch.Tensor | None = None) -> None:
        super().__init__()
        self.w = weights
        _register(self, weights)
        self.in_features, self.out_features = weights.in_features, weights.out_features
        # float32 whatever the model's dtype (the kernels add it in float); a parameter, so that a
        # checkpoint's bias loads into it by name
        self.bias = (
            None if bias is None else nn.Parameter(bias.detach().float().contiguous(), requires_grad=False)
        )
        self.nbytes = weights.nbytes
        self._call: tuple[Any, tuple[Any, ...]] | None = None  # the kernel and the weight's arguments
        self.triton = False  # run the Triton kernels (to_triton; the tests set it under the interpreter)

    @property
    def _bias_ptr(self) -> int | None:
        return None if self.bias is None else self.bias.data_ptr()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        lead = x.shape[:-1]
        if self.w.perm is not None:  # act-order: the input channels in the blocks' order
            x = x.index_select(-1, self.w.perm)
        x2 = x.reshape(-1, self.in_features)
        rows = x2.shape[0]
        step = _STEP_KERNEL.get()
        kernel = rows <= self.kernel_rows if step is None else step
        if self.triton:
            return _triton_linear(x2, self.w, self.bias, kernel).view(*lead, self.out_features)
        if self.head_rows is not None:
            kernel = rows <= self.head_rows
        cpu_prompt = not kernel and x.dtype == torch.bfloat16 and x.device.type == "cpu"
        if cpu_prompt and isinstance(self.w, BlockWeights) and rows <= int8_prompt_rows():
            # prompt rows on the int8 GEMM (quant/blocks/prompt_gemm.py)
            return int8_gemm(x2.contiguous(), self.w, self.bias).view(*lead, self.out_features)
        unbuilt = self._call is None and native_library() is None  # no C kernels
        if not kernel or x.dtype != torch.bfloat16 or x.device.type != "cpu" or unbuilt:
            bias = None if self.bias is None else self.bias.to(x.dtype)
            return F.linear(x, self.w.dequantize(x.dtype).to(x.device), bias)
        return self._gemv(x2.contiguous()).view(*lead, self.out_features)

    def _gemv(self, x: torch.Tensor) -> torch.Tensor:
        """Decode rows in one kernel call: activations to int8 blocks, then the GEMV; output in x's dtype.
        The weight's arguments are taken once, at the first call (after loading: the tensors stay put)."""
        if self._call is None:
            lib = native_library()
            assert lib is not None
            w = self.w
            assert not isinstance(w, TritonKQuant)
            if isinstance(w, KQuantWeights):
                self._call = w.kernel_call(self._bias_ptr)
            else:
                self._call = (
                    lib.gb_linear_blocks,
                    (*w.pointers(), self._bias_ptr, self.out_features, w.padded, w.kernel_bits),
                )
        fn, weight_args = self._call
        m = x.shape[0]
        out = torch.empty(m, self.out_features, dtype=x.dtype)
        fn(x.data_ptr(), m, self.in_features, *weight_args, out.data_ptr(), int(x.dtype == torch.bfloat16),
           torch.get_num_threads())  # fmt: skip
        return out


def mark_lm_head(model: nn.Module) -> bool:
    """Give the model's LM head, where it is block weights (under tensor parallelism: its shard), the
    head's own kernel rule (HEAD_KERNEL_ROWS); whether it is."""
    head = getattr(model, "lm_head", None)
    head = getattr(head, "inner", head)  # a vocab-parallel head around its packed shard
    if not isinstance(head, BlockQuantLinear):
        return False
    head.head_rows = HEAD_KERNEL_ROWS
    return True


@torch.compiler.disable  # a launch, not a graph: torch.compile of the MLP around it breaks here
def _triton_linear(x: torch.Tensor, w: HeldWeights, bias: torch.Tensor | None, decode: bool) -> torch.Tensor:
    from glassbox.kernels.triton_block_linear import block_matmul

    assert not isinstance(w, KQuantWeights), "K-quants run re-laid (to_triton)"
    return block_matmul(x.contiguous(), w.triton_args, bias, decode)


def to_triton(model: nn.Module, device: torch.device) -> int:
    """Move every block linear's and embedding's ``BlockWeights`` (a tied table once) and biases to
    ``device`` as they are (``KQuantWeights`` re-laid for the kernels first: quant/blocks/kquant_triton.py), the
    linears to run the Triton kernels, and so other modules with Triton kernels (a ``triton`` attribute:
    quant/fp8/linear.py; a ``move_to_triton`` method: quant/fp4/linear.py's 4-bit floats); returns how
    many linears."""
    moved: dict[int, tuple[HeldWeights, HeldWeights]] = {}  # id -> (weights, moved): the ids stay taken
    count = 0
    for m in model.modules():
        move = getattr(m, "move_to_triton", None)  # re-laid for the kernels (quant/fp4/linear.py)
        if callable(move) and getattr(m, "triton", None) is None:
            move(device)
            count += 1
            continue
        if getattr(m, "triton", None) is False and not isinstance(m, BlockQuantLinear):
            m.to(device)
            setattr(m, "triton", True)  # noqa: B010 (any module with Triton kernels: no type to name)
            count += 1
        if not isinstance(m, BlockQuantLinear | BlockQuantEmbedding):
            continue
        if id(m.w) not in moved:
            moved[id(m.w)] = (m.w, (for_triton(m.w) if isinstance(m.w, KQuantWeights) else m.w).to(device))
        m.w = moved[id(m.w)][1]
        _register(m, m.w)
        if isinstance(m, BlockQuantLinear):
            if m.bias is not None:
                m.bias = nn.Parameter(m.bias.detach().to(device), requires_grad=False)
            m.triton = True
            count += 1
    return count


class BlockQuantEmbedding(nn.Module):
    """An embedding table in block weights: looked-up rows are dequantized (to the model's dtype), then
    times ``scale`` where the table it replaces scales them (Gemma 3: sqrt(hidden), rounded to the dtype
    first, as models/gemma3.py's ScaledEmbedding does)."""

    def __init__(self, weights: HeldWeights, dtype: torch.dtype, scale: float | None = None) -> None:
        super().__init__()
        self.w = weights
        _register(self, weights)
        self.dtype = dtype
        self.num_embeddings, self.embedding_dim = weights.out_features, weights.in_features
        self.scale = None if scale is None else torch.tensor(scale, dtype=dtype).item()

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        rows = self.w.rows(ids, self.dtype)
        return rows if self.scale is None else rows * self.scale


def concat_weights(parts: list[HeldWeights]) -> AnyBlocks | None:
    """The parts stacked by rows (one kernel call for a fused q/k/v or gate/up), or None when they are of
    different layouts, bits or widths."""
    blocks = [p for p in parts if isinstance(p, BlockWeights)]
    if len(blocks) == len(parts):
        return concat(blocks)
    kquants = [p for p in parts if isinstance(p, KQuantWeights)]
    return concat_kquant(kquants) if len(kquants) == len(parts) else None
