"""AsyncEngine: the asyncio front of the engine for the server.

One dedicated thread owns the :class:`LLMEngine` and runs its loop: apply queued commands (add, abort),
run one ``step()``, hand each request's newest output to its :class:`RequestStream` on the event loop.
The asyncio side never touches the engine; it talks to the thread through a thread-safe command queue,
and outputs come back through ``loop.call_soon_threadsafe``. Every request that enters gets exactly one
terminal item on its stream: a finished output (finish_reason "stop" | "length" | "abort") or an error.
"""

from __future__ import annotations

import asyncio
import logging
import queue
import threading
import time
from dataclasses import dataclass
from typing import Protocol

from glassbox.engine.llm_engine import LLMEngine, StepRecord
from glassbox.outputs import RequestOutput
from glassbox.sampling_params import SamplingParams

logger = logging.getLogger(__name__)

# How long the engine thread waits for a command when a step scheduled nothing (a stalled queue).
_STALL_WAIT_S = 0.005


class RequestError(Exception):
    """A request the engine refused or could not finish; ``status`` is the HTTP status it maps to."""

    def __init__(self, message: str, status: int = 400) -> None:
        super().__init__(message)
        self.message = message
        self.status = status


class EngineObserver(Protocol):
    """Hooks called on the engine thread (e.g. Prometheus metrics); they must be cheap and thread-safe."""

    def on_iteration(self, engine: LLMEngine, record: StepRecord | None) -> None:
        """After each loop iteration; ``record`` is the step that ran, or None when none did."""

    def on_finished(self, output: RequestOutput) -> None:
        """A request reached its terminal output (metrics set, tokenize time included)."""


@dataclass(frozen=True)
class EngineStats:
    """A snapshot of the engine's load, published by the engine thread after every iteration."""

    num_running: int = 0
    num_waiting: int = 0
    num_free_blocks: int = 0
    num_blocks: int = 0
    kv_usage: float = 0.0


class RequestStream:
    """The asyncio side of one engine request: iterate it for its newest cumulative outputs.

    Outputs are cumulative (text and tokens so far), so a slow reader sees fewer, larger updates and
    loses nothing. Iteration ends after the finished output; an engine error is raised as RequestError.
    """

    def __init__(self, request_id: str, num_seqs: int, owner: AsyncEngine) -> None:
        self.request_id = request_id
        self.num_seqs = num_seqs
        self._owner = owner
        self._event = asyncio.Event()
        self._latest: RequestOutput | None = None
        self._error: RequestError | None = None
        self.terminal = False  # the terminal item has arrived
        self._consumed = False  # ... and has been handed to the reader

    def _put(self, item: RequestOutput | RequestError) -> None:
        """Event-loop thread: store the newest item and wake the reader."""
        if self.terminal:
            return
        if isinstance(item, RequestError):
            self._error = item
            self.terminal = True
        else:
            self._latest = item
            self.terminal = item.finished
        if self.terminal:
            self._owner._on_terminal(self)
        self._event.set()

    def abort(self) -> None:
        """Ask the engine to end this request now (its blocks are freed on the next loop iteration)."""
        if not self.terminal:
            self._owner.abort(self.request_id)

    def __aiter__(self) -> RequestStream:
        return self

    async def __anext__(self) -> RequestOutput:
        if self._consumed:
            raise StopAsyncIteration
        await self._event.wait()
        self._event.clear()
        if self._error is not None:
            self._consumed = True
            raise self._error
        assert self._latest is not None
        if self._latest.finished:
            self._consumed = True
        return self._latest


@dataclass(frozen=True)
class Add:
    """A request for the engine thread: its stream, prompt ids, sampling, arrival time and tokenize time."""

    stream: RequestStream
    ids: list[int]
    params: SamplingParams
    arrival: float
    tokenize_s: float


@dataclass(frozen=True)
class Abort:
    request_id: str


@dataclass(frozen=True)
class Stop: ...


Command = Add | Abort | Stop  # what the event loop sends the engine thread


