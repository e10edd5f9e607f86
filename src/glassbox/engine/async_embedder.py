"""AsyncEmbedder: the asyncio front of an embedding (or reranking) model, batching requests together.

One thread owns the model. Requests queue their sequences (already tokenized); each loop turn takes the
sequences waiting, oldest request first, up to a token and a sequence budget (a request's sequences may
span turns, and one turn mixes requests), runs them as one batch of whole sequences (no KV cache), and
hands each request its rows when the last of them is done. Every request that enters gets exactly one
answer: its result, an error, or nothing when its caller went away (a cancelled request's sequences not
yet run are dropped).
"""

from __future__ import annotations

import asyncio
import logging
import threading
import time
from collections import deque
from dataclasses import dataclass, field

import torch

from glassbox.anatomy import RequestMetrics
from glassbox.engine.embedding_model import EmbeddingModel

logger = logging.getLogger(__name__)


class EmbedError(Exception):
    """A request the embedder could not finish; ``status`` is the HTTP status it maps to."""

    def __init__(self, message: str, status: int = 500) -> None:
        super().__init__(message)
        self.message = message
        self.status = status


@dataclass
class EmbedResult:
    values: torch.Tensor  # (N, dimension) float32 vectors, or (N,) scores, in the request's order
    metrics: RequestMetrics  # tokenize, queue, compute ("prefill"), end to end; the prompt tokens


@dataclass
class _Job:
    seqs: list[list[int]]
    types: list[list[int]] | None
    future: asyncio.Future[EmbedResult]
    loop: asyncio.AbstractEventLoop
    metrics: RequestMetrics
    rows: list[torch.Tensor | None] = field(default_factory=list)
    taken: int = 0  # sequences handed to a batch so far
    done: int = 0  # sequences computed
    cancelled: bool = False


@dataclass(frozen=True)
class EmbedderStats:
    num_running: int = 0  # sequences of the batch taken last (0 once it is done)
    num_waiting: int = 0  # sequences queued behind it
    batches: int = 0  # batches run since start
    sequences: int = 0  # sequences embedded since start
    tokens: int = 0  # their tokens


