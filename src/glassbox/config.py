"""EngineConfig: every engine setting in one dataclass, validated in __post_init__."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from glassbox.dtypes import ENGINE_DTYPES, KV_CACHE_DTYPES, parse_dtype
from glassbox.quant.formats import FORMATS, WeightFormat, at_load_formats, parse_format
from glassbox.spec_config import SpeculativeConfig, parse_speculative_config

DEVICES = ("auto", "cpu", "cuda")
MAX_SCHEDULER_STEPS = 64  # greedy decode steps in one engine step, at most
DEFAULT_BLOCK_SIZE = 16  # tokens per KV cache block (engine and planner)
LOAD_FORMATS = ("auto", "dummy")
# --quantization: "none" (16/32-bit weights) or a format applied to the built model (quant/formats.py rows
# with an ``at_load``; the aliases int8/int4/int4-asym spell q8_0/q4_0/q4_1)
QUANTIZATIONS = ("none", *at_load_formats())
TASKS = ("auto", "generate", "embed", "rerank")  # --task (engine/embedding_model.py)
POOLINGS = ("last", "mean", "cls")  # --pooling


@dataclass
class EngineConfig:
    """Engine settings; names follow vLLM's flags (``--max-num-seqs`` is ``max_num_seqs``)."""

    model: str | None = None  # a directory or .gguf file; None: the default model (models/sources.py)
    dtype: str = "auto"
    device: str = "auto"
    max_model_len: int | None = None  # None: the model's own limit
    max_num_seqs: int = 256
    max_num_batched_tokens: int | None = None  # None: 2048 on CPU, 8192 on CUDA (longer prompts are chunked)
    memory_utilization: float = 0.9
    block_size: int = DEFAULT_BLOCK_SIZE
    enable_prefix_caching: bool = True
    kv_cache_dtype: str = "auto"
    num_kv_blocks: int | None = None  # explicit pool size; overrides the memory budget
    kv_cache_memory_gib: float | None = None  # explicit KV size; CPU default: engine/kv_plan.py
    seed: int = 0
    load_format: str = "auto"
    # None: as the checkpoint stores it (GGUF Q4_0/Q4_1/Q8_0/Q4_K/Q5_K/Q6_K stay in their blocks on the CPU);
    # "none": 16/32-bit weights (a GGUF file is dequantized at load); a format of quant/formats.py with an
    # at-load function (q8_0, q4_0, q4_1, fp8, nvfp4, mxfp4; int8/int4/int4-asym spell the first three)
    quantization: str | None = None
    enforce_eager: bool = False  # no CUDA graphs / torch.compile
    # post-process a step's outputs (detokenize, stop strings, outputs) while the next step runs on the
    # device; None: on for CUDA, off for CPU (where the host and the "device" are the same cores)
    async_output: bool | None = None
    tensor_parallel_size: int = 1  # ranks (engine/tp_runtime.py); > 1: CPU, gloo, Llama-family models
    # several hosts (torchrun's names): this host's index of nnodes, and rank 0's rendezvous address
    nnodes: int = 1
    node_rank: int = 0
    master_addr: str = "127.0.0.1"
    master_port: int = 0  # 0: a free port on one host, 29500 across hosts
    served_model_name: str | None = None
    # greedy decode steps per engine step (vLLM's old --num-scheduler-steps), where the executor runs bursts
    # (engine/bursts.py: the CPU one-call step); None: as many as fit in a few milliseconds; 1: off
    num_scheduler_steps: int | None = None
    # speculative decoding, vLLM's JSON or dict (spec_config.py): {"method": "ngram",
    # "num_speculative_tokens": k, "prompt_lookup_min": a, "prompt_lookup_max": b} or a draft model,
    # {"model": DIR, "num_speculative_tokens": k}; parsed to SpeculativeConfig (or None) here
    speculative_config: SpeculativeConfig | dict[str, Any] | str | None = None
    # what the model serves (engine/embedding_model.py): "auto" decides from the checkpoint (BERT encoders and
    # sentence-transformers directories embed, BertForSequenceClassification reranks, the rest generate)
    task: str = "auto"
    # pooling for a model without sentence-transformers files (then L2-normalized); with a generative model
    # it turns embeddings on beside generation (last-token pooling of its final hidden states)
    pooling: str | None = None

    @property
    def quantized_at_load(self) -> WeightFormat | None:
        """The format ``--quantization`` applies to the built model, or None (as stored; "none": floats)."""
        return None if self.quantization in (None, "none") else FORMATS[self.quantization]

    @property
    def speculative(self) -> SpeculativeConfig | None:
        """The validated speculative decoding setup, or None."""
        assert self.speculative_config is None or isinstance(self.speculative_config, SpeculativeConfig)
        return self.speculative_config

    def __post_init__(self) -> None:
        # either spelling ("bfloat16" / "bf16") in, the canonical one (glassbox.dtypes) kept
        self.dtype = parse_dtype(self.dtype, "--dtype", ENGINE_DTYPES)
        self.kv_cache_dtype = parse_dtype(self.kv_cache_dtype, "--kv-cache-dtype", KV_CACHE_DTYPES)
        if self.device not in DEVICES:
            raise ValueError(f"--device must be one of {DEVICES}, got {self.device!r}")
        if self.load_format not in LOAD_FORMATS:
            raise ValueError(f"--load-format must be one of {LOAD_FORMATS}, got {self.load_format!r}")
        if self.quantization is not None and self.quantization.strip().lower() == "none":
            self.quantization = "none"
        elif self.quantization is not None:  # either spelling in ("int4"), the table's name kept ("q4_0")
            self.quantization = parse_format(self.quantization, "--quantization", QUANTIZATIONS).name
        if self.max_model_len is not None and self.max_model_len < 1:
            raise ValueError(f"--max-model-len must be >= 1, got {self.max_model_len}")
        if self.max_num_seqs < 1:
            raise ValueError(f"--max-num-seqs must be >= 1, got {self.max_num_seqs}")
        if self.max_num_batched_tokens is not None and self.max_num_batched_tokens < 1:
            raise ValueError(f"--max-num-batched-tokens must be >= 1, got {self.max_num_batched_tokens}")
        if not 0.0 < self.memory_utilization <= 1.0:
            raise ValueError(f"--memory-utilization must be in (0, 1], got {self.memory_utilization}")
        if self.block_size not in (1, 2, 4, 8, 16, 32, 64, 128, 256):
            raise ValueError(f"--block-size must be a power of two from 1 to 256, got {self.block_size}")
        if self.num_kv_blocks is not None and self.num_kv_blocks < 1:
            raise ValueError(f"--num-kv-blocks must be >= 1, got {self.num_kv_blocks}")
        if self.kv_cache_memory_gib is not None and self.kv_cache_memory_gib <= 0:
            raise ValueError(f"--kv-cache-memory-gib must be > 0, got {self.kv_cache_memory_gib}")
        self.speculative_config = parse_speculative_config(self.speculative_config)
        if self.num_scheduler_steps is not None and not 1 <= self.num_scheduler_steps <= MAX_SCHEDULER_STEPS:
            raise ValueError(
                f"--num-scheduler-steps must be in [1, {MAX_SCHEDULER_STEPS}], got {self.num_scheduler_steps}"
            )
        if self.tensor_parallel_size < 1:
            raise ValueError(f"--tensor-parallel-size must be >= 1, got {self.tensor_parallel_size}")
        if self.nnodes < 1 or self.tensor_parallel_size % self.nnodes:
            raise ValueError(
                f"--nnodes must be >= 1 and divide --tensor-parallel-size {self.tensor_parallel_size}, got {self.nnodes}"
            )
        if not 0 <= self.node_rank < self.nnodes:
            raise ValueError(f"--node-rank must be in [0, {self.nnodes}), got {self.node_rank}")
        if self.task not in TASKS:
            raise ValueError(f"--task must be one of {TASKS}, got {self.task!r}")
        if self.pooling is not None and self.pooling not in POOLINGS:
            raise ValueError(f"--pooling must be one of {POOLINGS} or unset, got {self.pooling!r}")
        if not 0 <= self.master_port < 65536:
            raise ValueError(f"--master-port must be in [0, 65535], got {self.master_port}")
