"""Published DGX Spark measurements the engine profiles are fitted on and held against.

Each row names its source beside the figure. ``split`` was set before any fit: ``fit`` rows set the
profile's constants (perf/calibrate.py), ``held`` rows never do and are the check. Where a source gives no
prompt length, 2,048 tokens is assumed (llama-bench pp2048, NVIDIA's ISL 2048); decode rows give the depth
of the cache they ran at. ``tp`` > 1: ranks on that many Sparks over 200 GbE RoCE.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Row:
    """One published measurement: ``kind`` is decode (tok/s, aggregate over ``batch``), prefill (tok/s),
    ttft (s, prefill plus the engine's request overhead) or tp_speedup (decode at ``tp`` ranks over
    decode on one box, the same engine and settings)."""

    engine: str
    model: str
    quant: str
    kind: str
    measured: float
    split: str  # "fit", "held" or "excluded" (a reason beside the row)
    source: str
    prompt: int = 2048
    context: int = 0
    batch: int = 1
    tp: int = 1

    @property
    def label(self) -> str:
        extra = f" b{self.batch}" if self.batch > 1 else ""
        extra += f" TP{self.tp}" if self.tp > 1 else ""
        at = f" @d{self.context}" if self.context and self.kind != "decode" else ""
        size = f" p{self.prompt}" if self.kind != "decode" else f" d{self.context}"
        return f"{self.engine} {self.model} {self.quant} {self.kind}{size}{at}{extra}"


BRIEF = "BRIEF.md (shared/BRIEF.md: published Spark measurements)"
LLAMA_CPP_BENCH = (
    "github.com/ggml-org/llama.cpp/blob/4c7e9893c4ca8eec35d032726d14b74fae76cff8/benches/dgx-spark.md "
    "(llama-bench build 2f68ce7cf, fa 1, ub 2048)"
)
NVIDIA_BLOG = (
    "developer.nvidia.com 'How NVIDIA DGX Spark's Performance Enables Intensive AI Tasks' (ISL/OSL 2048/128, BS 1), "
    "as tabulated at site-one-liart-13.vercel.app/en/benchmarks/2026-05-24-dgx-spark-model-throughput"
)
FIELD_NOTES = "manavsehgal.github.io/ai-field-notes/articles/trtllm-and-triton-on-spark (29-token prompt, 200 greedy tokens)"
SPARK_ARENA = "Spark Arena leaderboard, as reported by sectorhq.co 'Nvidia DGX Spark Boosts Open-Weight LLM Performance'"
CONSELARA = "conselara.dev/notes/dgx-spark-benchmarks (vLLM 0.19, NGC 26.04)"
PLAYBOOK_79 = "github.com/NVIDIA/dgx-spark-playbooks/issues/79 and pull/91 (vLLM 26.02/26.06, 4.0-4.2 tok/s)"
ISSUE_41 = "glassbox issue 41 (the published 32K-prompt run as the issue quotes it; its primary source not found here)"

ROWS: tuple[Row, ...] = (
    # Ollama (ggml): BRIEF only; two models, so leave-one-out is each predicted from the other
    Row("ollama", "llama-3.1-8b", "q4_k_m", "prefill", 7614, "fit", BRIEF),
    Row("ollama", "llama-3.1-8b", "q4_k_m", "decode", 38, "fit", BRIEF),
    Row("ollama", "gpt-oss-20b", "mxfp4", "prefill", 3224, "fit", BRIEF),
    Row("ollama", "gpt-oss-20b", "mxfp4", "decode", 58, "fit", BRIEF),
    # llama.cpp: fitted on BRIEF's two models; every other model and every depth row held out
    Row("llama.cpp", "gpt-oss-20b", "mxfp4", "prefill", 3782.76, "fit", LLAMA_CPP_BENCH),
    Row("llama.cpp", "gpt-oss-20b", "mxfp4", "decode", 84.10, "fit", LLAMA_CPP_BENCH),
    Row("llama.cpp", "qwen2.5-coder-7b", "q8_0", "prefill", 2276.28, "fit", LLAMA_CPP_BENCH),
    Row("llama.cpp", "qwen2.5-coder-7b", "q8_0", "decode", 29.30, "fit", LLAMA_CPP_BENCH),
    Row("llama.cpp", "gpt-oss-120b", "mxfp4", "prefill", 1937.54, "held", LLAMA_CPP_BENCH),
    Row("llama.cpp", "gpt-oss-120b", "mxfp4", "decode", 59.02, "held", LLAMA_CPP_BENCH),
    Row("llama.cpp", "qwen3-30b-a3b", "q8_0", "prefill", 3175.62, "held", LLAMA_CPP_BENCH),
    Row("llama.cpp", "qwen3-30b-a3b", "q8_0", "decode", 60.92, "held", LLAMA_CPP_BENCH),
    Row("llama.cpp", "gemma-3-4b", "q4_0", "prefill", 5713.05, "held", LLAMA_CPP_BENCH),
    Row("llama.cpp", "gemma-3-4b", "q4_0", "decode", 78.97, "held", LLAMA_CPP_BENCH),
    Row("llama.cpp", "gpt-oss-20b", "mxfp4", "prefill", 1899.37, "held", LLAMA_CPP_BENCH, context=32768),
    Row("llama.cpp", "gpt-oss-20b", "mxfp4", "decode", 59.85, "held", LLAMA_CPP_BENCH, context=32768),
    Row("llama.cpp", "qwen2.5-coder-7b", "q8_0", "prefill", 1283.36, "held", LLAMA_CPP_BENCH, context=32768),
    Row("llama.cpp", "qwen2.5-coder-7b", "q8_0", "decode", 22.70, "held", LLAMA_CPP_BENCH, context=32768),
    Row("llama.cpp", "gpt-oss-20b", "mxfp4", "prefill", 3670.42, "held", NVIDIA_BLOG),
    Row("llama.cpp", "gpt-oss-20b", "mxfp4", "decode", 82.74, "held", NVIDIA_BLOG),
    # SGLang: BRIEF's one model (no second SGLang model with a preset shape was found)
    Row("sglang", "llama-3.1-8b", "fp8", "prefill", 7991, "fit", BRIEF),
    Row("sglang", "llama-3.1-8b", "fp8", "decode", 20.5, "fit", BRIEF, context=2048),
    Row("sglang", "llama-3.1-8b", "fp8", "decode", 368, "fit", BRIEF, context=1536, batch=32),
    # vLLM: BRIEF's Nemotron and NIM's vLLM FP8 8B fitted; the dense 70B and gpt-oss-120b held out
    Row("vllm", "nemotron-3-super-120b-a12b", "nvfp4", "decode", 23.2, "fit", BRIEF, context=1000),
    Row("vllm", "nemotron-3-super-120b-a12b", "nvfp4", "ttft", 0.42, "fit", BRIEF, prompt=58),
    Row("vllm", "nemotron-3-super-120b-a12b", "nvfp4", "ttft", 3.85, "fit", BRIEF, prompt=7234),
    Row("vllm", "llama-3.1-8b", "fp8", "decode", 22.1, "fit", FIELD_NOTES + ", NIM (vLLM 0.10.1) FP8"),
    Row(
        "vllm",
        "llama-3.1-8b",
        "fp8",
        "ttft",
        0.054,
        "fit",
        FIELD_NOTES + ", NIM (vLLM 0.10.1) FP8",
        prompt=29,
    ),
    Row("vllm", "llama-3.3-70b", "nvfp4", "decode", 4.1, "held", PLAYBOOK_79, context=1000),
    # above the bf16-attention roofline (5.0 GB a token: 54.6 tok/s at 273 GB/s), so the runs used something
    # the sources do not state (speculation, quantized attention): excluded from fits and errors
    Row("vllm", "gpt-oss-120b", "mxfp4", "decode", 58.82, "excluded", SPARK_ARENA),
    Row("vllm", "gpt-oss-120b", "mxfp4", "decode", 58.5, "excluded", CONSELARA + ", 57-60 tok/s pure decode"),
    Row("vllm", "llama-3.3-70b", "nvfp4", "ttft", 33.0, "held", ISSUE_41, prompt=32768),
    # two Sparks (TP=2): the per-step sync across boxes is fitted on gpt-oss-120b's TP=2 / TP=1 decode ratio
    # (75.96 / 58.82 = 1.291: whatever lifted both runs above the roofline divides out); the rest held out
    Row("vllm", "gpt-oss-120b", "mxfp4", "tp_speedup", 75.96 / 58.82, "fit", SPARK_ARENA, tp=2),
    Row("vllm", "llama-3.3-70b", "nvfp4", "ttft", 21.0, "held", ISSUE_41, prompt=32768, tp=2),
    Row(
        "vllm",
        "qwen3-235b-a22b",
        "int4",
        "decode",
        17.0,
        "held",
        CONSELARA + ", GPTQ-Int4 Marlin, TP2 EP2",
        tp=2,
    ),
    # TensorRT-LLM: the 8B NVFP4 fitted; the dual-Spark 235B held out
    Row("trt-llm", "llama-3.1-8b", "nvfp4", "decode", 38.65, "fit", NVIDIA_BLOG),
    Row("trt-llm", "llama-3.1-8b", "nvfp4", "ttft", 0.0308, "fit", FIELD_NOTES, prompt=29),
    Row("trt-llm", "llama-3.1-8b", "nvfp4", "decode", 38.8, "held", FIELD_NOTES),
    Row("trt-llm", "qwen3-235b-a22b", "nvfp4", "decode", 11.73, "held", NVIDIA_BLOG + ", dual Spark", tp=2),
)


def rows(engine: str | None = None, split: str | None = None, kinds: tuple[str, ...] = ()) -> list[Row]:
    """The rows of one engine (all: None), one split, and the given kinds (all: ())."""
    return [
        r
        for r in ROWS
        if (engine is None or r.engine == engine)
        and (split is None or r.split == split)
        and (not kinds or r.kind in kinds)
    ]


# llama-batched-bench on a Spark (the same file as LLAMA_CPP_BENCH): PP 512, TG 32, B sequences decoding
# together, aggregate S_TG tok/s. Held out (never fitted): the check of the expected union of experts a
# batch reads (cost_model.expected_distinct_experts) against published batched MoE decode; the dense 7B
# is the control. Reported by benchmarks/planner_fit.py, not part of the MAPEs above.
BATCHED_DECODE: dict[tuple[str, str], tuple[float, ...]] = {
    ("gpt-oss-20b", "mxfp4"): (81.11, 95.00, 151.90, 254.09, 400.94, 614.82),
    ("gpt-oss-120b", "mxfp4"): (57.28, 60.35, 95.08, 146.65, 220.02, 312.56),
    ("qwen3-30b-a3b", "q8_0"): (57.63, 64.11, 102.01, 154.91, 232.98, 345.01),
    ("qwen2.5-coder-7b", "q8_0"): (29.24, 54.46, 104.33, 195.67, 335.01, 593.27),
}
BATCH_SIZES = (1, 2, 4, 8, 16, 32)
BATCHED_CONTEXT = 512 + 16  # the prompt plus half of the 32 decoded tokens
