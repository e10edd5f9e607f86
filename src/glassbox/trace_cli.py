"""`glassbox trace PROMPT`: one request's six steps with measured figures, against the roofline."""

from __future__ import annotations

import argparse
import json
from typing import Any

from glassbox.engine_args import add_engine_args, config_from_args
from glassbox.perf.request_roofline import percent


def add_parser(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("trace", help="the anatomy of one request, phase by phase, vs this machine's roofline")
    add_engine_args(p)
    p.add_argument(
        "prompt", help="the prompt: one user message through the model's chat template, if it has one"
    )
    p.add_argument(
        "--raw", action="store_true", help="send the prompt as raw text, without the model's chat template"
    )
    p.add_argument("--max-tokens", type=int, default=64, help="tokens to generate (greedy)")
    p.add_argument("--no-roofline", action="store_true", help="skip the hardware probe and the ceilings")
    p.add_argument("--json", action="store_true", help="print the anatomy as JSON")
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    from glassbox.engine.llm_engine import LLMEngine
    from glassbox.trace import run_trace

    if args.max_tokens < 1:
        raise ValueError(f"--max-tokens must be >= 1, got {args.max_tokens}")
    engine = LLMEngine(config_from_args(args))
    hw = None
    if not args.no_roofline:
        from glassbox.models.model_config import dtype_name
        from glassbox.perf.probe import probe_local

        hw = probe_local(engine.executor.device.type, dtype_name(engine.executor.dtype))
    chat = not args.raw and engine.tokenizer.chat_template is not None
    # a warm-up request keeps one-time costs (allocator, kernels) out of the figures
    run_trace(engine, args.prompt, 2, None, chat)
    engine.block_manager.reset_prefix_cache()  # so that the measured request prefills its whole prompt
    result = run_trace(engine, args.prompt, args.max_tokens, hw, chat)
    if args.json:
        print(json.dumps(result, indent=2, ensure_ascii=False))
    else:
        render(result)
    return 0


def _ceiling(ph: dict[str, Any]) -> str:
    if "ceiling_tok_s" not in ph:
        return ""
    if "fraction" not in ph:  # the phase ran no token
        return f"{ph['bound']} ceiling {ph['ceiling_tok_s']:,.0f} tok/s"
    verdict = (
        f"{ph['bound']}-bound" if ph["limited_by"] == ph["bound"] else "overhead-bound (host, not hardware)"
    )
    return f"{percent(ph)} of the {ph['ceiling_tok_s']:,.0f} tok/s {ph['bound']} ceiling: {verdict}"


def render(r: dict[str, Any]) -> None:
    from rich.console import Console
    from rich.markup import escape
    from rich.table import Table

    ph = r["phases"]
    blocks = f", weights in blocks: {', '.join(r['weight_blocks'])}" if r.get("weight_blocks") else ""
    t = Table(title=f"glassbox trace — {r['model']} on {r['device']} ({r['dtype']}{blocks})")
    for col in ("step", "measured", "vs roofline"):
        t.add_column(col)
    pre, dec = ph["prefill"], ph["decode"]
    t.add_row("1 tokenize", f"{ph['tokenize']['tokens']} tokens in {ph['tokenize']['ms']:.2f} ms", "")
    t.add_row("  queue", f"{ph['queue']['ms']:.2f} ms", "")
    t.add_row(
        "2 prefill",
        f"{pre['tokens']} tokens ({pre['cached_tokens']} cached) in {pre['ms']:.1f} ms = "
        f"{pre['tok_s']:,.1f} tok/s",
        _ceiling(pre),
    )
    t.add_row("  first token", f"TTFT {ph['first_token']['ttft_ms']:.1f} ms", "")
    decoded = (
        f"{dec['tokens']} tokens in {dec['ms']:.1f} ms = {dec['tok_s']:,.1f} tok/s"
        + (f" in {dec['steps']} engine steps" if dec["steps"] < dec["tokens"] else "")
        + f"; ITL p50 {dec['itl_ms_p50']:.1f} ms, p99 {dec['itl_ms_p99']:.1f} ms"
        if dec["tokens"]
        else "none: the first token ended the request"
    )
    t.add_row("4 decode", decoded, _ceiling(dec))
    sd = r.get("speculative")
    if sd is not None:
        t.add_row(
            "  speculative",
            f"{sd['accepted_tokens']} of {sd['draft_tokens']} drafts accepted ({sd['acceptance_rate']:.0%}) in "
            f"{sd['verify_steps']} steps: {sd['mean_acceptance_length']:.2f} tokens / step",
            f"{sd['method']}, k = {sd['num_speculative_tokens']}"
            + (
                f"; the draft: {sd['draft_passes']} passes, {sd['draft_ms']:.1f} ms"
                if "draft_ms" in sd
                else ""
            ),
        )
    kv = r["kv_cache"]
    grew = " -> ".join(str(g["blocks"]) for g in kv["growth"])
    t.add_row(
        "3/5 KV cache",
        f"{kv['blocks']} blocks x {kv['block_size']} tokens = {kv['bytes'] / 1024:,.1f} KiB ({kv['dtype']})",
        f"grew {grew} blocks",
    )
    if "recurrent_state" in r:  # hybrid models: Mamba-2 / Gated DeltaNet layers hold a fixed state instead
        st = r["recurrent_state"]
        t.add_row(
            "  state",
            f"{st['bytes'] / 1024:,.1f} KiB in {st['layers']} recurrent layers ({st['dtype']})",
            f"fixed per sequence, rewritten each step; {st['checkpoints']} checkpoint rows for prefix caching",
        )
    if "moe" in r:
        moe = r["moe"]
        pm, dm = moe["prefill"], moe["decode"]
        t.add_row(
            "  experts read",
            f"prefill {pm['experts_read_per_layer']:.1f} of {moe['experts']} per layer "
            f"(uniform routing: {pm['expected_per_layer']:.1f}); decode "
            f"{dm['experts_read_per_layer_per_token']:.1f} per layer per token (top-{moe['top_k']})",
            f"{dm['expert_bytes_per_token'] / 1e6:,.1f} MB of experts per decoded token",
        )
    if "tensor_parallel" in r:
        tp = r["tensor_parallel"]
        t.add_row(
            "  tensor parallel",
            f"{tp['ranks']} ranks; in collectives on rank 0: prefill {tp['prefill']['share']:.0%} of "
            f"{tp['prefill']['step_ms']:.1f} ms, decode {tp['decode']['share']:.0%} of {tp['decode']['step_ms']:.1f} ms",
            f"{tp['decode']['collectives']} all-reduces / all-gathers in decode, "
            f"{tp['decode']['broadcast_ms']:.1f} ms of step broadcasts (waits for the other ranks included)",
        )
    t.add_row("6 detokenize", f"{ph['detokenize']['ms']:.2f} ms", "")
    t.add_row("end to end", f"{r['e2e_ms']:.1f} ms, finish_reason={r['finish_reason']}", "")
    console = Console()
    console.print(t)
    if "roofline" in r:
        rf = r["roofline"]
        console.print(
            f"roofline: {rf['bandwidth_gbs']:.1f} GB/s, {rf['tflops']:.2f} TFLOP/s {rf['dtype']} "
            f"({rf['source']}); weights {rf['weights']}; decode reads {dec['bytes_per_token'] / 1e6:,.1f} MB "
            "per token",
            markup=False,
        )
        for w in rf["warnings"]:
            console.print(f"[yellow]warning:[/yellow] {escape(w)}")
    how = "through the chat template" if r.get("chat_template") else "as raw text"
    console.print(f"[bold]prompt[/bold] ({how}): {escape(r['prompt'])}")
    answer = (
        r["text"]
        if r["text"]
        else f"(empty; {r['output_tokens']} token(s), finish_reason={r['finish_reason']})"
    )
    console.print(f"[bold]answer:[/bold] {escape(answer)}")
