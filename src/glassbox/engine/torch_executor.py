"""TorchExecutor: builds the flat token batch, runs the model on CPU or CUDA, samples.

On the CPU the model's forward runs on glassbox's C kernels where its family has them (bound to the built
model at start, models/loader.py ``bind_cpu_kernels``), else on the PyTorch ops.

CUDA: attention runs the triton kernels over the block tables, routed experts the fused triton MoE
(models/moe_triton.py), decode-only steps replay CUDA graphs (engine/cuda_graph.py) unless
``enforce_eager``, and host inputs travel in one pinned copy per step.
"""

from __future__ import annotations

import itertools
import logging
import time
from functools import partial
from typing import TYPE_CHECKING

import torch

from glassbox.config import EngineConfig
from glassbox.distributed import state as tp_state
from glassbox.dtypes import kv_element_bytes
from glassbox.engine import tp_model
from glassbox.engine.checkpoint import Checkpoint
from glassbox.engine.device import (
    available_ram_bytes,
    choose_backends,
    keeps_blocks,
    kv_budget,
    read_device_memory,
)
from glassbox.engine.executor import PendingStep, ReadyStep
from glassbox.engine.kv_caches import kv_cache_tensors
from glassbox.engine.kv_plan import GiB, KVCachePlan, cpu_kv_budget, fixed_plan, plan_cache
from glassbox.engine.profile_run import profile_prefill
from glassbox.engine.sampler import to_device
from glassbox.engine.scheduler import ScheduledSeq, SchedulerOutput
from glassbox.engine.state_inputs import Rows, executor_scratch, layer_caches, state_batch, state_bytes
from glassbox.engine.step_inputs import decode_rows, flatten, metadata
from glassbox.engine.step_sampling import DevicePendingStep, SamplePlan
from glassbox.kernels.attention_tiles import prefill_block_m
from glassbox.layers.attention import AttentionMetadata
from glassbox.models.causal_lm import CausalLM
from glassbox.models.facts import ModelFacts
from glassbox.models.loader import Forward, bind_cpu_kernels, build_model
from glassbox.models.model_config import ModelConfig, dtype_name
from glassbox.outputs import SampleResult
from glassbox.quant.blocks.linear import (
    KERNEL_ROWS,
    block_kernel_rows,
    mark_lm_head,
    to_triton,
)
from glassbox.quant.kept import held_size

if TYPE_CHECKING:
    from glassbox.engine.cuda_graph import DecodeGraphs

logger = logging.getLogger(__name__)

MAX_GRAPH_BATCH = 512
GRAPH_RESERVE_BYTES = 256 << 20  # the decode graphs' private pool and static buffers (measured < 64 MiB)
# CPU, serving: a step under this many FLOPs leaves one core to the HTTP frontend (see reserve_frontend_core)
LIGHT_STEP_FLOPS = 0.1e9


