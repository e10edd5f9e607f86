"""`glassbox generate` and `glassbox chat`: offline generation from the command line."""

from __future__ import annotations

import argparse
import json
import sys

from glassbox.engine_args import add_engine_args, config_from_args
from glassbox.sampling_params import SamplingParams


def add_parser(sub: argparse._SubParsersAction) -> None:
    g = sub.add_parser("generate", help="generate a completion for one prompt")
    add_engine_args(g)
    g.add_argument("prompt", help="the prompt text")
    _sampling_args(g)
    g.add_argument("--json", action="store_true", help="print the result and its metrics as JSON")
    g.set_defaults(func=run_generate)
    c = sub.add_parser("chat", help="chat with a model in the terminal (uses its chat template)")
    add_engine_args(c)
    _sampling_args(c)
    c.add_argument("--system", default=None, help="a system message")
    c.set_defaults(func=run_chat)


def _sampling_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("--max-tokens", type=int, default=64)
    p.add_argument("--temperature", type=float, default=0.0)
    p.add_argument("--top-p", type=float, default=1.0)
    p.add_argument("--top-k", type=int, default=-1)


def _params(args: argparse.Namespace) -> SamplingParams:
    return SamplingParams(
        max_tokens=args.max_tokens,
        temperature=args.temperature,
        top_p=args.top_p,
        top_k=args.top_k,
        seed=args.seed,
    )


def run_generate(args: argparse.Namespace) -> int:
    from glassbox.llm import LLM

    llm = LLM.from_config(config_from_args(args))
    out = llm.generate([args.prompt], _params(args))[0]
    if args.json:
        print(
            json.dumps(
                {
                    "text": out.text,
                    "token_ids": out.token_ids,
                    "finish_reason": out.finish_reason,
                    "metrics": out.metrics.as_dict() if out.metrics else None,
                },
                indent=2,
            )
        )
    else:
        print(args.prompt + out.text)
    return 0


def run_chat(args: argparse.Namespace) -> int:
    from glassbox.llm import LLM

    llm = LLM.from_config(config_from_args(args))
    messages: list[dict[str, str]] = []
    if args.system:
        messages.append({"role": "system", "content": args.system})
    print("glassbox chat: type a message, an empty line or Ctrl-D to quit.", file=sys.stderr)
    while True:
        try:
            line = input("> ")
        except EOFError:
            return 0
        if not line.strip():
            return 0
        messages.append({"role": "user", "content": line})
        out = llm.chat(messages, _params(args))[0]
        print(out.text)
        messages.append({"role": "assistant", "content": out.text})
