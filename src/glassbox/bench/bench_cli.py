"""`glassbox bench URL`: measure prefill, decode and queueing of any OpenAI-compatible server under load."""

from __future__ import annotations

import argparse
import json
import logging
import random
import sys
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

logger = logging.getLogger(__name__)


def _int_list(flag: str, text: str) -> list[int]:
    try:
        values = [int(x) for x in text.split(",") if x.strip()]
    except ValueError:
        raise ValueError(f"{flag} takes comma-separated integers, got {text!r}") from None
    if not values or any(v < 1 for v in values):
        raise ValueError(f"{flag} values must be integers >= 1, got {text!r}")
    return values


def _float_list(flag: str, text: str) -> list[float]:
    try:
        values = [float(x) for x in text.split(",") if x.strip()]
    except ValueError:
        raise ValueError(f"{flag} takes comma-separated numbers, got {text!r}") from None
    if not values or any(v <= 0 for v in values):
        raise ValueError(f"{flag} values must be positive, got {text!r}")
    return values


def add_parser(sub: argparse._SubParsersAction) -> None:
    """Register `glassbox bench`."""
    from glassbox.bench.workloads import workload_names

    p = sub.add_parser(
        "bench",
        help="benchmark an OpenAI-compatible server: TTFT, TPOT, throughput vs load",
        description=__doc__,
    )
    p.add_argument("url", help="server base URL, e.g. http://127.0.0.1:8000 (a trailing /v1 is accepted)")
    p.add_argument("--model", default=None, help="model name to request (default: the first in /v1/models)")
    p.add_argument(
        "--endpoint",
        choices=["completions", "chat"],
        default="completions",
        help="/v1/completions (default; exact prompt lengths) or /v1/chat/completions",
    )
    load = p.add_argument_group("load")
    load.add_argument(
        "--concurrency",
        default=None,
        help="closed-loop concurrency levels, e.g. 1,2,4,8 (default 1,2,4,8 unless --rate is given)",
    )
    load.add_argument("--rate", default=None, help="open-loop Poisson request rates in req/s, e.g. 0.5,1,2")
    stop = load.add_mutually_exclusive_group()
    stop.add_argument(
        "--num-requests",
        type=int,
        default=None,
        help="requests per run (default: max(16, 4 x concurrency); max(16, 20 s x rate))",
    )
    stop.add_argument(
        "--duration", type=float, default=None, help="seconds per run instead of a request count"
    )
    load.add_argument("--warmup", type=int, default=2, help="unmeasured warm-up requests before each run")
    load.add_argument("--timeout", type=float, default=300.0, help="hard limit per request in seconds")
    load.add_argument(
        "--seed",
        type=int,
        default=None,
        help="seed of prompts and arrivals (default: random, so that a server's prefix cache "
        "never holds the prompts of an earlier benchmark; the report records it)",
    )
    benchy = p.add_argument_group("llama-benchy table (bench/benchy.py)")
    benchy.add_argument(
        "--depth",
        default=None,
        help="context depths, e.g. 0,4096,16384: llama-benchy's pp/tg table instead (c requests at once per "
        "--concurrency level, each depth + --prompt-tokens (default 2048) fresh tokens, --output-tokens "
        "(default 32) out)",
    )
    benchy.add_argument("--runs", type=int, default=3, help="with --depth: runs per test (default 3)")
    benchy.add_argument(
        "--latency-mode",
        default="api",
        choices=["api", "generation", "none"],
        help="with --depth: what est_ppt subtracts (GET /v1/models, a one-token request, or nothing)",
    )
    wl = p.add_argument_group("workload")
    wl.add_argument("--prompt-tokens", type=int, default=None, help="prompt length in tokens (default 256)")
    wl.add_argument("--output-tokens", type=int, default=None, help="output length in tokens (default 128)")
    wl.add_argument(
        "--workload",
        default=None,
        choices=workload_names(),
        help="grid: nine workloads (3 prompt x 3 output sizes, scaled to the context limit); "
        "shared-prefix: unique vs shared-prefix prompts; or one grid cell",
    )
    wl.add_argument("--dataset", default=None, help='JSONL file of {"prompt": ..., "output_tokens": N}')
    wl.add_argument(
        "--shared-prefix-tokens",
        type=int,
        default=None,
        help="tokens every prompt shares at its start (shows prefix caching)",
    )
    wl.add_argument(
        "--tokenizer",
        default=None,
        help="local HF tokenizer dir or .gguf file, when the server has no /tokenize",
    )
    wl.add_argument(
        "--max-model-len", type=int, default=None, help="the server's context limit, if it hides it"
    )
    wl.add_argument(
        "--no-fixed-output",
        dest="fixed_output",
        action="store_false",
        help="do not send ignore_eos/min_tokens (let the model stop on EOS)",
    )
    wl.add_argument("--temperature", type=float, default=0.0)
    out = p.add_argument_group("output")
    out.add_argument("--slo", default=None, help="objectives for goodput, e.g. ttft=0.5,tpot=0.05,e2e=10 (s)")
    out.add_argument("--out", default=None, help="directory for results.json/.csv, report.md and plots")
    out.add_argument("--json", action="store_true", help="print the results as JSON instead of tables")
    out.add_argument("--api-key", default=None, help="bearer token, if the server wants one")
    plan = p.add_argument_group("planner comparison")
    plan.add_argument(
        "--compare-plan",
        nargs="?",
        const="",
        default=None,
        metavar="MODEL",
        help="also run the planner for the same workloads and show predicted vs measured; MODEL "
        "is a planner preset or HF dir (default: the served model's name)",
    )
    plan.add_argument("--hardware", default="local", help="planner hardware: local (probe) or a preset name")
    plan.add_argument("--quant", default=None, help="planner weight format, e.g. native, bf16, fp8, q4_k_m")
    plan.add_argument("--engine", default="glassbox", help="planner efficiency profile (glassbox, vllm, ...)")
    p.set_defaults(func=run)


