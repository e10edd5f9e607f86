"""`glassbox bench URL --depth ...`: the llama-benchy table of a server (flags in bench/bench_cli.py)."""

from __future__ import annotations

import argparse
import json
import random
import sys
import time
from pathlib import Path
from typing import Any

DEFAULT_PP, DEFAULT_TG = 2048, 32  # llama-benchy's --pp and --tg defaults


def int_list(flag: str, text: str, least: int) -> list[int]:
    """A comma list of integers >= ``least`` (ValueError naming the flag)."""
    try:
        values = [int(x) for x in text.split(",") if x.strip()]
    except ValueError:
        raise ValueError(f"{flag} takes comma-separated integers, got {text!r}") from None
    if not values or any(v < least for v in values):
        raise ValueError(f"{flag} values must be integers >= {least}, got {text!r}")
    return values


def depth_list(text: str) -> list[int]:
    """--depth: comma-separated integers >= 0."""
    return int_list("--depth", text, 0)


def _check(args: argparse.Namespace) -> None:
    for flag, value in (
        ("--rate", args.rate),
        ("--workload", args.workload),
        ("--dataset", args.dataset),
        ("--compare-plan", args.compare_plan),
        ("--shared-prefix-tokens", args.shared_prefix_tokens),
        ("--duration", args.duration),
        ("--num-requests", args.num_requests),
    ):
        if value is not None:
            raise ValueError(f"--depth runs llama-benchy's tests; it does not take {flag}")
    if args.runs < 1:
        raise ValueError(f"--runs must be at least 1, got {args.runs}")
    if args.timeout <= 0:
        raise ValueError(f"--timeout must be positive, got {args.timeout}")


def build_plan(args: argparse.Namespace) -> tuple[Any, dict[str, Any]]:
    """The BenchyPlan and report metadata, after asking the server about itself."""
    import httpx

    from glassbox.bench.benchy import BenchyPlan
    from glassbox.bench.client import RequestOptions, probe_server
    from glassbox.bench.tokens import (
        EstimateTokenCounter,
        LocalTokenCounter,
        ServerTokenCounter,
        TokenCounter,
        calibrate,
    )

    _check(args)
    depths = depth_list(args.depth)
    concurrency = int_list("--concurrency", args.concurrency, 1) if args.concurrency else [1]
    pp, tg = args.prompt_tokens or DEFAULT_PP, args.output_tokens or DEFAULT_TG
    if pp < 1 or tg < 1:
        raise ValueError(f"--prompt-tokens and --output-tokens must be >= 1, got {pp} and {tg}")
    url = args.url.rstrip("/").removesuffix("/v1")
    if not url.startswith(("http://", "https://")):
        raise ValueError(f"URL must start with http:// or https://, got {args.url!r}")
    seed = args.seed if args.seed is not None else random.SystemRandom().randrange(2**31)
    headers = {"Authorization": f"Bearer {args.api_key}"} if args.api_key else {}
    with httpx.Client(timeout=30.0, headers=headers) as client:
        try:
            info = probe_server(client, url, args.model)
        except httpx.HTTPError as e:
            raise ValueError(f"cannot reach {url}/v1/models: {e}") from None
        counter: TokenCounter
        if args.tokenizer:
            counter = LocalTokenCounter(args.tokenizer)
        else:
            server_counter = ServerTokenCounter(client, url, info.model)
            counter = server_counter if server_counter.available() else EstimateTokenCounter()
        builder = calibrate(counter, seed=seed)
    opts = RequestOptions(
        url,
        info.model,
        endpoint=args.endpoint,
        fixed_output=args.fixed_output,
        temperature=args.temperature,
        timeout_s=args.timeout,
        api_key=args.api_key,
    )
    plan = BenchyPlan(depths, concurrency, pp, tg, args.runs, args.latency_mode, builder, opts, seed)
    meta = {
        "url": url,
        "model": info.model,
        "endpoint": args.endpoint,
        "max_model_len": args.max_model_len or info.max_model_len,
        "prompt_length_source": builder.source,
        "prompt_lengths_exact": builder.exact,
        "latency_mode": args.latency_mode,
        "runs": args.runs,
        "seed": seed,
        "date": time.strftime("%Y-%m-%d %H:%M:%S"),
    }
    return plan, meta


def footer(meta: dict[str, Any], source: str) -> str:
    """The two lines llama-benchy prints under its table, naming what made this one."""
    latency = meta.get("latency_ms")
    lat = f" ({latency:.2f} ms)" if isinstance(latency, float) else ""
    return f"{source}\ndate: {meta['date']} | latency mode: {meta.get('latency_mode', 'none')}{lat}"


def run_depths(args: argparse.Namespace) -> int:
    """Entry point of `glassbox bench URL --depth ...`."""
    from glassbox.bench.benchy import run_benchy
    from glassbox.bench.benchy_table import markdown, rows

    plan, meta = build_plan(args)
    tests, latency = run_benchy(plan)
    meta["latency_ms"] = latency * 1e3
    table = rows(meta["model"], tests)
    failed = [f"depth {t.depth} c{t.concurrency}: {t.failed} failed ({t.error})" for t in tests if t.failed]
    result = {"meta": meta, "benchy": table, "failures": failed}
    text = markdown(table) + "\n\n" + footer(meta, "glassbox bench (llama-benchy's table)") + "\n"
    if args.out:
        out = Path(args.out)
        out.mkdir(parents=True, exist_ok=True)
        (out / "benchy.md").write_text(text)
        (out / "benchy.json").write_text(json.dumps(result, indent=2) + "\n")
    if args.json:
        sys.stdout.write(json.dumps(result, indent=2) + "\n")
    else:
        sys.stdout.write(text + "".join(f"warning: {f}\n" for f in failed))
    return 0
