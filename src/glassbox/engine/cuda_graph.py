"""The CUDA decode fast path: torch.compile of the elementwise chains, and CUDA graphs for decode-only
steps captured at padded batch sizes over static input buffers.

A step with n decode rows replays the graph of the smallest captured size >= n. Rows [n, size) are
padding: context length 0 (attention writes zeros, reads nothing) and their K/V go to a scratch slot
in a block the BlockManager never hands out. Inputs reach the static buffers through pinned host
staging and non-blocking copies; an event guards the staging against reuse before its copy ran.
"""

from __future__ import annotations

import functools
import logging
from typing import Any

import torch

from glassbox.engine.kv_caches import kv_cache_tensors
from glassbox.layers.attention import AttentionMetadata, PrefillSeq
from glassbox.models.loader import Forward

logger = logging.getLogger(__name__)


def _dummy_forward(model: Any, n: int) -> torch.Tensor:
    """``n`` tokens through the model on the reference attention path and a one-slot cache."""
    mc, p = model.config, next(model.parameters())
    cache = kv_cache_tensors(mc, 1, 1, p.dtype, p.device, one_per_shape=True)
    meta = AttentionMetadata(slot_mapping=torch.zeros(n, dtype=torch.long, device=p.device))
    meta.prefills = [PrefillSeq(0, n, 0, torch.zeros(1, dtype=torch.long, device=p.device))]
    ids = torch.arange(1, n + 1, device=p.device) % mc.vocab_size
    return model(ids, torch.arange(n, device=p.device), cache, meta)


@torch.inference_mode()
def compile_elementwise(model: Any) -> bool:
    """torch.compile the forwards of the modules the model names (``model.elementwise_modules()``: for
    the Llama family RMSNorm, rotary and the MLP, ~40 launches per layer unfused, ~14 fused). One
    dynamic-shape compile per class, kept only if a dummy batch matches eager."""
    targets = model.elementwise_modules()
    refs = {n: _dummy_forward(model, n) for n in (1, 3)}  # 1 is specialized apart from the rest
    compiled = {cls: torch.compile(cls.forward, dynamic=True) for cls in {type(m) for m in targets}}
    for m in targets:
        m.forward = functools.partial(compiled[type(m)], m)  # type: ignore[method-assign]
    try:
        for n, ref in refs.items():
            out = _dummy_forward(model, n)
            err = ((out.float() - ref.float()).norm() / ref.float().norm().clamp_min(1e-6)).item()
            if not err < 5e-2:  # bf16 rounding differs when fused; a real bug is O(1)
                raise RuntimeError(f"compiled forward differs from eager (relative error {err:.2e})")
    except Exception as e:  # any compiler failure: fall back to the eager modules
        logger.warning("torch.compile of the elementwise modules failed, running them eagerly: %s", e)
        for m in targets:
            del m.forward
        return False
    return True


def _host(t: torch.Tensor, pin: bool) -> torch.Tensor:
    return t.pin_memory() if pin else t


def graph_batch_sizes(max_batch: int) -> list[int]:
    """1, 2, 4, then steps of 8 to 64, of 16 to 128, of 32 beyond; always ending at ``max_batch``."""
    sizes = [b for b in (1, 2, 4) if b < max_batch]
    sizes += list(range(8, min(64, max_batch) + 1, 8))
    sizes += list(range(80, min(128, max_batch) + 1, 16))
    sizes += list(range(160, max_batch + 1, 32))
    sizes = sorted({s for s in sizes if s < max_batch} | {max_batch})
    return sizes


