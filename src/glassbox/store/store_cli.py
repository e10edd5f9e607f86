"""`glassbox list`, `glassbox show NAME`, `glassbox pull REPO[:QUANT]`: the models on disk (torch-free)."""

from __future__ import annotations

import argparse
import json
import sys
from typing import Any


def add_parser(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser(
        "list",
        help="the models found on disk (HF cache, Ollama's store, the bundled ones)",
        description="Every model found in the Hugging Face cache (HF_HUB_CACHE / HF_HOME), Ollama's store "
        "(OLLAMA_MODELS) and the bundled demo and default model: source, format, size, quantization, "
        "architecture, and whether glassbox can serve it (if not, why).",
    )
    p.add_argument("--json", action="store_true", help="print JSON")
    p.set_defaults(func=run_list)
    s = sub.add_parser(
        "show",
        help="one model's facts: description, chat template, capabilities",
        description="A model's facts: where it is, the planner's model description, its chat template and "
        "capabilities. NAME is a Hugging Face repo id (org/repo, org/repo:QUANT), an Ollama name "
        "(model:tag), 'glassbox-demo', or a path.",
    )
    s.add_argument("name", metavar="NAME")
    s.add_argument("--json", action="store_true", help="print JSON")
    s.set_defaults(func=run_show)
    u = sub.add_parser(
        "pull",
        help="download a model from the Hugging Face Hub into the HF cache",
        description="Download REPO (a Hugging Face repo id) into the Hugging Face cache with huggingface_hub "
        "(resumable, with progress bars; HF_TOKEN for gated and private repos, HF_ENDPOINT for a mirror), "
        "only the files needed: with :QUANT (or a GGUF-only repo) one GGUF checkpoint, else the config, "
        "safetensors and tokenizer files. The Hub's checksums are verified.",
    )
    u.add_argument("name", metavar="REPO[:QUANT]")
    u.add_argument("--revision", default=None, help="a branch, tag or commit (default: main)")
    u.add_argument("--json", action="store_true", help="print JSON")
    u.set_defaults(func=run_pull)


def run_list(args: argparse.Namespace) -> int:
    from glassbox.store.list_cache import rows
    from glassbox.store.listing import all_models

    found = rows(all_models())
    if args.json:
        print(json.dumps(found, indent=2))
        return 0
    from rich.console import Console
    from rich.table import Table

    table = Table(title="models found", title_justify="left")
    for column in ("name", "source", "format", "size", "quantization", "architecture"):
        table.add_column(column, no_wrap=column != "name")
    table.add_column("servable", overflow="fold")
    for r in found:
        servable = "yes" if r["servable"] else f"no: {r['reason']}"
        table.add_row(r["name"], r["source"], r["format"], _size(r["size"]), r["quantization"],
                      r["architecture"], servable)  # fmt: skip
    Console(width=None if sys.stdout.isatty() else 200).print(table)
    return 0


def run_show(args: argparse.Namespace) -> int:
    from glassbox.store.describe import describe
    from glassbox.store.listing import stored_model

    info = describe(stored_model(args.name), template=True)
    body = show_body(info)
    if args.json:
        print(json.dumps(body, indent=2, default=str))
        return 0
    out = sys.stdout
    row = body["model"]
    for key in ("name", "source", "path", "format", "size", "architecture", "quantization", "parameters",
                "context_length", "task"):  # fmt: skip
        value = _size(row[key]) if key == "size" else row[key]
        out.write(f"{key:15} {value}\n")
    out.write(f"{'capabilities':15} {', '.join(body['capabilities'])}\n")
    out.write(f"{'servable':15} {'yes' if row['servable'] else 'no: ' + str(row['reason'])}\n")
    if body["description"] is not None:
        out.write("description\n")
        for key, value in body["description"].items():
            out.write(f"  {key:13} {value}\n")
    for key in ("ollama_params", "ollama_system"):
        if body.get(key):
            out.write(f"{key}\n  {body[key]}\n")
    out.write("chat template\n" + (body["chat_template"] or "(none)") + "\n")
    return 0


def run_pull(args: argparse.Namespace) -> int:
    from glassbox.store.pull import pull

    got = pull(args.name, args.revision)
    body = {
        "name": got.name,
        "revision": got.revision,
        "files": [str(f) for f in got.files],
        "size": got.size,
    }
    if args.json:
        print(json.dumps(body, indent=2))
    else:
        print(f"pulled {got.name} ({len(got.files)} files, {_size(got.size)}) at {got.revision}")
        print(f"serve it with: glassbox serve {got.name}")
    return 0


def show_body(info: Any) -> dict[str, Any]:
    """`glassbox show --json`'s object: the list row, the planner's description, template, capabilities."""
    from glassbox.perf.planner import _model_dict as planner_description
    from glassbox.store.ollama_store import layer_text
    from glassbox.store.stored import OLLAMA

    body: dict[str, Any] = {
        "model": info.row(),
        "capabilities": info.capabilities(),
        "description": planner_description(info.facts) if info.facts is not None else None,
        "chat_template": info.chat_template,
        "metadata": info.metadata,
    }
    if info.model.source == OLLAMA:
        params = layer_text(info.model, "params")
        body["ollama_params"] = json.loads(params) if params else None
        body["ollama_system"] = layer_text(info.model, "system")
        body["ollama_template"] = layer_text(info.model, "template")
    return body


def _size(n: int) -> str:
    for unit, scale in (("GB", 1e9), ("MB", 1e6), ("KB", 1e3)):
        if n >= scale:
            return f"{n / scale:.1f} {unit}"
    return f"{n} B"
