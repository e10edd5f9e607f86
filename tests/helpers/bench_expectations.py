"""What a `glassbox bench` run must report, written here independently of src (the bench tests share it)."""

from __future__ import annotations

RUN_KEYS = {
    "concurrency",
    "rate",
    "prompt_tokens",
    "output_tokens",
    "completed",
    "failed",
    "errors",
    "duration_s",
    "request_rate",
    "output_tok_s",
    "total_tok_s",
    "ttft_s",
    "tpot_s",
    "itl_s",
    "e2e_s",
    "per_request_decode_tok_s",
    "prefill_tok_s",
    "server",
}
LATENCY_KEYS = ("ttft_s", "tpot_s", "itl_s", "e2e_s", "per_request_decode_tok_s", "prefill_tok_s")