class TorchExecutor:
    """Runs a Hugging Face model on the paged KV cache."""

    def __init__(
        self,
        config: EngineConfig,
        checkpoint: Checkpoint | None,  # None: random weights (--load-format dummy)
        facts: ModelFacts,
        max_model_len: int,
        max_num_batched_tokens: int,
        draft_kv_bytes_per_token: float = 0.0,  # a draft model's cache shares the KV budget (draft_model.py)
        defer_kv: bool = False,  # the draft's own executor: allocate_kv() later
    ) -> None:
        self.config = config
        self.draft_kv_bytes_per_token = draft_kv_bytes_per_token
        self.facts = facts
        self.model_config = ModelConfig.from_facts(facts, max_model_len, config.speculative)
        self.hidden_sink = lambda rows, hidden: hidden  # (step's rows, final hidden states): the MTP's
        self._choose_backends(checkpoint)
        self.model = self._build_model(checkpoint)
        self._lay_out_weights()
        self._count_weights()
        self.eos_ids: set[int] = set()
        # the draws of every request without a seed of its own, in one batched call per step
        self.sample_generator = torch.Generator(device=self.device)
        self.sample_generator.manual_seed(config.seed)
        self.graphs: DecodeGraphs | None = None
        self.kv_bytes_per_token = self.facts.kv_bytes_per_token(
            kv_element_bytes(dtype_name(self.kv_dtype), self.model_config.head_dim)
        )
        if not defer_kv:
            self.allocate_kv(self._plan_kv_cache(max_model_len, max_num_batched_tokens), max_model_len)

    def _choose_backends(self, checkpoint: Checkpoint | None) -> None:
        """The device, dtypes and attention backend (engine/device.py), and this rank's tensor-parallel
        state: a rank runs its shard on the PyTorch ops on the CPU, eagerly on CUDA."""
        b = choose_backends(self.config, self.model_config)
        self.device, self.dtype, self.kv_dtype, self.kv_width = b.device, b.dtype, b.kv_dtype, b.kv_width
        self.on_triton, self.attn_backend, self.use_graphs = b.on_triton, b.attn_backend, b.use_graphs
        self.block_size = self.config.block_size
        self.tp = tp_state()  # a tensor-parallel rank (engine/tp_model.py): its shard; CPU: PyTorch ops
        if self.tp is not None:
            tp_model.check_run(self.tp.world, self.device, self.config, checkpoint, self.model_config)
            self.attn_backend = "torch" if self.device.type == "cpu" else self.attn_backend
            if self.use_graphs:  # CUDA: eager steps (graphs that capture the collectives are not built)
                logger.info("tensor parallelism on CUDA runs eager steps (no CUDA graphs)")
                self.use_graphs = False

    def _build_model(self, checkpoint: Checkpoint | None) -> CausalLM:
        """The model built with the checkpoint's weights (those kept in their format swapped in: GGUF
        blocks where kernels run them here, a quantized checkpoint's layers), then ``--quantization``'s
        format applied (quant/formats.py)."""
        config = self.config
        at_load = config.quantized_at_load
        keep_blocks = keeps_blocks(
            config.quantization, at_load, self.device, self.attn_backend, self.dtype, self.on_triton
        )
        weights, kept = (None, {}) if checkpoint is None else (
            # a rank's shards; a GGUF's blocks stay in them on every rank (the PyTorch ops run them)
            tp_model.weights(self.tp, checkpoint, self.model_config, config.quantization is None)
            if self.tp is not None
            else checkpoint.weights(keep_blocks, self.device, self.dtype, cpu=self.device.type == "cpu")
        )  # fmt: skip
        model = build_model(
            self.model_config,
            weights,
            self.dtype,
            self.device,
            seed=config.seed,
            where="the checkpoint" if checkpoint is None else str(checkpoint.source.path),
            kept=kept,
            shard=tp_model.shard_fn(self.tp, self.model_config),
        )
        if at_load is not None:
            from glassbox.quant.at_load import quantize_at_load

            quantize_at_load(
                model,
                at_load,
                # the routed experts too where kernels hold them: the CPU's, CUDA's fused block MoE
                experts=self.device.type == "cpu" or (self.on_triton and at_load.family != "fp8"),
                across=tp_model.max_across(self.tp),
            )
        return model

    def _lay_out_weights(self) -> None:
        """The weights in the layouts this device's kernels read: a kept LM head's own kernel rule (CPU),
        the routed experts on the fused Triton MoE and kept weights on the Triton kernels (CUDA), bf16
        linears packed for oneDNN or glassbox's tiles (CPU), the elementwise modules compiled (graphs)."""
        mark_lm_head(self.model)  # a kept LM head: its own rows choose the kernel (CPU)
        self.triton_experts = 0  # MoE layers on the fused triton kernels (CUDA)
        if self.on_triton:
            from glassbox.models.moe_triton import use_triton_experts

            self.triton_experts = use_triton_experts(self.model)
            if self.triton_experts:
                logger.info("routed experts of %d MoE layers on the fused triton MoE", self.triton_experts)
            if moved := to_triton(self.model, self.device):  # block and FP8 weights
                logger.info("%d linears in blocks or FP8 on the Triton kernels", moved)
        self.max_threads = torch.get_num_threads()
        self.light_threads = self.max_threads  # reserve_frontend_core() lowers it
        self.packed = 0  # linears in the CPU's packed layouts
        if self.device.type == "cpu" and self.dtype != torch.float32:  # under TP too: each shard
            from glassbox.quant.dense.onednn import pack_linears, packing_available

            if packing_available(self.dtype):
                self.packed = pack_linears(self.model)  # oneDNN layout: ~2x faster bf16 decode GEMVs
        self.compiled = False
        if self.use_graphs:  # before the memory profile, so that it runs the fused kernels
            from glassbox.engine.cuda_graph import compile_elementwise

            t0 = time.perf_counter()
            self.compiled = compile_elementwise(self.model)
            logger.info(
                "torch.compile of the elementwise modules: %s in %.1f s",
                self.compiled,
                time.perf_counter() - t0,
            )

    def _count_weights(self) -> None:
        """The weights' bytes as held, FLOPs per token (GEMMs only; a token runs k of each MoE layer's
        experts) and the formats kept in blocks ("Q4_1", "int4"), for the anatomy and the KV budget."""
        self.weight_bytes, elements, self.block_formats = held_size(self.model)
        mc = self.model_config
        unchosen = sum(mc.layer_moe) * (mc.num_experts - mc.experts_per_token) * mc.params_per_expert
        self.flops_per_token = 2 * (elements - unchosen)  # roughly: GEMMs only

    def allocate_kv(self, plan: KVCachePlan, max_model_len: int) -> None:
        """Allocate the paged KV cache, bind the CPU kernels to it, capture the CUDA graphs."""
        # with tensor parallelism the fewest blocks any rank holds (engine/tp_model.py)
        self.kv_plan, self.rank_weight_bytes = tp_model.agree(self.tp, plan, self.weight_bytes)
        self.num_kv_blocks = self.kv_plan.num_blocks
        model_config = self.model_config
        # CUDA: one block more than the BlockManager gets, the scratch block that padded graph rows write
        blocks = self.num_kv_blocks + (1 if self.device.type == "cuda" else 0)
        if model_config.hybrid is None:  # a layer's own KV heads and width (Gemma 4), shared KV held once
            heads = None if self.tp is None else partial(tp_model.kv_heads, self.tp, model_config)
            self.kv_caches = kv_cache_tensors(
                model_config, blocks, self.block_size, self.kv_dtype, self.device, heads
            )
        else:  # attention layers' KV beside the linear layers' state rows
            shape = (2, blocks, self.block_size, tp_model.kv_heads(self.tp, model_config), self.kv_width)
            self.kv_caches = layer_caches(model_config, shape, self.kv_dtype, self.kv_plan, self.device)
        self.state_scratch = executor_scratch(self.kv_plan, model_config, self.config)  # speculative
        # the forward a step calls: the model's own, or on CPU the model bound to the C kernels
        self.forward: Forward = self.model
        if self.attn_backend == "native":  # bound now, so that a shape the kernels cannot take shows at start
            try:
                self.forward = bind_cpu_kernels(self.model, self.kv_caches, self.dtype)
            except ValueError as e:
                logger.warning("glassbox's CPU kernels cannot run this model (%s): using PyTorch ops", e)
                self.attn_backend = "torch"
        # greedy decode bursts (engine/bursts.py) where the one-call CPU step runs: the rows one may take
        burst = getattr(self.forward, "burst", None) is not None and self.tp is None
        self.burst_rows = KERNEL_ROWS if burst else 0
        if self.use_graphs:
            self._capture_graphs(max_model_len)

    def _capture_graphs(self, max_model_len: int) -> None:
        from glassbox.engine.cuda_graph import DecodeGraphs

        t0 = time.perf_counter()
        before = torch.cuda.memory_reserved(self.device)
        self.graphs = DecodeGraphs(
            self.forward,
            self.kv_caches,
            min(self.config.max_num_seqs, MAX_GRAPH_BATCH),
            -(-max_model_len // self.block_size),
            self.num_kv_blocks * self.block_size,
            self.device,
        )
        self.graphs.capture()
        logger.info(
            "captured %d decode CUDA graphs (batch 1..%d) in %.1f s, %.0f MiB",
            len(self.graphs.sizes),
            self.graphs.max_batch,
            time.perf_counter() - t0,
            (torch.cuda.memory_reserved(self.device) - before) / (1 << 20),
        )

    def _plan_kv_cache(self, max_model_len: int, max_num_batched_tokens: int) -> KVCachePlan:
        cfg = self.config
        per_token = self.kv_bytes_per_token
        per_block = round(per_token * self.block_size)
        state = state_bytes(self.model_config, cfg)  # a hybrid model's states take their share first
        if cfg.num_kv_blocks is not None:
            return fixed_plan(cfg.num_kv_blocks, self.block_size, per_block, state, cfg.max_num_seqs)
        budget: float
        if cfg.kv_cache_memory_gib is not None:
            budget = int(cfg.kv_cache_memory_gib * GiB)
        elif self.device.type == "cuda":
            budget = self._cuda_kv_budget(max_num_batched_tokens)
        else:
            # CPU: what max_num_seqs sequences of max_model_len tokens need, capped (engine/kv_plan.py)
            budget = cpu_kv_budget(
                per_token, self.block_size, max_model_len, cfg.max_num_seqs, available_ram_bytes(), state
            )
        # with a draft model: its cache takes its share, so that both hold as many tokens
        share = per_token / (per_token + self.draft_kv_bytes_per_token)
        return plan_cache(budget * share, per_token, self.block_size, state, cfg.max_num_seqs)

    def _cuda_kv_budget(self, max_num_batched_tokens: int) -> int:
        """Device memory x utilization, less the weights and a measured activation peak (on unified
        memory: available host RAM x utilization; device.kv_budget)."""
        torch.cuda.synchronize()
        torch.cuda.reset_peak_memory_stats(self.device)
        before = torch.cuda.memory_allocated(self.device)
        mc = self.model_config
        n = max(1, min(max_num_batched_tokens, mc.max_positions))
        profile_prefill(self.model, mc, n, self.block_size, self.kv_dtype, self.attn_backend,
                        self.dtype, self.device)  # fmt: skip
        peak = torch.cuda.max_memory_allocated(self.device) - before
        torch.cuda.empty_cache()  # the profile's blocks back: on unified memory, back to the host too
        mem = read_device_memory(self.device)
        util = self.config.memory_utilization
        budget, how = kv_budget(mem, util, peak, GRAPH_RESERVE_BYTES if self.use_graphs else 0)
        logger.info("KV cache budget: %s", how)
        if budget <= 0:
            raise ValueError(
                f"no memory left for the KV cache: weights {self.weight_bytes / GiB:.2f} GiB + activations "
                f"{peak / GiB:.2f} GiB exceed --memory-utilization {util} ({how})"
            )
        return budget

    # -- one step ------------------------------------------------------------
    def reserve_frontend_core(self) -> None:
        """CPU: run light steps (small decode batches) on one thread fewer than the maximum.

        A server's event loop shares the machine with the engine: when it wakes to stream a token it takes
        a core from one of the engine's OpenMP threads, and every parallel region of the step then waits
        for that thread. Measured on 2 cores, demo model, one streaming client: 2.4 ms per token on two
        threads, 0.97 ms on one; Qwen3-0.6B shape: 28.9 and 28.5 ms, while its prefills and batch-8
        decode still want both (TTFT 184 vs 300 ms, 131 vs 94 tok/s), hence the threshold on the step's
        work. SmolLM2-135M's decode step (0.27 GFLOP, ~8 ms) wants both too (2 cores of a Xeon, one client,
        benchmarks/bench_peers.py: TPOT 13.4 ms on one thread, 8.2 on two): the threshold sits between it and
        the demo model's (0.012 GFLOP).
        """
        if self.device.type == "cpu" and self.max_threads > 1:
            self.light_threads = self.max_threads - 1
            logger.info(
                "steps under %.1f GFLOP run on %d of %d threads, leaving a core to the server",
                LIGHT_STEP_FLOPS / 1e9,
                self.light_threads,
                self.max_threads,
            )

    def _set_threads(self, batch: SchedulerOutput) -> None:
        tokens = batch.num_prefill_tokens + batch.num_decode_tokens
        want = self.light_threads if tokens * self.flops_per_token < LIGHT_STEP_FLOPS else self.max_threads
        if torch.get_num_threads() != want:
            torch.set_num_threads(want)

    def launch(self, batch: SchedulerOutput) -> PendingStep:
        """Queue the step's forward and sampling; on CUDA this returns before the device has finished."""
        if self.light_threads != self.max_threads:
            self._set_threads(batch)
        # decode rows: one token after the cached ones, or a token and its drafts (speculative decoding: row i
        # attends to the cache up to its own position, as a decode row; the drafts' K/V are written first)
        decodes = [s for s in batch.scheduled if decode_rows(s)]
        prefills = [s for s in batch.scheduled if not decode_rows(s)]
        rows = sum(s.num_new_tokens for s in decodes)
        if self.graphs is not None and not prefills and rows <= self.graphs.max_batch:
            return self._execute_graph(decodes)
        if decodes and decodes[0].lookahead:  # a greedy decode burst (only ever decode-only)
            return self._burst(decodes)
        ordered = decodes + prefills
        ids, pos, slots = self._flatten(ordered)
        meta = self._metadata(decodes, prefills, slots, batch)
        plan = SamplePlan.build(ordered, self.device)  # the rows to sample, on the device before the forward
        kernel = not prefills and rows <= KERNEL_ROWS
        if self.tp is not None:  # the workers run the same forward (engine/tp_model.run_step)
            tp_model.send_step((ids, pos, meta, plan.rows, (kernel, bool(prefills))))
        # block weights run their int8-activation kernel in decode-only steps of few rows, the dequantized
        # weight in a GEMM otherwise: a prompt gives the same first token whether or not its prefix was
        # cached, and wide decode batches take the GEMM, faster there (layers/block_linear.KERNEL_ROWS)
        with torch.inference_mode(), block_kernel_rows(kernel, bool(prefills)):
            hidden = self.hidden_sink(ordered, self.forward(ids, pos, self.kv_caches, meta))
            return plan.sample(self.model.compute_logits, hidden, self.eos_ids, self.sample_generator)

    def last_logits(self, decodes: list[ScheduledSeq], prefills: list[ScheduledSeq]) -> torch.Tensor:
        """Compute ``decodes`` as decode rows and ``prefills`` as prompt chunks (their K/V written to the
        cache) and return the logits of each one's last row, in that order (a draft model's passes)."""
        ordered = decodes + prefills
        ids, pos, slots = self._flatten(ordered)
        meta = self._metadata(decodes, prefills, slots)
        last = list(itertools.accumulate(s.num_new_tokens for s in ordered))
        rows = last[len(decodes) - 1] if decodes else 0
        with torch.inference_mode(), block_kernel_rows(not prefills and rows <= KERNEL_ROWS, bool(prefills)):
            hidden = self.forward(ids, pos, self.kv_caches, meta)
            if len(last) < hidden.shape[0]:
                hidden = hidden.index_select(0, to_device([i - 1 for i in last], torch.long, self.device))
            return self.model.compute_logits(hidden)

    def _burst(self, decodes: list[ScheduledSeq]) -> ReadyStep:
        """Greedy decode rows that also pick their next ``lookahead`` tokens, in one native call
        (models/llama_burst.py): each row's picks, the last as its token and the others before it."""
        burst = getattr(self.forward, "burst", None)
        assert burst is not None and self.burst_rows >= len(decodes)
        picks = burst([s.seq.token_ids[s.start] for s in decodes], [s.start for s in decodes],
                      [s.seq.block_table for s in decodes], 1 + decodes[0].lookahead)  # fmt: skip
        return ReadyStep({s.seq.seq_id: SampleResult(p[-1], None, [SampleResult(t, None) for t in p[:-1]])
                          for s, p in zip(decodes, picks, strict=True)})  # fmt: skip

    def _execute_graph(self, decodes: list[ScheduledSeq]) -> DevicePendingStep:
        """A decode-only step on the captured graphs (CUDA)."""
        assert self.graphs is not None
        bs = self.block_size
        ids, pos, slots, lens, tables = [], [], [], [], []
        for s in decodes:
            table = s.seq.block_table
            for p, token in enumerate(s.tokens(), start=s.start):
                ids.append(token)
                pos.append(p)
                slots.append(table[p // bs] * bs + p % bs)
                lens.append(p + 1)
                tables.append(table)
        plan = SamplePlan.build(decodes, self.device)
        with torch.inference_mode():
            hidden = self.hidden_sink(decodes, self.graphs.run(ids, pos, slots, lens, tables))  # (rows, H)
            return plan.sample(self.model.compute_logits, hidden, self.eos_ids, self.sample_generator)

    def _flatten(self, ordered: list[ScheduledSeq]) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        return flatten(ordered, self.block_size, self.device)

    def _metadata(
        self, decodes: Rows, prefills: Rows, slots: torch.Tensor, step: SchedulerOutput | None = None
    ) -> AttentionMetadata:
        head_dim = self.model_config.head_dim
        meta = metadata(decodes, prefills, slots, self.block_size, self.device, self.attn_backend,
                        lambda: prefill_block_m(head_dim, self.kv_dtype, self.dtype, self.device))  # fmt: skip
        hybrid, scratch = self.model_config.hybrid, self.state_scratch
        meta.state = state_batch(decodes, prefills, self.device, step, scratch) if hybrid else None
        return meta
