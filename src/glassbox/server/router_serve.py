"""`glassbox serve --models NAME,... | --models-dir DIR`: the models table, the memory budget, the app.

Each model is resolved at start (a name through the stores, a path as the operator gave it), read for its
plan (perf/model_fit.py) and refused at start when glassbox cannot serve it. Every engine flag given to
`serve` is passed on to each model's process, and each gets the KV cache its plan counted
(``--num-kv-blocks``) unless the flags size it. Torch-free (torch is imported only to read a GPU's size).
"""

from __future__ import annotations

import argparse
import asyncio
import logging
import os
import sys
import tempfile
from collections.abc import Callable, Coroutine
from pathlib import Path
from typing import Any

from glassbox.config import EngineConfig
from glassbox.engine_args import add_engine_args, config_from_args
from glassbox.models.config_reader import CONFIG_FILE
from glassbox.models.sources import resolve_model
from glassbox.perf.engine_profiles import get_engine
from glassbox.perf.hardware import GIB
from glassbox.perf.model_fit import Footprint, footprint
from glassbox.server.model_process import child_env
from glassbox.server.router import Router, RouterSettings, Served, mem_available
from glassbox.server.router_app import GateSettings, build_router_app
from glassbox.server.router_metrics import RouterMetrics
from glassbox.store.describe import ModelInfo, describe
from glassbox.store.gguf_files import checkpoints
from glassbox.store.listing import from_source, stored_model
from glassbox.store.stored import PATH, StoredModel

logger = logging.getLogger(__name__)

# serve's flags each model's process gets as given (beside the engine flags)
_SERVER_FLAGS = ("enable_auto_tool_choice", "tool_call_parser", "reasoning_parser", "max_queue_len",
                 "shutdown_timeout", "otlp_traces_endpoint")  # fmt: skip


def _listed(values: list[str] | None) -> list[str]:
    return [v.strip() for value in values or [] for v in value.split(",") if v.strip()]


def check_router_flags(args: argparse.Namespace) -> None:
    if args.model is not None:
        raise ValueError("give MODEL or --models/--models-dir, not both")
    if args.served_model_name is not None:
        raise ValueError("--served-model-name names one model; with --models each is served by its own name")
    if args.tensor_parallel_size != 1 or args.nnodes != 1:
        raise ValueError("--tensor-parallel-size and --nnodes are not supported with --models yet")
    if args.max_loaded_models < 1:
        raise ValueError(f"--max-loaded-models must be >= 1, got {args.max_loaded_models}")
    if args.idle_unload_seconds is not None and not args.idle_unload_seconds > 0:
        raise ValueError(f"--idle-unload-seconds must be > 0, got {args.idle_unload_seconds}")
    if args.models_memory_gib is not None and not args.models_memory_gib > 0:
        raise ValueError(f"--models-memory-gib must be > 0, got {args.models_memory_gib}")
    if not args.model_load_timeout > 0:
        raise ValueError(f"--model-load-timeout must be > 0, got {args.model_load_timeout}")
    if args.models_dir is not None and not Path(args.models_dir).is_dir():
        raise ValueError(f"--models-dir {args.models_dir!r} is not a directory")


def models_in_dir(root: Path) -> list[StoredModel]:
    """--models-dir: each Hugging Face model directory (or folder of one GGUF checkpoint) and each GGUF
    checkpoint (a split one by its first shard) directly in ``root``, named as MODEL would name it."""
    found = []
    for entry in sorted(root.iterdir()):
        if entry.is_dir() and not entry.name.startswith("."):
            if (entry / CONFIG_FILE).is_file() or any(entry.glob("*.gguf")):
                found.append(from_source(resolve_model(str(entry)), PATH))
    for checkpoint in checkpoints(sorted(e.name for e in root.iterdir() if e.is_file())):
        found.append(from_source(resolve_model(str(root / checkpoint.files[0])), PATH))
    return found


def engine_argv(args: argparse.Namespace) -> list[str]:
    """The engine and server flags given to `serve` (those that differ from their defaults), as argv."""
    parser = argparse.ArgumentParser(add_help=False)
    add_engine_args(parser, positional_model=True)
    argv: list[str] = []
    for action in parser._actions:
        if not action.option_strings or action.dest == "model":
            continue
        value = getattr(args, action.dest, action.default)
        if value == action.default:
            continue
        if isinstance(action, argparse.BooleanOptionalAction):
            name = action.option_strings[0].removeprefix("--")
            argv.append(f"--{name}" if value else f"--no-{name}")
        elif isinstance(action, argparse._StoreTrueAction):
            argv.append(action.option_strings[0])
        else:
            argv += [action.option_strings[0], str(value)]
    for dest in _SERVER_FLAGS:
        value = getattr(args, dest, None)
        if value is True:
            argv.append("--" + dest.replace("_", "-"))
        elif value not in (None, False) and not (dest == "shutdown_timeout" and value == 5.0):
            argv += ["--" + dest.replace("_", "-"), str(value)]
    return argv