class AsyncEngine:
    """Runs an LLMEngine on its own thread and serves per-request streams to asyncio code.

    Call :meth:`start` from inside the running event loop, :meth:`shutdown` before the loop ends.
    ``add_request``/``abort`` must be called from the event-loop thread.
    """

    def __init__(self, engine: LLMEngine, observer: EngineObserver | None = None) -> None:
        self.engine = engine
        self.observer = observer
        self.stats = EngineStats(
            num_free_blocks=engine.block_manager.num_free_blocks, num_blocks=engine.block_manager.num_blocks
        )
        self._commands: queue.SimpleQueue[Command] = queue.SimpleQueue()
        self._loop: asyncio.AbstractEventLoop | None = None
        self._thread: threading.Thread | None = None
        self._live: dict[str, RequestStream] = {}  # engine thread only
        self._in_flight: dict[str, RequestStream] = {}  # event-loop thread only
        self._dead: str | None = None  # set when the engine thread has stopped

    # -- lifecycle (event-loop thread) -----------------------------------------
    def start(self) -> None:
        """Start the engine thread; must be called from the running event loop."""
        if self._thread is not None:
            return
        self._loop = asyncio.get_running_loop()
        self.engine.executor.reserve_frontend_core()  # this event loop streams beside the engine
        self._thread = threading.Thread(target=self._run, name="glassbox-engine", daemon=True)
        self._thread.start()

    @property
    def is_running(self) -> bool:
        return self._thread is not None and self._thread.is_alive() and self._dead is None

    async def shutdown(self, timeout_s: float = 5.0) -> None:
        """Abort whatever is left, stop the engine thread and wait (at most ``timeout_s``) for it."""
        thread = self._thread
        if thread is None:
            return
        self._commands.put(Stop())
        deadline = time.monotonic() + timeout_s
        while thread.is_alive() and time.monotonic() < deadline:
            await asyncio.sleep(0.01)
        await asyncio.sleep(0)  # let the streams' last call_soon_threadsafe callbacks run
        if thread.is_alive():
            logger.warning("engine thread did not stop within %.1f s", timeout_s)

    # -- requests (event-loop thread) ------------------------------------------
    def add_request(
        self,
        request_id: str,
        prompt_token_ids: list[int],
        params: SamplingParams,
        arrival_time: float | None = None,
        tokenize_s: float = 0.0,
    ) -> RequestStream:
        """Queue a request for the engine thread; its outputs arrive on the returned stream.

        ``arrival_time`` (time.perf_counter) should be when tokenization ended and ``tokenize_s`` how long
        it took, so that the request's metrics count tokenization in TTFT and E2E.
        """
        if request_id in self._in_flight:
            raise RequestError(f"request id {request_id!r} is already in use")
        stream = RequestStream(request_id, params.n, self)
        if self._dead is not None:
            stream._put(RequestError(f"the engine has stopped: {self._dead}", 503))
            return stream
        self._in_flight[request_id] = stream
        arrival = time.perf_counter() if arrival_time is None else arrival_time
        self._commands.put(Add(stream, list(prompt_token_ids), params, arrival, tokenize_s))
        return stream

    def abort(self, request_id: str) -> None:
        """End a request (no-op when it already ended); its stream gets a finish_reason "abort" output."""
        if request_id in self._in_flight:
            self._commands.put(Abort(request_id))

    def abort_all(self) -> None:
        for request_id in list(self._in_flight):
            self.abort(request_id)

    def _on_terminal(self, stream: RequestStream) -> None:
        self._in_flight.pop(stream.request_id, None)

    @property
    def num_in_flight(self) -> int:
        """Requests added and not yet ended (as seen from the event loop)."""
        return len(self._in_flight)

    @property
    def num_in_flight_seqs(self) -> int:
        """Sequences of those requests (a request with n > 1 has n)."""
        return sum(s.num_seqs for s in self._in_flight.values())

    async def wait_idle(self, timeout_s: float) -> bool:
        """Wait until no request is in flight; False if ``timeout_s`` passed first."""
        deadline = time.monotonic() + timeout_s
        while self._in_flight:
            if time.monotonic() >= deadline:
                return False
            await asyncio.sleep(0.02)
        return True

    # -- the engine thread --------------------------------------------------------
    def _run(self) -> None:
        try:
            self._loop_forever()
        except Exception as e:  # our bug, not the user's: fail everyone, never hang them
            logger.exception("engine thread crashed")
            self._dead = f"{type(e).__name__}: {e}"
            self._fail_all(f"internal engine error: {self._dead}", 500)
            self._fail_queued(f"the engine has stopped: {self._dead}")
        else:
            self._dead = "shut down"
        finally:
            self._publish_stats(None)

    def _loop_forever(self) -> None:
        engine = self.engine
        while True:
            busy = engine.has_work
            if not self._apply_commands(block=not busy):
                self._fail_all("the server is shutting down", 503, abort=True)
                return
            if not engine.has_work:
                self._publish_stats(None)
                continue
            last = engine.step_records[-1] if engine.step_records else None
            try:
                outputs = engine.step(sink=self._deliver_all)
            except Exception as e:
                if getattr(e, "fatal", False):  # a tensor-parallel rank is gone: stop (health goes bad)
                    raise
                logger.exception("engine step failed; failing the requests in flight")
                self._fail_all(f"internal engine error: {type(e).__name__}: {e}", 500, abort=True)
                continue
            record = engine.step_records[-1] if engine.step_records else None
            ran = record is not None and record is not last
            self._publish_stats(record if ran else None)
            if not ran and not outputs and not self._apply_commands(block=True, timeout=_STALL_WAIT_S):
                self._fail_all("the server is shutting down", 503, abort=True)
                return

    def _apply_commands(self, block: bool, timeout: float | None = None) -> bool:
        """Apply queued commands (waiting for the first one if ``block``); False on "stop"."""
        try:
            cmd = self._commands.get(block=block, timeout=timeout)
        except queue.Empty:
            return True
        while True:
            if isinstance(cmd, Stop):
                return False
            if isinstance(cmd, Add):
                self._add(cmd.stream, cmd.ids, cmd.params, cmd.arrival, cmd.tokenize_s)
            else:
                self._abort(cmd.request_id)
            try:
                cmd = self._commands.get_nowait()
            except queue.Empty:
                return True

    def _add(
        self, stream: RequestStream, ids: list[int], params: SamplingParams, arrival: float, tokenize_s: float
    ) -> None:
        try:
            self.engine.add_request(
                stream.request_id, ids, params, arrival_time=arrival, tokenize_s=tokenize_s
            )
        except ValueError as e:
            self._send(stream, RequestError(str(e), 400))
            return
        except Exception as e:
            logger.exception("add_request failed")
            self._send(stream, RequestError(f"internal engine error: {type(e).__name__}: {e}", 500))
            return
        self._live[stream.request_id] = stream

    def _abort(self, request_id: str) -> None:
        if request_id not in self._live:
            return  # already finished (its output is on the way) or never added
        out = self.engine.abort_request(request_id)
        if out is not None:
            self._deliver(out)
        else:
            stream = self._live.pop(request_id)
            self._send(stream, RequestError("the request was aborted", 503))

    def _deliver_all(self, outputs: list[RequestOutput]) -> None:
        """A step's outputs to their streams in one hop to the event loop (not one per request: at 256
        requests that costs ~1.4 ms of the engine thread per step, measured)."""
        items = [(stream, out) for out in outputs if (stream := self._ready(out)) is not None]
        loop = self._loop
        if not items or loop is None or loop.is_closed():
            return
        try:
            loop.call_soon_threadsafe(_put_all, items)
        except RuntimeError:  # the loop closed between the check and the call
            pass

    def _deliver(self, out: RequestOutput) -> None:
        stream = self._ready(out)
        if stream is not None:
            self._send(stream, out)

    def _ready(self, out: RequestOutput) -> RequestStream | None:
        """The stream of the live request ``out`` belongs to, after its bookkeeping (terminal: observer)."""
        stream = self._live.get(out.request_id)
        if stream is None:
            return None
        if out.finished:
            del self._live[out.request_id]
            if self.observer is not None:
                try:
                    self.observer.on_finished(out)
                except Exception:
                    logger.exception("observer.on_finished failed")
        return stream

    def _send(self, stream: RequestStream, item: RequestOutput | RequestError) -> None:
        loop = self._loop
        if loop is None or loop.is_closed():
            return
        try:
            loop.call_soon_threadsafe(stream._put, item)
        except RuntimeError:  # the loop closed between the check and the call
            pass

    def _fail_all(self, message: str, status: int, abort: bool = False) -> None:
        """End every live request with an error (after aborting it in the engine when ``abort``)."""
        for request_id, stream in list(self._live.items()):
            if abort:
                try:
                    self.engine.abort_request(request_id)
                except Exception:
                    logger.exception("abort of %s failed", request_id)
            self._send(stream, RequestError(message, status))
        self._live.clear()

    def _fail_queued(self, message: str) -> None:
        """After a crash: answer the requests still queued as commands (added while the thread died)."""
        while True:
            try:
                cmd = self._commands.get_nowait()
            except queue.Empty:
                return
            if isinstance(cmd, Add):
                self._send(cmd.stream, RequestError(message, 503))

    def _publish_stats(self, record: StepRecord | None) -> None:
        engine = self.engine
        bm = engine.block_manager
        self.stats = EngineStats(
            engine.num_running, engine.num_waiting, bm.num_free_blocks, bm.num_blocks, bm.usage
        )
        if self.observer is not None:
            try:
                self.observer.on_iteration(engine, record)
            except Exception:
                logger.exception("observer.on_iteration failed")


def _put_all(items: list[tuple[RequestStream, RequestOutput]]) -> None:
    """Event-loop thread: hand each output to its stream."""
    for stream, out in items:
        stream._put(out)