class DecodeGraphs:
    """Captured decode forwards (input ids -> final hidden states) for each padded batch size."""

    def __init__(
        self,
        forward: Forward,
        kv_caches: list[torch.Tensor],
        max_batch: int,
        max_blocks: int,  # block-table width: cdiv(max_model_len, block_size)
        scratch_slot: int,  # a cache slot no sequence owns (padding rows write their K/V there)
        device: torch.device,
    ) -> None:
        self.forward = forward
        self.kv_caches = kv_caches
        self.sizes = graph_batch_sizes(max_batch)
        self.max_batch = self.sizes[-1]
        self.max_blocks = max_blocks
        self.scratch_slot = scratch_slot
        n = self.max_batch
        # static device inputs, read by every graph (a graph of size b reads rows [0, b))
        self.ints = torch.zeros((3, n), dtype=torch.long, device=device)  # ids, positions, slots
        self.lens = torch.zeros(n, dtype=torch.int32, device=device)
        self.tables = torch.zeros((n, max_blocks), dtype=torch.int32, device=device)
        # pinned host staging (plain memory off CUDA: tests replay eagerly on the CPU) and numpy views
        pin = device.type == "cuda"
        self._h_ints = _host(torch.zeros((3, n), dtype=torch.long), pin)
        self._h_lens = _host(torch.zeros(n, dtype=torch.int32), pin)
        self._h_tables = _host(torch.zeros(n * max_blocks, dtype=torch.int32), pin)
        self._np_ints = self._h_ints.numpy()
        self._np_lens = self._h_lens.numpy()
        self._np_tables = self._h_tables.numpy()
        self._copied = torch.cuda.Event() if pin else None
        self.graphs: dict[int, torch.cuda.CUDAGraph] = {}
        self.outputs: dict[int, torch.Tensor] = {}  # (size, hidden) per graph, overwritten by replay

    def _meta(self, size: int) -> AttentionMetadata:
        return AttentionMetadata(
            slot_mapping=self.ints[2, :size],
            num_decode=size,
            decode_block_tables=self.tables[:size],
            decode_context_lens=self.lens[:size],
            backend="triton",
        )

    def _forward(self, size: int) -> torch.Tensor:
        return self.forward(self.ints[0, :size], self.ints[1, :size], self.kv_caches, self._meta(size))

    @torch.inference_mode()
    def capture(self) -> None:
        """Capture every size, largest first, into one shared memory pool."""
        self.ints[2].fill_(self.scratch_slot)
        self.lens.zero_()
        pool = torch.cuda.graph_pool_handle()
        side = torch.cuda.Stream()
        for size in reversed(self.sizes):
            side.wait_stream(torch.cuda.current_stream())
            with torch.cuda.stream(side):  # warm-up: compiles kernels for this shape outside capture
                self._forward(size)
            torch.cuda.current_stream().wait_stream(side)
            graph = torch.cuda.CUDAGraph()
            with torch.cuda.graph(graph, pool=pool):
                self.outputs[size] = self._forward(size)
            self.graphs[size] = graph
        torch.cuda.synchronize()

    def padded_size(self, n: int) -> int:
        return next(s for s in self.sizes if s >= n)

    def run(
        self,
        ids: list[int],
        positions: list[int],
        slots: list[int],
        context_lens: list[int],
        tables: list[list[int]],  # each holds at least cdiv(context_len, block_size) blocks
    ) -> torch.Tensor:  # (n, hidden), valid until the next replay
        n = len(ids)
        size = self.padded_size(n)
        if self._copied is not None:
            self._copied.synchronize()  # the previous step's copies have read the staging buffers
        ints, lens = self._np_ints, self._np_lens
        ints[0, :n] = ids
        ints[1, :n] = positions
        ints[2, :n] = slots
        ints[:2, n:size] = 0
        ints[2, n:size] = self.scratch_slot
        lens[:n] = context_lens
        lens[n:size] = 0
        width = max(len(t) for t in tables)
        tab = self._np_tables[: n * width].reshape(n, width)
        for i, t in enumerate(tables):
            tab[i, : len(t)] = t  # entries past len(t) are stale and never read
        self.ints.copy_(self._h_ints, non_blocking=True)  # whole buffers: a few KiB, contiguous
        self.lens.copy_(self._h_lens, non_blocking=True)
        self.tables[:n, :width].copy_(self._h_tables[: n * width].view(n, width), non_blocking=True)
        if self._copied is not None:
            self._copied.record()
        self.graphs[size].replay()
        return self.outputs[size][:n]
