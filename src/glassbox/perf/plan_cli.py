"""``glassbox plan MODEL --hardware H --quant Q``: will it fit, and how will it feel (rich tables or --json)."""

from __future__ import annotations

import argparse
import json
import sys
from typing import Any

from glassbox.perf.engine_profiles import ENGINE_CHOICES
from glassbox.perf.hardware import HARDWARE_CHOICES
from glassbox.perf.memory_plan import KV_DTYPES
from glassbox.perf.model_presets import PRESETS as MODEL_PRESETS
from glassbox.perf.planner import PlanRequest, plan
from glassbox.perf.quant import QUANT_CHOICES
from glassbox.perf.tensor_parallel import INTERCONNECT_CHOICES


def add_parser(subparsers: argparse._SubParsersAction) -> None:
    """Register the ``plan`` subcommand."""
    p = subparsers.add_parser(
        "plan",
        help="predict memory fit, prefill, decode, TTFT and concurrency on any hardware",
        description="Predict memory fit, prefill, decode, TTFT and concurrency for MODEL on hardware you may "
        "not have, from bytes moved and FLOPs (roofline) and fitted engine efficiencies.",
    )
    p.add_argument(
        "model", metavar="MODEL", help=f"preset ({', '.join(MODEL_PRESETS)}) or path to config.json/dir"
    )
    p.add_argument("--hardware", required=True, help=f"one of {', '.join(HARDWARE_CHOICES)}")
    p.add_argument(
        "--quant", default="native", help=f"weight format: {', '.join(QUANT_CHOICES)} (default native)"
    )
    p.add_argument("--engine", default="glassbox", help=f"efficiency profile: {', '.join(ENGINE_CHOICES)}")
    p.add_argument(
        "--prompt-tokens",
        type=int,
        default=None,
        help="new prompt tokens per request (default 1024; with --depth llama-benchy's pp, 2048)",
    )
    p.add_argument(
        "--output-tokens",
        type=int,
        default=None,
        help="generated tokens per request (default 256; with --depth llama-benchy's tg, 32)",
    )
    p.add_argument(
        "--depth",
        default=None,
        help="context depths, e.g. 0,4096,16384: print llama-benchy's pp/tg table predicted (c requests "
        "at once per --concurrency level, each depth + --prompt-tokens fresh tokens), as `glassbox bench "
        "--depth` measures it",
    )
    p.add_argument("--context", type=int, default=0, help="tokens already in the KV cache before the request")
    p.add_argument("--concurrency", default="1,4,16", help="comma list of concurrent users (default 1,4,16)")
    p.add_argument("--rate", default="", help="comma list of Poisson arrival rates in requests/s")
    p.add_argument("--memory-utilization", type=float, default=0.9, help="share of memory the engine may use")
    p.add_argument("--kv-cache-dtype", default="auto", help=f"one of {', '.join(KV_DTYPES)}")
    p.add_argument(
        "--spec-tokens",
        type=int,
        default=0,
        help="speculative decoding: drafts verified per decode step (with --acceptance-rate)",
    )
    p.add_argument(
        "--acceptance-rate",
        type=float,
        default=None,
        help="speculative decoding: the chance that each draft is accepted (given the ones before it)",
    )
    p.add_argument(
        "--draft-model",
        default=None,
        help="speculative decoding: the drafts come from this model (preset or path), whose passes each "
        "step also pays (default: n-gram drafts, free)",
    )
    p.add_argument("--draft-quant", default="native", help="the draft model's weight format (as --quant)")
    p.add_argument(
        "--mtp",
        action="store_true",
        help="speculative decoding: the drafts come from the model's own multi-token-prediction layer "
        "(Qwen3-Next / Qwen3.5), whose pass (one decoder layer + LM head) each drafted token pays",
    )
    p.add_argument(
        "--tensor-parallel-size",
        type=int,
        default=1,
        help="ranks (boxes or GPUs) each holding 1/N of every layer; memory is per rank (needs --interconnect)",
    )
    p.add_argument(
        "--interconnect",
        default=None,
        help=f"link between ranks: {', '.join(INTERCONNECT_CHOICES)}; adds a TP 1/2/4 comparison",
    )
    p.add_argument(
        "--explain",
        action="store_true",
        help="also print the terms of each figure (bytes, FLOPs, rates, overheads, collectives)",
    )
    p.add_argument("--json", action="store_true", help="print the plan as JSON (always with its terms)")
    p.set_defaults(func=run)


def _int_list(text: str, flag: str) -> tuple[int, ...]:
    try:
        return tuple(int(x) for x in text.split(",") if x.strip())
    except ValueError:
        raise ValueError(f"{flag} must be a comma list of integers, got {text!r}") from None


