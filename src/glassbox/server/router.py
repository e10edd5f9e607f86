"""Several models behind one server: which are loaded, loading them on demand, unloading them (torch-free).

Each model runs in its own `glassbox serve` process (server/model_process.py), as llama.cpp's router runs
them: a crash of one engine fails that model's requests and leaves the others serving, and an unload gives
all of its memory back to the OS (a process that frees tensors keeps much of its heap). The policy:

- a request names its model; an unloaded one is loaded first and requests to a model being loaded wait
  for it (a failed load fails them all with its reason, 503);
- before a load, the model's plan (perf/model_fit.py: weights + KV cache + activations + runtime) must fit
  in the budget beside the models held (their measured resident bytes on the CPU); idle models are evicted
  least recently used first to make room, or to stay within --max-loaded-models; if that is not enough the
  request is refused with the numbers: 400 when the model cannot fit even alone, 409 when the models it
  would have to evict are busy (503 when all --max-loaded-models are busy);
- --idle-unload-seconds unloads a model no request has used for that long; a crashed process is noticed
  within a quarter second and the next request loads the model again.
All state lives on the event loop's thread; no await separates a check from the change it allows.
"""

from __future__ import annotations

import asyncio
import logging
import re
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol

import httpx

from glassbox.perf.hardware import GIB
from glassbox.perf.model_fit import Footprint
from glassbox.server.errors import ApiError
from glassbox.server.model_process import LoadFailed, ModelProcess, describe_exit
from glassbox.store.describe import ModelInfo
from glassbox.store.names import BadModelName, check_name
from glassbox.store.stored import StoredModel

logger = logging.getLogger(__name__)

UNLOADED, LOADING, LOADED, FAILED = "unloaded", "loading", "loaded", "failed"
WATCH_INTERVAL_S = 0.25
MEM_AVAILABLE_SHARE = 0.95  # of MemAvailable a new model may take on the CPU


class Events(Protocol):
    """What the router tells its metrics (server/router_metrics.py)."""

    def loaded(self, name: str, seconds: float) -> None: ...
    def unloaded(self, name: str, reason: str) -> None: ...
    def failed(self, name: str, reason: str) -> None: ...


@dataclass(frozen=True)
class RouterSettings:
    max_loaded: int  # --max-loaded-models
    idle_unload_s: float | None  # --idle-unload-seconds
    memory_budget: float  # bytes all loaded models may hold together
    budget_how: str  # how the budget was reckoned (for messages)
    device: str  # "cpu" | "cuda"
    load_timeout_s: float
    stop_timeout_s: float  # --shutdown-timeout: what a stopping child gives its requests
    log_dir: Path
    env: dict[str, str] = field(default_factory=dict)


@dataclass
class Served:
    """One model the server may serve."""

    name: str
    info: ModelInfo  # the stored model and its facts (store/describe.py)
    plan: Footprint
    argv: list[str]  # the child's command, less --host/--port
    state: str = UNLOADED
    process: ModelProcess | None = None
    loading: asyncio.Future[None] | None = None
    in_flight: int = 0
    last_used: float = 0.0
    loads: int = 0
    load_s: float | None = None
    error: str | None = None  # the last failure: a load that failed, a crash

    @property
    def stored(self) -> StoredModel:
        return self.info.model

    def held(self) -> float:
        """Bytes it holds: the process's resident set where measured (CPU), else its plan."""
        rss = self.process.rss() if self.process is not None and self.state == LOADED else None
        return float(rss) if rss is not None else self.plan.total


def mem_available() -> int | None:
    """The host's MemAvailable (Linux), or None."""
    try:
        with open("/proc/meminfo") as f:
            for line in f:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) * 1024
    except (OSError, ValueError):
        return None
    return None


