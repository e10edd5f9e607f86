"""The `glassbox` command: serve, generate, chat, trace, plan, bench, hardware, list, show, pull."""

from __future__ import annotations

import argparse
import importlib
import logging
import sys

# subcommand modules, each with add_parser(subparsers); imported lazily-tolerant so one missing
# optional piece does not break the others
_SUBCOMMANDS = (
    "glassbox.server.serve_cli",
    "glassbox.generate_cli",
    "glassbox.trace_cli",
    "glassbox.perf.plan_cli",
    "glassbox.bench.bench_cli",
    "glassbox.perf.hardware_cli",
    "glassbox.store.store_cli",
)


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="glassbox", description="LLM inference you can see through.")
    parser.add_argument("--log-level", default="WARNING", help="logging level (DEBUG, INFO, WARNING)")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    for name in _SUBCOMMANDS:
        try:
            module = importlib.import_module(name)
        except ModuleNotFoundError as e:
            if e.name != name:
                raise
            continue
        module.add_parser(sub)
    return parser


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    logging.basicConfig(
        level=getattr(logging, str(args.log_level).upper(), logging.WARNING),
        format="%(asctime)s %(levelname)s %(name)s: %(message)s",
    )
    if not getattr(args, "func", None):
        parser.print_help()
        return 2
    try:
        return int(args.func(args) or 0)
    except (ValueError, FileNotFoundError) as e:
        print(f"glassbox {args.command}: error: {e}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        return 130


if __name__ == "__main__":
    sys.exit(main())