class AsyncEmbedder:
    """Runs an EmbeddingModel on its own thread; :meth:`run` from asyncio code. Call :meth:`start` before
    the first request and :meth:`shutdown` at the end."""

    def __init__(self, model: EmbeddingModel, max_batch_tokens: int, max_batch_seqs: int) -> None:
        if max_batch_tokens < model.max_tokens:
            raise ValueError(
                f"--max-num-batched-tokens {max_batch_tokens} is less than one input's {model.max_tokens}"
            )
        self.model = model
        self.max_batch_tokens = max_batch_tokens
        self.max_batch_seqs = max_batch_seqs
        self._jobs: deque[_Job] = deque()
        self._cond = threading.Condition()
        self._stopping = False
        self._thread: threading.Thread | None = None
        self.stats = EmbedderStats()
        self.num_in_flight = 0  # requests not yet answered (event-loop side)

    @property
    def is_running(self) -> bool:
        return self._thread is not None and self._thread.is_alive() and not self._stopping

    def start(self) -> None:
        self._thread = threading.Thread(target=self._loop, name="glassbox-embedder", daemon=True)
        self._thread.start()

    async def run(
        self, seqs: list[list[int]], types: list[list[int]] | None = None, tokenize_s: float = 0.0
    ) -> EmbedResult:
        """Embed (or score) ``seqs``, each a non-empty list of ids of at most the model's ``max_tokens``."""
        assert seqs and all(0 < len(s) <= self.model.max_tokens for s in seqs)
        if not self.is_running:
            raise EmbedError("the embedding model is not running", 503)
        loop = asyncio.get_running_loop()
        metrics = RequestMetrics(
            tokenize_s=tokenize_s, prompt_tokens=sum(map(len, seqs)), arrival_time=time.perf_counter()
        )
        metrics.sequences = len(seqs)
        job = _Job(seqs, types, loop.create_future(), loop, metrics, [None] * len(seqs))
        with self._cond:
            self._jobs.append(job)
            self._cond.notify()
        self.num_in_flight += 1
        try:
            return await job.future
        except asyncio.CancelledError:
            job.cancelled = True  # its sequences not yet taken are skipped
            raise
        finally:
            self.num_in_flight -= 1

    async def wait_idle(self, timeout_s: float) -> bool:
        """Wait until every request has its answer; False if ``timeout_s`` passed first."""
        deadline = time.monotonic() + timeout_s
        while self.num_in_flight:
            if time.monotonic() >= deadline:
                return False
            await asyncio.sleep(0.02)
        return True

    def abort_all(self) -> None:
        """Answer every queued request with a 503 now (the batch in flight still finishes)."""
        with self._cond:
            left = list(self._jobs)
            self._jobs.clear()
        for job in left:
            job.cancelled = True
            self._answer(job, EmbedError("the request was aborted: the server is shutting down", 503))

    def shutdown(self, timeout_s: float = 5.0) -> None:
        """Stop after the batch in flight; requests still queued get a 503."""
        with self._cond:
            self._stopping = True
            self._cond.notify()
        if self._thread is not None:
            self._thread.join(timeout_s)
        self.abort_all()

    # -- the model's thread -------------------------------------------------------------------------
    def _take(self) -> list[tuple[_Job, int]] | None:
        """The next batch: (job, sequence index) pairs, oldest job first; None when stopping."""
        with self._cond:
            while not self._stopping and not self._jobs:
                self._cond.wait()
            if self._stopping:
                return None
            batch: list[tuple[_Job, int]] = []
            tokens = 0
            while self._jobs and len(batch) < self.max_batch_seqs:
                job = self._jobs[0]
                if job.cancelled:
                    self._jobs.popleft()
                    continue
                n = len(job.seqs[job.taken])
                if batch and tokens + n > self.max_batch_tokens:
                    break
                batch.append((job, job.taken))
                tokens += n
                job.taken += 1
                if job.taken == len(job.seqs):
                    self._jobs.popleft()
            waiting = sum(len(j.seqs) - j.taken for j in self._jobs)
            s = self.stats
            self.stats = EmbedderStats(len(batch), waiting, s.batches, s.sequences, s.tokens)
            return batch

    def _loop(self) -> None:
        while (batch := self._take()) is not None:
            if not batch:
                continue
            start = time.perf_counter()
            for job, _ in batch:
                if job.metrics.first_scheduled_time is None:
                    job.metrics.first_scheduled_time = start
            seqs = [job.seqs[i] for job, i in batch]
            types = None
            if any(job.types is not None for job, _ in batch):
                types = [
                    job.types[i] if job.types is not None else [0] * len(job.seqs[i]) for job, i in batch
                ]
            try:
                out = self.model.run(seqs, types)
            except Exception as e:  # a bug of ours: every request in the batch gets an error, none is lost
                logger.exception("embedding batch of %d sequences failed", len(batch))
                for job in {id(j): j for j, _ in batch}.values():
                    self._answer(job, EmbedError(f"embedding failed: {type(e).__name__}: {e}", 500))
                    job.cancelled = True
                continue
            end = time.perf_counter()
            s = self.stats
            self.stats = EmbedderStats(0, s.num_waiting, s.batches + 1, s.sequences + len(seqs),
                                       s.tokens + sum(map(len, seqs)))  # fmt: skip
            for row, (job, i) in zip(out, batch, strict=True):
                job.rows[i] = row
                job.done += 1
                if job.done == len(job.seqs) and not job.cancelled:
                    m = job.metrics
                    m.first_token_time = m.finished_time = end
                    m.finalize()
                    self._answer(job, EmbedResult(torch.stack([r for r in job.rows if r is not None]), m))

    @staticmethod
    def _answer(job: _Job, item: EmbedResult | EmbedError) -> None:
        def put() -> None:
            if job.future.done():
                return
            if isinstance(item, EmbedError):
                job.future.set_exception(item)
            else:
                job.future.set_result(item)

        try:
            job.loop.call_soon_threadsafe(put)
        except RuntimeError:  # the loop has closed: nobody is waiting any more
            pass