class Router:
    """The loaded models of a multi-model server, and the policy that loads and unloads them."""

    def __init__(self, models: list[Served], settings: RouterSettings, events: Events) -> None:
        self.models = {m.name: m for m in models}
        self.settings = settings
        self.events = events
        self.client = httpx.AsyncClient(timeout=None)
        self._decide = asyncio.Lock()
        self._watcher: asyncio.Task[None] | None = None

    # -- names ----------------------------------------------------------------------------------------
    def named(self, name: Any, param: str = "model") -> Served:
        """The served model a request names: 400 for a missing name or one that is a path, URL or digest,
        404 for one not served; with one model served, a request may leave it out."""
        if name is None and len(self.models) == 1:
            return next(iter(self.models.values()))
        if not isinstance(name, str) or not name:
            served = ", ".join(sorted(self.models))
            raise ApiError(400, f"{param} is required: this server serves {served}", param,
                           "missing_required_parameter")  # fmt: skip
        try:
            check_name(name, param)
        except BadModelName as e:
            raise ApiError(400, str(e), param, "invalid_model_name") from None
        return self.lookup(name)

    def lookup(self, name: str) -> Served:
        """The model ``name`` names (Ollama's ``:latest`` optional); 404 naming the served ones."""
        served = self.models.get(name) or self.models.get(name.removesuffix(":latest"))
        if served is None:
            known = ", ".join(sorted(self.models))
            raise ApiError(404, f"the model {name!r} does not exist; this server serves: {known}", "model",
                           "model_not_found")  # fmt: skip
        return served

    # -- requests -------------------------------------------------------------------------------------
    async def acquire(self, served: Served) -> float:
        """Hold ``served`` loaded for a request (until ``release``); the seconds it waited for a load."""
        t0 = time.monotonic()
        waited = await self.ensure_loaded(served)
        served.in_flight += 1  # no await since ensure_loaded saw it loaded
        logger.debug("acquired %s: %d in flight", served.name, served.in_flight)
        return (time.monotonic() - t0) if waited else 0.0

    def release(self, served: Served) -> None:
        served.in_flight -= 1
        logger.debug("released %s: %d in flight", served.name, served.in_flight)
        served.last_used = time.monotonic()

    async def ensure_loaded(self, served: Served) -> bool:
        """Load ``served`` unless it is loaded; whether the caller had to wait for a load."""
        if served.state == LOADED:
            return False
        async with self._decide:
            if served.state == LOADED:
                return False
            if served.state != LOADING:
                await self._make_room(served)
                served.state, served.error = LOADING, None
                served.loading = asyncio.get_running_loop().create_future()
                served.loading.add_done_callback(lambda f: f.exception())  # retrieved: no "never retrieved"
                asyncio.create_task(self._load(served))
        assert served.loading is not None
        await asyncio.shield(served.loading)
        return True

    async def _load(self, served: Served) -> None:
        assert served.loading is not None
        s = self.settings
        log = s.log_dir / (re.sub(r"[^A-Za-z0-9_.-]+", "_", served.name) + ".log")
        process = ModelProcess(served.name, served.argv, log, s.env)
        served.process = process
        t0 = time.monotonic()
        try:
            await process.start(self.client, s.load_timeout_s)
        except (LoadFailed, OSError) as e:
            served.state, served.process = FAILED, None
            served.error = f"model {served.name!r} failed to load: {e}"
            self.events.failed(served.name, "load")
            logger.warning("%s", served.error)
            served.loading.set_exception(ApiError(503, served.error, "model", "model_load_failed"))
            return
        served.state, served.load_s = LOADED, time.monotonic() - t0
        served.loads += 1
        served.last_used = time.monotonic()
        self.events.loaded(served.name, served.load_s)
        logger.info("loaded %s in %.1f s (%s)", served.name, served.load_s, served.stored.path)
        served.loading.set_result(None)

    async def _make_room(self, served: Served) -> None:
        """Evict idle models (least recently used first) until ``served`` fits beside the rest; raise the
        refusal with the numbers when it cannot (called under the decision lock)."""
        s = self.settings
        need = served.plan.total
        if need > s.memory_budget:
            raise ApiError(400, f"model {served.name!r} does not fit: it needs {served.plan.describe()}, more "
                           f"than the whole budget of {s.memory_budget / GIB:.2f} GiB ({s.budget_how})", "model",
                           "model_does_not_fit")  # fmt: skip
        while True:
            others = [m for m in self.models.values() if m is not served and m.state in (LOADED, LOADING)]
            used = sum(m.held() for m in others)
            available = mem_available() if s.device == "cpu" else None
            room = available is None or need <= available * MEM_AVAILABLE_SHARE
            count_ok = len(others) < s.max_loaded
            if count_ok and used + need <= s.memory_budget and room:
                return
            idle = [m for m in others if m.state == LOADED and m.in_flight == 0]
            if not idle:
                break
            victim = min(idle, key=lambda m: m.last_used)
            await self.unload(victim, "lru" if not count_ok else "memory")
        if not count_ok:
            raise ApiError(503, f"all {s.max_loaded} loaded models (--max-loaded-models) are serving requests; "
                           f"{served.name!r} loads when one is idle", "model", "models_busy",
                           {"Retry-After": "5"})  # fmt: skip
        held = ", ".join(f"{m.name} {m.held() / GIB:.2f} GiB ({m.in_flight} requests)" for m in others)
        free = s.memory_budget - used
        also = "" if room else f"; the host has {available / GIB:.2f} GiB available" if available else ""
        raise ApiError(409, f"model {served.name!r} needs {served.plan.describe()}, but beside the loaded "
                       f"models ({held}) only {free / GIB:.2f} GiB of the {s.memory_budget / GIB:.2f} GiB "
                       f"budget ({s.budget_how}) are free{also}, and none of them is idle to evict; retry when "
                       "they finish", "model", "model_does_not_fit", {"Retry-After": "5"})  # fmt: skip

    async def unload(self, served: Served, reason: str) -> bool:
        """Stop ``served``'s process (it drains its requests for --shutdown-timeout); False if not loaded."""
        process = served.process
        if served.state != LOADED or process is None:
            return False
        served.state, served.process = UNLOADED, None
        self.events.unloaded(served.name, reason)
        logger.info("unloading %s (%s)", served.name, reason)
        await process.stop(self.settings.stop_timeout_s)
        return True

    def crash_message(self, served: Served, process: ModelProcess | None) -> str | None:
        """Why a request to ``served`` lost its process, if it did."""
        if process is None or process.returncode is None:
            return None
        if process.stopping:
            return f"model {served.name} was unloaded while this request ran"
        return (
            f"the process of model {served.name} {describe_exit(process.returncode)} while this request ran"
        )

    # -- background -----------------------------------------------------------------------------------
    def start(self) -> None:
        self._watcher = asyncio.create_task(self._watch())

    async def shutdown(self) -> None:
        if self._watcher is not None:
            self._watcher.cancel()
        await asyncio.gather(*(self.unload(m, "shutdown") for m in self.models.values()))
        await self.client.aclose()

    async def _watch(self) -> None:
        """Notice crashed processes, and unload models idle for --idle-unload-seconds."""
        idle_s = self.settings.idle_unload_s
        while True:
            await asyncio.sleep(WATCH_INTERVAL_S)
            now = time.monotonic()
            for m in self.models.values():
                p = m.process
                if m.state == LOADED and p is not None and p.returncode is not None and not p.stopping:
                    m.state, m.process = FAILED, None
                    m.error = f"the process of model {m.name} {describe_exit(p.returncode)}; the next request loads it again"
                    logger.warning("%s: %s", m.error, p.log_tail())
                    self.events.failed(m.name, "crash")
                elif (
                    m.state == LOADED
                    and idle_s is not None
                    and m.in_flight == 0
                    and now - m.last_used > idle_s
                ):
                    async with self._decide:
                        if m.state == LOADED and m.in_flight == 0 and time.monotonic() - m.last_used > idle_s:
                            await self.unload(m, "idle")

    # -- reports --------------------------------------------------------------------------------------
    def status(self, served: Served) -> dict[str, Any]:
        """A model's entry in /models and /models/status (llama.cpp's ``status.value`` kept)."""
        now = time.monotonic()
        return {
            "id": served.name,
            "object": "model",
            "owned_by": "glassbox",
            "source": served.stored.source,
            "path": str(served.stored.path),
            "status": {"value": served.state},
            "pid": served.process.pid if served.process is not None else None,
            "requests_in_flight": served.in_flight,
            "loads": served.loads,
            "last_load_seconds": None if served.load_s is None else round(served.load_s, 3),
            "idle_seconds": round(now - served.last_used, 1) if served.state == LOADED else None,
            "error": served.error,
            "plan": served.plan.to_dict(),
        }