def _float_list(text: str, flag: str) -> tuple[float, ...]:
    try:
        return tuple(float(x) for x in text.split(",") if x.strip())
    except ValueError:
        raise ValueError(f"{flag} must be a comma list of numbers, got {text!r}") from None


def _or(value: int | None, default: int) -> int:
    return default if value is None else value


def request_from_args(args: argparse.Namespace) -> PlanRequest:
    return PlanRequest(
        model=args.model,
        hardware=args.hardware,
        quant=args.quant,
        engine=args.engine,
        prompt_tokens=_or(args.prompt_tokens, 2048 if getattr(args, "depth", None) else 1024),
        output_tokens=_or(args.output_tokens, 32 if getattr(args, "depth", None) else 256),
        context_tokens=args.context,
        concurrency=_int_list(args.concurrency, "--concurrency"),
        rates=_float_list(args.rate, "--rate"),
        memory_utilization=args.memory_utilization,
        kv_cache_dtype=args.kv_cache_dtype,
        spec_tokens=args.spec_tokens,
        acceptance_rate=args.acceptance_rate,
        draft_model=args.draft_model,
        draft_quant=args.draft_quant,
        mtp=getattr(args, "mtp", False),
        tensor_parallel_size=args.tensor_parallel_size,
        interconnect=args.interconnect,
    )


def run(args: argparse.Namespace) -> int:
    """Entry point of ``glassbox plan``; returns the exit status."""
    if getattr(args, "depth", None) is not None:
        from glassbox.perf.benchy_plan import run_depths

        return run_depths(args, request_from_args(args))
    try:
        result = plan(request_from_args(args))
    except ValueError as exc:
        sys.stderr.write(f"glassbox plan: error: {exc}\n")
        return 2
    if args.json:
        sys.stdout.write(json.dumps(result, indent=2) + "\n")
    else:
        render(result, explain=getattr(args, "explain", False))
    return 0


def _fmt(value: Any, digits: int = 2) -> str:
    if value is None:
        return "-"
    if isinstance(value, float):
        return f"{value:,.{digits}f}"
    return f"{value:,}" if isinstance(value, int) else str(value)


def _bits(quant: dict[str, Any]) -> str:
    """Each parameter group's bits per weight (a GGUF file's as stored), one figure where all agree."""
    bits = quant["bits_per_weight"]
    if len(set(bits.values())) == 1:
        return f"{next(iter(bits.values())):.2f}"
    return ", ".join(f"{g} {b:.2f}" for g, b in bits.items())


