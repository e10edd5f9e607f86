"""The anatomy of one request, phase by phase, held against this machine's roofline."""

from __future__ import annotations

import uuid
from typing import Any

from glassbox.engine.llm_engine import LLMEngine
from glassbox.perf.simulator import percentile
from glassbox.sampling_params import SamplingParams

_DTYPE_KEYS = {"torch.bfloat16": "bfloat16", "torch.float16": "float16", "torch.float32": "float32"}


def decode_bytes_per_token(engine: LLMEngine, context_tokens: float) -> float:
    """Bytes one decode step must read for one sequence: the weights once, plus its KV cache."""
    ex = engine.executor
    mc = engine.model_config
    weights = float(ex.weight_bytes)
    if not mc.tie_word_embeddings:  # the input embedding is looked up, not streamed
        weights -= mc.vocab_size * mc.hidden_size * ex.dtype.itemsize
    return weights + context_tokens * mc.kv_bytes_per_token(ex.kv_dtype)


def flops_per_prefill_token(engine: LLMEngine, prompt_tokens: int) -> float:
    """Matmul FLOPs per prompt token (2 x params read by matmuls) plus average causal attention."""
    mc = engine.model_config
    linear = 2.0 * (mc.num_params - mc.vocab_size * mc.hidden_size * (0 if mc.tie_word_embeddings else 1))
    attn = 2.0 * 2 * mc.num_layers * mc.num_heads * mc.head_dim * (prompt_tokens + 1) / 2
    return linear + attn


def run_trace(engine: LLMEngine, prompt: str, max_tokens: int, roofline: Any | None) -> dict[str, Any]:
    """Run one request alone through ``engine`` and return its anatomy (stable JSON-ready dict).

    ``roofline`` is a perf.hardware.HardwareSpec (probed) or None to skip the ceilings.
    """
    rid = f"trace-{uuid.uuid4().hex[:8]}"
    params = SamplingParams(temperature=0.0, max_tokens=max_tokens)
    engine.add_request(rid, prompt, params)
    seq = engine.get_sequences(rid)[0]
    bs = engine.block_manager.block_size
    per_block = engine.executor.kv_plan.bytes_per_block
    growth: list[dict[str, int]] = []
    final = None
    step = 0
    while final is None:
        outs = engine.step()
        step += 1
        if not seq.is_finished and (not growth or growth[-1]["blocks"] != len(seq.block_table)):
            growth.append(
                {
                    "step": step,
                    "tokens": seq.num_computed_tokens,
                    "blocks": len(seq.block_table),
                    "bytes": len(seq.block_table) * per_block,
                }
            )
        for o in outs:
            if o.request_id == rid and o.finished:
                final = o
    m = final.metrics
    assert m is not None
    times = m.token_times
    itl = [b - a for a, b in zip(times, times[1:], strict=False)]
    decode_tokens = max(0, m.output_tokens - 1)
    prefill_tokens = m.prompt_tokens - m.cached_prompt_tokens
    result: dict[str, Any] = {
        "model": engine.model_name,
        "device": str(engine.executor.device),
        "dtype": _DTYPE_KEYS.get(str(engine.executor.dtype), str(engine.executor.dtype)),
        "prompt": prompt,
        "text": final.text,
        "finish_reason": final.finish_reason,
        "phases": {
            "tokenize": {"tokens": m.prompt_tokens, "ms": m.tokenize_s * 1e3},
            "queue": {"ms": m.queue_s * 1e3},
            "prefill": {
                "tokens": prefill_tokens,
                "cached_tokens": m.cached_prompt_tokens,
                "ms": m.prefill_s * 1e3,
                "tok_s": m.prefill_tok_s,
            },
            "first_token": {"ttft_ms": m.ttft_s * 1e3},
            "decode": {
                "tokens": decode_tokens,
                "ms": m.decode_s * 1e3,
                "tok_s": m.decode_tok_s,
                "itl_ms_p50": (percentile(itl, 0.5) if itl else 0.0) * 1e3,
                "itl_ms_p99": (percentile(itl, 0.99) if itl else 0.0) * 1e3,
            },
            "detokenize": {"ms": m.detokenize_s * 1e3},
        },
        "kv_cache": {
            "block_size": bs,
            "blocks": growth[-1]["blocks"] if growth else 0,
            "bytes": growth[-1]["bytes"] if growth else 0,
            "growth": growth,
        },
        "e2e_ms": m.e2e_s * 1e3,
    }
    if roofline is not None:
        _add_roofline(result, engine, roofline, m.prompt_tokens, m.output_tokens)
    return result


def _add_roofline(
    result: dict[str, Any], engine: LLMEngine, hw: Any, prompt_tokens: int, output_tokens: int
) -> None:
    bw = hw.bandwidth_bytes_s
    dtype = result["dtype"]
    key = {"bfloat16": "bf16", "float16": "fp16", "float32": "fp32"}[dtype]
    flops = hw.peak_flops(key)
    avg_ctx = prompt_tokens + output_tokens / 2
    bpt = decode_bytes_per_token(engine, avg_ctx)
    fpt = flops_per_prefill_token(engine, prompt_tokens)
    pre, dec = result["phases"]["prefill"], result["phases"]["decode"]
    pre["ceiling_tok_s"] = flops / fpt
    pre["fraction"] = pre["tok_s"] / pre["ceiling_tok_s"] if pre["ceiling_tok_s"] else 0.0
    pre["bound"] = "compute"
    pre["flops_per_token"] = fpt
    dec["ceiling_tok_s"] = bw / bpt
    dec["fraction"] = dec["tok_s"] / dec["ceiling_tok_s"] if dec["ceiling_tok_s"] else 0.0
    dec["bound"] = "memory"
    dec["bytes_per_token"] = bpt
    for ph in (pre, dec):
        # far under its ceiling a phase is paying for something the roofline does not count: on a small
        # model that is the host (Python, kernel dispatch), not bandwidth or FLOP/s
        ph["limited_by"] = ph["bound"] if ph["fraction"] >= 0.5 else "overhead"
    result["roofline"] = {
        "bandwidth_gbs": hw.bandwidth_gbs,
        "tflops": flops / 1e12,
        "dtype": key,
        "source": hw.source,
    }