def _workloads(args: argparse.Namespace, max_len: int | None) -> list[Any]:
    from glassbox.bench.workloads import Workload, load_dataset, named_workloads

    if sum(x is not None for x in (args.workload, args.dataset)) > 1:
        raise ValueError("give one of --workload and --dataset")
    out_tokens = args.output_tokens or 128
    if args.dataset:
        return [load_dataset(args.dataset, out_tokens)]
    prompt_tokens = args.prompt_tokens or 256
    if args.workload:
        return named_workloads(args.workload, max_len, prompt_tokens, out_tokens, args.shared_prefix_tokens)
    prefix = args.shared_prefix_tokens or 0
    name = f"p{prompt_tokens}-o{out_tokens}" + (f"-shared{prefix}" if prefix else "")
    return [Workload(name, prompt_tokens, out_tokens, shared_prefix_tokens=prefix)]


def build(args: argparse.Namespace) -> tuple[Any, dict[str, Any], dict[str, Any] | None]:
    """The BenchPlan, report metadata and (with --compare-plan) the planner's prediction, from flags, after
    asking the server about itself."""
    import httpx

    from glassbox.bench.client import RequestOptions, probe_server
    from glassbox.bench.runner import BenchPlan
    from glassbox.bench.tokens import (
        EstimateTokenCounter,
        LocalTokenCounter,
        ServerTokenCounter,
        TokenCounter,
        calibrate,
    )
    from glassbox.bench.workloads import count_dataset

    url = args.url.rstrip("/").removesuffix("/v1")
    if not url.startswith(("http://", "https://")):
        raise ValueError(f"URL must start with http:// or https://, got {args.url!r}")
    if args.num_requests is not None and args.num_requests < 1:
        raise ValueError(f"--num-requests must be at least 1, got {args.num_requests}")
    if args.duration is not None and args.duration <= 0:
        raise ValueError(f"--duration must be positive, got {args.duration}")
    if args.timeout <= 0:
        raise ValueError(f"--timeout must be positive, got {args.timeout}")
    if args.seed is None:
        args.seed = random.SystemRandom().randrange(2**31)
    concurrency = _int_list("--concurrency", args.concurrency) if args.concurrency else []
    rates = _float_list("--rate", args.rate) if args.rate else []
    if not concurrency and not rates:
        concurrency = [1, 2, 4, 8]
    headers = {"Authorization": f"Bearer {args.api_key}"} if args.api_key else {}
    with httpx.Client(timeout=30.0, headers=headers) as client:
        try:
            info = probe_server(client, url, args.model)
        except httpx.HTTPError as e:
            raise ValueError(f"cannot reach {url}/v1/models: {e}") from None
        max_len = args.max_model_len or info.max_model_len
        counter: TokenCounter
        if args.tokenizer:
            counter = LocalTokenCounter(args.tokenizer)
        else:
            server_counter = ServerTokenCounter(client, url, info.model)
            counter = server_counter if server_counter.available() else EstimateTokenCounter()
        builder = calibrate(counter, seed=args.seed)
        workloads = _workloads(args, max_len)
        for w in workloads:
            if w.dataset:
                count_dataset(w, counter)
    for w in workloads:
        if max_len and w.prompt_tokens + w.output_tokens > max_len:
            logger.warning(
                "%s: %d + %d tokens exceed the context limit %d; the server will likely reject it",
                w.name,
                w.prompt_tokens,
                w.output_tokens,
                max_len,
            )
    opts = RequestOptions(
        url,
        info.model,
        endpoint=args.endpoint,
        fixed_output=args.fixed_output,
        temperature=args.temperature,
        timeout_s=args.timeout,
        api_key=args.api_key,
    )
    plan = BenchPlan(
        workloads,
        builder,
        opts,
        concurrency=concurrency,
        rates=rates,
        num_requests=args.num_requests,
        duration_s=args.duration,
        warmup=max(args.warmup, 0),
        seed=args.seed,
    )
    meta = {
        "url": url,
        "model": info.model,
        "endpoint": args.endpoint,
        "max_model_len": max_len,
        "prompt_length_source": builder.source,
        "prompt_lengths_exact": builder.exact,
        "fixed_output_requested": args.fixed_output,
        "seed": args.seed,
        "started_at": datetime.now(timezone.utc).isoformat(timespec="seconds"),
    }
    prediction = None
    if args.compare_plan is not None:
        from glassbox.bench.compare import predict

        prediction = predict(
            args.compare_plan or info.model,
            args.hardware,
            args.quant,
            args.engine,
            workloads,
            concurrency,
            rates,
        )
    return plan, meta, prediction


