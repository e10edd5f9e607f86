"""`glassbox serve`'s flags for several models behind one server (argparse only: `serve --help` stays light)."""

from __future__ import annotations

import argparse


def add_router_args(p: argparse.ArgumentParser) -> None:
    g = p.add_argument_group(
        "several models (one process per model, loaded on first use: docs/models-store.md)"
    )
    g.add_argument(
        "--models",
        action="append",
        default=None,
        metavar="NAMES",
        help="serve these models (comma-separated or repeated): Hugging Face repo ids (org/repo, org/repo:QUANT) "
        "or Ollama names found on disk, or paths; a request's 'model' picks one, loaded on first use",
    )
    g.add_argument(
        "--models-dir",
        default=None,
        metavar="DIR",
        help="serve every model in DIR: its Hugging Face model directories and GGUF files, named by their "
        "folder or file name",
    )
    g.add_argument(
        "--max-loaded-models",
        type=int,
        default=4,
        metavar="N",
        help="at most N models loaded at once; loading one more unloads the least recently used idle one",
    )
    g.add_argument(
        "--idle-unload-seconds",
        type=float,
        default=None,
        metavar="S",
        help="unload a model no request has used for S seconds (default: keep it loaded)",
    )
    g.add_argument(
        "--models-memory-gib",
        type=float,
        default=None,
        metavar="GIB",
        help="memory all loaded models may hold together; a model whose plan does not fit beside the loaded "
        "ones evicts idle ones, else is refused (default: the host's RAM, or the GPU's memory, x "
        "--memory-utilization)",
    )
    g.add_argument(
        "--model-load-timeout",
        type=float,
        default=600.0,
        metavar="S",
        help="seconds a model's process may take to start before its load fails",
    )
