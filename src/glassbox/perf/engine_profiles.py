"""Engine profiles: the efficiencies and fixed costs that separate a real engine from the roofline.

Each real profile is fitted on BRIEF.md's DGX Spark measurements (tests/perf/test_perf_calibration.py
redoes the fit and checks these constants against it); ``ideal`` is the ceiling (every efficiency 1,
no overheads). ``glassbox`` (its CUDA path) is fitted on its own H100 measurements
(benchmarks/plan_vs_gpu.py; tests/perf/test_perf_gpu_calibration.py checks them), ``glassbox-cpu`` on a CPU's.
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace

from glassbox.perf.tensor_parallel import TensorParallel


@dataclass(frozen=True)
class EngineProfile:
    """How well an engine's kernels and scheduler use the hardware.

    eta_bw: share of peak bandwidth reached streaming weights/KV (decode, small-batch prefill).
    eta_flops: share of the dense tensor peak reached by large prefill GEMMs (and attention, by default).
    eta_attn: share of the 16-bit tensor peak reached by (flash) attention's QK^T and PV; 0 = eta_flops.
        Set where the linears run another path than attention (ggml: int8 MMQ linears, f16 flash attention).
    moe_flops_factor: routed-expert (grouped) GEMMs relative to dense GEMMs (few tokens per expert).
    step_overhead_s: fixed per engine step (kernel launches, scheduling, sampling) in seconds.
    layer_overhead_s: per layer per step: the host dispatching an eager engine's ops one by one (seconds);
        0 where kernels are launched from graphs or the dispatch hides behind device work.
    seq_overhead_s: per sequence per step: host work that grows with the batch (scheduling, inputs,
        sampling, appending tokens, text) and leaves the device idle (seconds).
    overlap: memory traffic and arithmetic overlap (step = max of the two, as on GPUs); False adds them
        (a CPU core both streams the weights and does the math, so small-batch GEMMs pay for both).
    request_overhead_s: fixed per request before its first token (HTTP, tokenize, admission) in seconds.
    max_batched_tokens: prefill chunk (vLLM max_num_batched_tokens, llama.cpp ubatch); 0 = whole prompt.
    max_num_seqs: sequences decoded together at most (server default).
    runtime_gib: memory beyond weights/KV/activations: CUDA context, workspaces, graphs.
    gguf: loads GGUF files; quantized matmuls run on the int8 (MMQ) path.
    native_fp4: runs the dense linears of NVFP4/MXFP4 weights on FP4 tensor cores where the chip and
        kernels allow (the prompt GEMMs at the FP4 rate; activations quantized to FP4 per block).
    native_fp4_moe: the routed experts' grouped GEMMs too (else widened to bf16, as Marlin's kernels do).
    weight_only: quantized weights are dequantized into 16-bit dots (glassbox's Triton kernels: 4/8-bit
        blocks, GPTQ/AWQ and FP8 weight-only), never int8/FP8 tensor cores; bytes per weight unchanged.
    mixed_rest_format: how its files store the 16-bit part of a mixed checkpoint (llama.cpp: q8_0).
    kernel_factors: apply each format's decode_kernel_factor (dequantization cost); off for ceilings.
    kv_row_scales: an fp8/int8 KV cache keeps a float32 scale per token and head (glassbox's layout);
        else one scale per tensor (vLLM's fp8), 1 byte per element.
    tp: tensor parallelism (ranks, link); a step's time is one rank's share plus its all-reduces.
    prompt_prep_bytes_per_weight: bytes moved per dense weight (not the LM head) to prepare a prompt step's
        GEMM, charged at eta_bw (glassbox-cpu: perf/cpu_terms.py): bf16 tiles past ``prompt_prep_rows`` rows
        (none: they run every row count), block weights on any prompt step; 0: none.
    dequant_tail_bytes_per_value: block weights' values dequantized in scalar code on a prompt step (past
        each row's last whole 512-value chunk), each charged as this many bytes at eta_bw.
    tile_flops_share: glassbox's bf16 tiles (prompt steps of up to ``prompt_prep_rows`` rows) reach this
        share of eta_flops x the bf16 peak (their AMX kernel beside oneDNN's AMX GEMM).
    prompt_layer_overhead_s: per layer on steps with prompt rows: the per-op forward's Python dispatch
        (glassbox-cpu: decode steps run the layer stack in one native call instead).
    block_gemv_factor: block weights' int8 decode kernel streams at this share of eta_bw.
    host_op_s: the probe's time for one small op where the host terms (step, layer, sequence overheads) were
        fitted: on hardware whose spec carries its own (``extra["op_s"]``: perf/cpu_clock.py) they scale by
        the ratio; 0: never scaled.
    activation_passes: the per-op forward's passes over a prompt step's activations per layer, each
        (hidden + MLP width) bf16 values per token, at eta_bw (perf/cpu_terms.py).
    """

    name: str
    eta_bw: float
    eta_flops: float
    moe_flops_factor: float
    step_overhead_s: float
    request_overhead_s: float
    max_batched_tokens: int
    max_num_seqs: int
    runtime_gib: float
    gguf: bool = False
    native_fp4: bool = False
    native_fp4_moe: bool = False
    weight_only: bool = False
    mixed_rest_format: str | None = None
    kernel_factors: bool = True  # apply formats' decode_kernel_factor (off for ceilings)
    layer_overhead_s: float = 0.0
    seq_overhead_s: float = 0.0
    eta_attn: float = 0.0  # 0: attention at eta_flops of the bf16 peak
    overlap: bool = True
    kv_row_scales: bool = False
    prompt_prep_bytes_per_weight: float = 0.0
    prompt_prep_rows: int = 32
    dequant_tail_bytes_per_value: float = 0.0
    tile_flops_share: float = 1.0
    prompt_layer_overhead_s: float = 0.0
    block_gemv_factor: float = 1.0
    activation_passes: float = 0.0
    host_op_s: float = 0.0
    fitted_on: str = ""
    tp: TensorParallel = field(default_factory=TensorParallel)  # ranks and their link (perf/tensor_parallel)

    def ceiling(self) -> EngineProfile:
        """The same kernels' data path (dtypes, chunking) at 100% efficiency with no fixed costs."""
        return replace(
            self,
            name=f"{self.name} ceiling",
            eta_bw=1.0,
            eta_flops=1.0,
            eta_attn=0.0,
            moe_flops_factor=1.0,
            step_overhead_s=0.0,
            layer_overhead_s=0.0,
            seq_overhead_s=0.0,
            request_overhead_s=0.0,
            kernel_factors=False,
            prompt_layer_overhead_s=0.0,
            dequant_tail_bytes_per_value=0.0,
            tile_flops_share=1.0,
            block_gemv_factor=1.0,
            activation_passes=0.0,
        )


PROFILES: dict[str, EngineProfile] = {
    p.name: p
    for p in (
        EngineProfile(
            "glassbox",
            eta_bw=0.64,
            eta_flops=0.60,
            eta_attn=0.42,
            moe_flops_factor=0.5,
            step_overhead_s=0.05e-3,
            seq_overhead_s=21.2e-6,
            request_overhead_s=0.020,
            max_batched_tokens=8192,
            max_num_seqs=256,
            runtime_gib=1.0,
            kv_row_scales=True,
            weight_only=True,
            fitted_on="benchmarks/plan_vs_gpu.py on an H100 SXM (2026-11-26, bf16, dummy weights of real shapes): "
            "Llama-3.1-8B decode at batch 1 and 16, its 1K and 8K TTFTs, the host time per sequence of a "
            "batch-256 Qwen3-0.6B step; held out: the 4K TTFT (+13%) and a 256-request throughput run (-13%)",
        ),
        EngineProfile(
            "glassbox-cpu",
            # benchmarks/planner_cpu_fit.py on plan_vs_trace.py's run of 2026-11-28 16:44 (CPU time, 1 thread,
            # load 4-7): shares are of the probe's read rate (torch sum over 512 MiB) and bf16 matmul rate (AMX),
            # both per CPU-second, taken in the same run; host terms at that run's small-op time (host_op_s),
            # scaled by the op time of the hardware planned on (perf/cpu_clock.py)
            eta_bw=1.068,
            eta_flops=0.773,
            eta_attn=0.115,
            moe_flops_factor=0.5,
            step_overhead_s=4.5e-6,
            overlap=False,
            request_overhead_s=0.00121,
            max_batched_tokens=2048,
            max_num_seqs=256,
            runtime_gib=0.5,
            kv_row_scales=True,
            prompt_prep_bytes_per_weight=8.0,  # the design's copies (perf/cpu_terms.py), not fitted
            dequant_tail_bytes_per_value=213.3,
            # the tiles multiply on AMX and run every prompt since 2026-11-28 (after the fit): their share of
            # oneDNN's packed AMX GEMM measured, not fitted: 0.64-0.96 over 64-512 rows, 3072 x 1024 and
            # 1024 x 3072, 1 thread (benchmarks/bf16_prefill.py), 0.8 taken
            prompt_prep_rows=1 << 30,
            tile_flops_share=0.8,
            prompt_layer_overhead_s=1.142e-3,
            block_gemv_factor=0.502,
            activation_passes=53.1,
            host_op_s=6.195e-6,
            fitted_on="benchmarks/planner_cpu_fit.py on glassbox's own runs on a 2-core Xeon with AMX (2026-11-28, "
            "one thread, CPU time, probe in the same run): SmolLM2-135M Q4_1 GGUF, the demo model and a "
            "Qwen3-0.6B-shaped bf16 model, prefill of 16-1,024 tokens, TTFT and decode "
            "(benchmarks/results/planner-cpu-fit-2026-11-28.md)",
        ),
        EngineProfile(
            "vllm",
            eta_bw=0.680,
            eta_flops=0.48,  # tied to SGLang's (the same GEMM libraries): no dense prefill row of its own
            moe_flops_factor=0.350,
            step_overhead_s=0.001,
            request_overhead_s=0.0112,
            max_batched_tokens=8192,
            max_num_seqs=256,
            runtime_gib=2.0,
            native_fp4=True,  # FlashInfer-CUTLASS NVFP4 GEMMs for dense linears on sm_121
            native_fp4_moe=False,  # MoE experts on Marlin (weight-only, widened to bf16) on sm_121
            fitted_on="perf/spark_rows.py (fit rows): Nemotron 3 Super NVFP4 decode 23.2, TTFT 0.42 s (58 tok) "
            "/ 3.85 s (7,234 tok) (BRIEF); Llama 3.1 8B FP8 (NIM vLLM) decode 22.1, TTFT 54 ms (29 tok); "
            "held out: Llama 3.3 70B NVFP4 decode and 32K TTFT (benchmarks/results/planner-fit-*.md)",
        ),
        EngineProfile(
            "trt-llm",
            eta_bw=0.718,
            eta_flops=0.48,  # tied to SGLang's: no prefill row of its own
            moe_flops_factor=0.58,  # SGLang's former MoE factor: no MoE prefill row
            step_overhead_s=0.0005,
            request_overhead_s=0.0049,
            max_batched_tokens=8192,
            max_num_seqs=256,
            runtime_gib=2.0,
            native_fp4=True,
            native_fp4_moe=True,  # TensorRT-LLM's FP4 grouped GEMMs for NVFP4 experts
            fitted_on="perf/spark_rows.py (fit rows): Llama 3.1 8B NVFP4 decode 38.65 (NVIDIA's Spark post), "
            "TTFT 30.8 ms (29 tok); held out: Qwen3 235B NVFP4 on two Sparks, 11.73 tok/s",
        ),
        EngineProfile(
            "sglang",
            eta_bw=0.636,
            eta_flops=0.48,
            moe_flops_factor=0.58,
            step_overhead_s=0.001,
            request_overhead_s=0.030,
            max_batched_tokens=8192,
            max_num_seqs=256,
            runtime_gib=2.0,
            native_fp4=True,
            fitted_on="BRIEF: Llama 3.1 8B FP8 prefill 7,991, decode 20.5 (batch 1) / 368 (batch 32)",
        ),
        EngineProfile(
            "llama.cpp",
            eta_bw=0.82,
            eta_flops=0.123,
            # f16 flash attention at the FLOP/s its int8 MMQ GEMMs reach (0.123 x 250 = 31 TFLOP/s), not at
            # 0.123 of the f16 peak: tied to eta_flops in the BRIEF fit, never fitted on depth rows.
            eta_attn=0.245,
            moe_flops_factor=0.725,
            step_overhead_s=0.0005,
            request_overhead_s=0.010,
            max_batched_tokens=2048,
            max_num_seqs=4,
            runtime_gib=0.8,
            gguf=True,
            mixed_rest_format="q8_0",
            fitted_on="BRIEF: GPT-OSS 20B MXFP4 pp2048 3,783 / tg32 84.1; Qwen2.5-Coder 7B Q8_0 2,276 / 29.3",
        ),
        EngineProfile(
            "ollama",
            eta_bw=0.81,
            eta_flops=0.46,
            moe_flops_factor=0.146,
            step_overhead_s=0.0005,
            request_overhead_s=0.050,
            max_batched_tokens=512,
            max_num_seqs=1,
            runtime_gib=0.8,
            gguf=True,
            fitted_on="BRIEF: Llama 3.1 8B Q4_K_M 7,614 / 38; GPT-OSS 20B MXFP4 3,224 / 58",
        ),
        EngineProfile(
            "ideal",
            eta_bw=1.0,
            eta_flops=1.0,
            moe_flops_factor=1.0,
            step_overhead_s=0.0,
            request_overhead_s=0.0,
            max_batched_tokens=0,
            max_num_seqs=1 << 20,
            runtime_gib=0.0,
            native_fp4=True,
            native_fp4_moe=True,
            kernel_factors=False,
            fitted_on="the roofline: datasheet bandwidth and FLOP/s, no overheads",
        ),
    )
}

ENGINE_CHOICES = tuple(PROFILES)


def get_engine(name: str) -> EngineProfile:
    """A profile by name; raises ValueError naming ``--engine`` and the allowed values."""
    key = name.lower()
    if key not in PROFILES:
        raise ValueError(f"--engine must be one of {', '.join(ENGINE_CHOICES)}, got {name!r}")
    return PROFILES[key]