def run(args: argparse.Namespace) -> int:
    """Entry point of `glassbox bench`."""
    from rich.console import Console

    from glassbox.bench.report import print_tables, write_outputs
    from glassbox.bench.runner import run_plan
    from glassbox.bench.stats import parse_slo, summarize

    if args.depth is not None:
        from glassbox.bench.benchy_cli import run_depths

        return run_depths(args)
    slo = parse_slo(args.slo)
    plan, meta, prediction = build(args)
    err = Console(stderr=True)
    records, interrupted = run_plan(plan, err)
    meta["interrupted"] = interrupted
    meta["fixed_output_sent"] = plan.options.fixed_output
    result: dict[str, Any] = {"meta": meta, "runs": [summarize(r, slo) for r in records]}
    if prediction is not None:
        from glassbox.bench.compare import compare

        result["compare_plan"] = compare(prediction, result["runs"])
    paths = write_outputs(result, Path(args.out)) if args.out else []
    if args.json:
        sys.stdout.write(json.dumps(result, indent=2) + "\n")
    else:
        console = Console()
        if not console.is_terminal:
            console = Console(width=160)  # piped to a file: no terminal width to fit, keep the numbers whole
        print_tables(result, console)
        if result.get("compare_plan"):
            from glassbox.bench.compare import print_table

            print_table(result["compare_plan"], console)
    if paths:
        err.print(f"wrote {', '.join(p.name for p in paths)} to {args.out}")
    return 130 if interrupted else 0