def budget(args: argparse.Namespace, device: str) -> tuple[float, str]:
    """The bytes all loaded models may hold, and how that was reckoned."""
    if args.models_memory_gib is not None:
        return args.models_memory_gib * GIB, f"--models-memory-gib {args.models_memory_gib}"
    util = args.memory_utilization
    if device == "cuda":
        import torch

        total = torch.cuda.mem_get_info()[1]
        return total * util, f"GPU memory {total / GIB:.1f} GiB x --memory-utilization {util}"
    total = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    return total * util, f"host RAM {total / GIB:.1f} GiB x --memory-utilization {util}"


def resolve_device(requested: str) -> str:
    if requested != "auto":
        return requested
    if not Path("/dev/nvidiactl").exists():
        return "cpu"
    import torch

    return "cuda" if torch.cuda.is_available() else "cpu"


def build_models(args: argparse.Namespace, device: str) -> list[Served]:
    stored = [stored_model(n) for n in _listed(args.models)]
    if args.models_dir is not None:
        stored += models_in_dir(Path(args.models_dir))
    if not stored:
        raise ValueError("--models-dir holds no model (Hugging Face directories or .gguf files)")
    config = config_from_args(args)
    sized = args.num_kv_blocks is not None or args.kv_cache_memory_gib is not None
    base = engine_argv(args)
    available = mem_available() or 0
    served: dict[str, Served] = {}
    for s in stored:
        if s.name in served:
            raise ValueError(
                f"--models: two models are named {s.name!r} ({served[s.name].stored.path}, {s.path})"
            )
        info = describe(s, template=True)
        if not info.servable:
            raise ValueError(f"--models: {s.name!r} cannot be served: {info.reason}")
        plan = _plan(info, config, device, available)
        argv = [sys.executable, "-m", "glassbox.cli", "serve", str(s.path), "--served-model-name", s.name,
                "--disable-uvicorn-access-log", "--uvicorn-log-level", "warning", *base]  # fmt: skip
        if info.task == "generate" and not sized:
            argv += ["--num-kv-blocks", str(plan.kv_blocks)]
        served[s.name] = Served(s.name, info, plan, argv)
    return list(served.values())


def _plan(info: ModelInfo, config: EngineConfig, device: str, available: int) -> Footprint:
    if info.facts is not None and info.task == "generate":
        return footprint(info.facts, config, device, available)
    runtime = get_engine("glassbox-cpu" if device == "cpu" else "glassbox").runtime_gib * GIB
    return Footprint(
        float(info.model.size), 0.0, 0, 0, 0.0, runtime, info.context_length
    )  # an encoder: its file


def run_router(args: argparse.Namespace, serve: Callable[[Any, Any], Coroutine[Any, Any, None]]) -> int:
    """Serve the models until SIGTERM/SIGINT (``serve``: serve_cli's drain-aware loop)."""
    import uvicorn

    check_router_flags(args)
    device = resolve_device(args.device)
    models = build_models(args, device)
    memory, how = budget(args, device)
    log_dir = Path(tempfile.mkdtemp(prefix="glassbox-models-"))
    settings = RouterSettings(args.max_loaded_models, args.idle_unload_seconds, memory, how, device,
                              args.model_load_timeout, args.shutdown_timeout, log_dir,
                              child_env(args.api_key))  # fmt: skip
    metrics = RouterMetrics()
    router = Router(models, settings, metrics)
    gate = GateSettings(args.api_key or None, args.shutdown_timeout, _listed(args.allowed_origins),
                        _listed(args.allowed_methods) or ["*"], _listed(args.allowed_headers) or ["*"])  # fmt: skip
    app = build_router_app(router, gate, metrics)
    for m in models:
        logger.info("model %s (%s: %s) plans %s", m.name, m.stored.source, m.stored.path, m.plan.describe())
    logger.info("serving %d models on http://%s:%d, budget %.2f GiB (%s); model logs in %s", len(models),
                args.host, args.port, memory / GIB, how, log_dir)  # fmt: skip
    config = uvicorn.Config(app, host=args.host, port=args.port, log_level=args.uvicorn_log_level,
                            access_log=not args.disable_uvicorn_access_log, timeout_graceful_shutdown=2,
                            lifespan="on")  # fmt: skip
    asyncio.run(serve(uvicorn.Server(config), app.state.glassbox))
    return 0