def render(result: dict[str, Any], explain: bool = False) -> None:
    """Rich tables for people: memory, speed with its bound, concurrency and rate rows (and the terms)."""
    from rich.console import Console
    from rich.table import Table

    console = Console()
    m, hw, q, eng, wl = (
        result["model"],
        result["hardware"],
        result["quant"],
        result["engine"],
        result["workload"],
    )
    console.print(
        f"[bold]{m['name']}[/] ({m['model_type']}, {m['total_params'] / 1e9:.2f}B total, "
        f"{m['active_params'] / 1e9:.2f}B active; {m['attention']})\n"
        f"on [bold]{hw['name']}[/] ({hw['memory_gib']} GiB, {hw['bandwidth_gbs']:,.0f} GB/s), weights {q['scheme']} "
        f"({_bits(q)} bits per weight), "
        f"engine [bold]{eng['name']}[/] (eta_bw {eng['eta_bw']}, eta_flops {eng['eta_flops']})\n"
        f"request: {wl['context_tokens']} cached + {wl['prompt_tokens']} prompt + {wl['output_tokens']} output tokens"
    )
    mem = result["memory"]
    t = Table(title=f"Memory (GiB) for {mem['concurrency']} x {mem['seq_len_tokens']:,} tokens")
    t.add_column("item")
    t.add_column("GiB", justify="right")
    for key in ("weights", "kv_cache", "state", "activations", "runtime", "total"):
        t.add_row(key.replace("_", " "), _fmt(mem[f"{key}_gib"]))
    verdict = "[green]fits[/]" if mem["fits"] else "[red]does not fit[/]"
    t.add_row(f"budget ({wl['memory_utilization']:.0%} of memory)", _fmt(mem["budget_gib"]), end_section=True)
    t.add_row("verdict", verdict)
    t.add_row("KV bytes / token", _fmt(mem["kv_bytes_per_token"]))
    if mem.get("state_bytes_per_seq"):  # a hybrid model: recurrent layers hold a fixed state instead of KV
        t.add_row("state bytes / sequence", _fmt(mem["state_bytes_per_seq"]))
    t.add_row(f"max context at {mem['concurrency']} sequences", _fmt(mem["max_context_tokens"]))
    t.add_row(f"max sequences at {mem['seq_len_tokens']:,} tokens", _fmt(mem["max_concurrency"]))
    console.print(t)

    s = Table(title="Speed, one request")
    for col in ("phase", "predicted", "ceiling", "of ceiling", "bound"):
        s.add_column(col, justify="left" if col in ("phase", "bound") else "right")
    for phase in ("prefill", "decode"):
        d = result[phase]
        s.add_row(
            f"{phase} tok/s",
            _fmt(d["tok_s"], 1),
            _fmt(d["ceiling_tok_s"], 1),
            f"{d['tok_s'] / d['ceiling_tok_s']:.0%}",
            d["bound"],
        )
    spec = result.get("speculative")
    if spec:
        s.add_row(
            f"decode tok/s, {spec['spec_tokens']} drafts at {spec['acceptance_rate']:.0%}",
            _fmt(spec["tok_s"], 1),
            "",
            f"x{spec['speedup']:.2f}" if spec["speedup"] else "",
            f"{spec['bound']}, {spec['tokens_per_step']:.2f} tokens / step"
            + (f", draft {spec['draft_s'] / spec['step_s']:.0%} of it" if spec["draft_s"] else ""),
        )
    s.add_row("TTFT s", _fmt(result["ttft_s"], 3), "", "", "prefill + request overhead")
    console.print(s)

    if result["concurrency"]:
        c = Table(title="Concurrency (closed loop, simulated with the engine scheduler)")
        for col in ("users", "aggregate tok/s", "per request tok/s", "TTFT p50 s", "TTFT p99 s", "fits"):
            c.add_column(col, justify="right")
        for row in result["concurrency"]:
            c.add_row(
                _fmt(row["concurrency"]),
                _fmt(row["aggregate_tok_s"], 1),
                _fmt(row["per_request_tok_s"], 1),
                _fmt(row["ttft_s_p50"], 3),
                _fmt(row["ttft_s_p99"], 3),
                "yes" if row["fits"] else ("queues" if row["running"] else "no"),
            )
        console.print(c)
    if result["rate"]:
        r = Table(title="Arrival rate (Poisson, open loop)")
        for col in ("req/s", "aggregate tok/s", "per request tok/s", "TTFT p50 s", "TTFT p99 s", "state"):
            r.add_column(col, justify="right")
        for row in result["rate"]:
            state = "overloaded" if row.get("overloaded") else f"{row.get('load', 0):.0%} load"
            r.add_row(
                _fmt(row["rate_rps"], 3),
                _fmt(row.get("aggregate_tok_s"), 1),
                _fmt(row.get("per_request_tok_s"), 1),
                _fmt(row.get("ttft_s_p50"), 3),
                _fmt(row.get("ttft_s_p99"), 3),
                state,
            )
        console.print(r)
    if result.get("tensor_parallel"):
        _render_tp(console, result)
    if explain:
        from glassbox.perf.explain import render_explain

        render_explain(console, result)
    for warning in result["warnings"]:
        console.print(f"[yellow]warning: {warning}[/]")
    for note in m["notes"]:
        console.print(f"[dim]note: {note}[/]")
    console.print(f"[dim]engine profile: {eng['fitted_on']}[/]")


def _render_tp(console: Any, result: dict[str, Any]) -> None:
    from rich.table import Table

    link = result["workload"]["interconnect"]
    t = Table(
        title=f"Tensor parallelism over {link['name']} ({link['bandwidth_gbs']:g} GB/s per direction, "
        f"{link['latency_us']:g} us per ring step; memory and time per rank; AR = all-reduce)"
    )
    users = result["tensor_parallel"][0]["concurrency"]
    cols = (
        "TP",
        "GiB/rank",
        "fits",
        "prefill tok/s",
        "decode tok/s",
        "TTFT s",
        "AR us/layer decode",
        "AR us/layer prefill",
        "comm % decode",
        f"tok/s at {users} users",
    )
    for col in cols:
        t.add_column(col, justify="right")
    for row in result["tensor_parallel"]:
        t.add_row(
            _fmt(row["tensor_parallel_size"]),
            _fmt(row["weights_gib_per_rank"]),
            "yes" if row["fits"] else "no",
            _fmt(row["prefill_tok_s"], 1),
            _fmt(row["decode_tok_s"], 1),
            _fmt(row["ttft_s"], 3),
            _fmt(row["allreduce_us_per_layer_decode"], 1),
            _fmt(row["allreduce_us_per_layer_prefill"], 0),
            f"{row['decode_comm_share']:.1%}",
            _fmt(row["aggregate_tok_s"], 1),
        )
    console.print(t)
    console.print(f"[dim]link: {link['source']}[/]")
