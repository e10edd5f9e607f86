"""From an API request to engine requests and back: sampling params, prompt checks, submission, the
merged output streams, client-disconnect aborts, usage and the request anatomy (``metrics``).

A *job* is one HTTP request; it holds one engine request per prompt (completions accept a batch), each
with ``n`` sequences. Choice ``index`` = prompt position * n + sequence index.
"""

from __future__ import annotations

import asyncio
import json
import re
import time
from collections.abc import AsyncGenerator, AsyncIterator, Callable
from contextlib import aclosing
from dataclasses import dataclass, field
from typing import Any

from starlette.requests import Request

from glassbox.anatomy import RequestMetrics, merge_metrics
from glassbox.engine.async_engine import RequestError, RequestStream
from glassbox.engine.request_check import RequestCheckError, check_request
from glassbox.outputs import CompletionOutput, RequestOutput
from glassbox.sampling_params import SamplingParams
from glassbox.server.errors import ApiError, bad_request, error_body, param_of_value_error, shown
from glassbox.server.protocol import SamplingFields
from glassbox.server.state import ServerState

_TOKEN_KEY = re.compile("-?[0-9]+")
_PARAM_NAMES = set(SamplingFields.model_fields) | {
    "max_tokens",
    "logprobs",
    "top_logprobs",
    "prompt",
    "messages",
}


def sampling_params(
    req: SamplingFields, max_tokens: int | None, logprobs: int | None, prompt_logprobs: int | None = None
) -> SamplingParams:
    """SamplingParams from the request's fields; 400 naming the parameter when a value is invalid.
    ``prompt_logprobs``: the engine's (the request's own, or completions' echo with logprobs)."""
    if req.stream_options is not None and not req.stream:
        raise bad_request("stream_options is only allowed when stream is true", "stream_options")
    if req.prompt_logprobs is not None and req.stream:  # vLLM's rule: the field has no place in a chunk
        raise bad_request("prompt_logprobs is not available with stream: true", "prompt_logprobs")
    stop = [req.stop] if isinstance(req.stop, str) else list(req.stop or [])
    kwargs: dict[str, Any] = dict(
        n=req.n,
        max_tokens=max_tokens,
        min_tokens=req.min_tokens,
        stop=stop,
        stop_token_ids=list(req.stop_token_ids or []),
        seed=req.seed,
        logprobs=logprobs,
        prompt_logprobs=prompt_logprobs,
        ignore_eos=req.ignore_eos,
        include_stop_str_in_output=req.include_stop_str_in_output,
        skip_special_tokens=req.skip_special_tokens,
        logit_bias=_logit_bias(req.logit_bias),
    )
    for name in (
        "temperature",
        "top_p",
        "top_k",
        "min_p",
        "repetition_penalty",
        "presence_penalty",
        "frequency_penalty",
    ):
        value = getattr(req, name)
        if value is not None:
            kwargs[name] = value
    return _build(kwargs)


def _logit_bias(bias: dict[str, float] | None) -> dict[int, float] | None:
    """OpenAI's {"token id": bias} with integer keys (the values are checked by SamplingParams)."""
    out: dict[int, float] = {}
    for key, value in (bias or {}).items():
        if not _TOKEN_KEY.fullmatch(key):  # int() would also take "1_0", " 12" and "١٢"
            raise bad_request(
                f"logit_bias keys must be token ids written as ASCII integers, got {shown(key)}", "logit_bias"
            )
        out[int(key)] = value
    return out or None


def _build(kwargs: dict[str, Any]) -> SamplingParams:
    try:
        return SamplingParams(**kwargs)
    except (ValueError, TypeError) as e:
        raise bad_request(str(e), param_of_value_error(str(e), _PARAM_NAMES)) from None


@dataclass
class Job:
    """One API request: its prompts (token ids), their params and, once submitted, their streams."""

    id: str
    model: str
    prompts: list[list[int]]
    params: list[SamplingParams]
    tokenize_s: list[float]
    created: int = field(default_factory=lambda: int(time.time()))
    streams: list[RequestStream] = field(default_factory=list)
    discard_outputs: bool = False  # completions' echo with max_tokens 0: the one token drawn is not sent

    @property
    def n(self) -> int:
        return self.params[0].n

    def abort_unfinished(self) -> None:
        for stream in self.streams:
            stream.abort()


def prepare(
    state: ServerState,
    job_id: str,
    prompts: list[list[int]],
    tokenize_s: list[float],
    base: SamplingParams,
    max_tokens: int | None,
    param: str,
) -> Job:
    """Check every prompt against the vocabulary and the length limits (the engine's own check, so that
    the 400 names the parameter before anything is queued); fix each one's max_tokens."""
    params = []
    for i, ids in enumerate(prompts):
        where = param if len(prompts) == 1 else f"{param}[{i}]"
        try:
            room = check_request(
                ids,
                max_tokens,
                state.vocab_size,
                state.max_model_len,
                state.kv_capacity_tokens,
                where,
                param,
                base,
            )
        except RequestCheckError as e:
            raise bad_request(str(e), e.param, e.code) from None
        params.append(base if max_tokens is not None else _build({**_fields(base), "max_tokens": room}))
    return Job(job_id, state.model_name, prompts, params, tokenize_s)


def _fields(p: SamplingParams) -> dict[str, Any]:
    return {k: getattr(p, k) for k in SamplingParams.__dataclass_fields__}


def submit(state: ServerState, job: Job) -> None:
    """Queue the job's prompts (429 when --max-queue-len is set and the queue is full)."""
    limit = state.settings.max_queue_len
    engine = state.engine
    new_seqs = job.n * len(job.prompts)
    if (
        limit is not None
        and engine.num_in_flight > 0
        and engine.num_in_flight_seqs + new_seqs > state.max_num_seqs + limit
    ):
        raise ApiError(
            429,
            f"the server is busy: {engine.num_in_flight_seqs} sequences in flight, at most "
            f"{state.max_num_seqs} run and {limit} wait (--max-queue-len); retry later",
            code="queue_full",
            headers={"Retry-After": "1"},
        )
    now = time.perf_counter()
    for i, (ids, params) in enumerate(zip(job.prompts, job.params, strict=True)):
        rid = job.id if len(job.prompts) == 1 else f"{job.id}-{i}"
        job.streams.append(
            engine.add_request(rid, ids, params, arrival_time=now, tokenize_s=job.tokenize_s[i])
        )


async def iterate(job: Job) -> AsyncGenerator[tuple[int, RequestOutput], None]:
    """(prompt position, newest cumulative output) as the engine produces them, until all finish."""
    if len(job.streams) == 1:
        async for out in job.streams[0]:
            yield 0, out
        return
    inbox: asyncio.Queue[tuple[int, RequestOutput | RequestError]] = asyncio.Queue()

    async def pump(i: int, stream: RequestStream) -> None:
        try:
            async for out in stream:
                inbox.put_nowait((i, out))
        except RequestError as e:
            inbox.put_nowait((i, e))

    tasks = [asyncio.create_task(pump(i, s)) for i, s in enumerate(job.streams)]
    try:
        left = len(tasks)
        while left:
            i, item = await inbox.get()
            if isinstance(item, RequestError):
                raise item
            if item.finished:
                left -= 1
            yield i, item
    finally:
        for t in tasks:
            t.cancel()


def watch_disconnect(request: Request, job: Job) -> asyncio.Task[None]:
    """A task that aborts the job's requests as soon as the client goes away; cancel it when done."""

    async def watch() -> None:
        while True:
            message = await request.receive()
            if message["type"] == "http.disconnect":
                job.abort_unfinished()
                return

    return asyncio.create_task(watch())


async def collect(job: Job, request: Request) -> list[RequestOutput]:
    """Wait for every prompt's final output (aborting them if the client disconnects meanwhile)."""
    finals: dict[int, RequestOutput] = {}
    watcher = watch_disconnect(request, job)
    try:
        async with aclosing(iterate(job)) as outputs:
            async for i, out in outputs:
                if out.finished:
                    finals[i] = out
    except RequestError as e:
        raise ApiError(e.status if e.status in (400, 503) else 500, e.message) from None
    finally:
        watcher.cancel()
        job.abort_unfinished()
    results = [finals[i] for i in range(len(job.streams))]
    trace_spans(request, job, results)
    if any(o.finish_reason == "abort" for r in results for o in r.outputs):
        raise ApiError(503, "the request was aborted (the server is shutting down)")
    return results


def sse(obj: dict[str, Any]) -> str:
    return f"data: {json.dumps(obj, ensure_ascii=False, allow_nan=False)}\n\n"


def finish_chunk(
    base: dict[str, Any], index: int, empty: dict[str, Any], o: CompletionOutput
) -> dict[str, Any]:
    """A choice's closing chunk, as OpenAI streams it: nothing new (``empty``: chat's ``{"delta": {}}``,
    completions' ``{"text": ""}``), the finish reason (and vLLM's stop_reason)."""
    choice = {"index": index, **empty, "logprobs": None, "finish_reason": o.finish_reason}
    return {**base, "choices": [{**choice, "stop_reason": o.stop_reason}]}


def aborted(out: RequestOutput) -> bool:
    """Ended by an abort: the server is shutting down (a client that left reads nothing)."""
    return any(o.finish_reason == "abort" for o in out.outputs)


async def stream_events(
    job: Job,
    request: Request,
    head: list[dict[str, Any]],
    chunks_for: Callable[[int, RequestOutput], list[dict[str, Any]]],
    base: dict[str, Any],
    include_usage: bool,
) -> AsyncIterator[str]:
    """Server-sent events: ``head`` chunks, then ``chunks_for`` each output (content chunks, then each
    choice's closing chunk), then the usage chunk when asked (choices == []; every chunk before it has
    ``usage: null``, as OpenAI sends them); the last chunk carries ``metrics``; then ``data: [DONE]``.

    A request that fails or is aborted on the way (the server shutting down) ends with an error event in
    OpenAI's shape and no ``[DONE]``, never a finish_reason outside OpenAI's values: OpenAI's clients raise
    an APIError on it, where a made-up "abort" (vLLM's) or a lossy "stop"/"length" would pass a cut answer
    off as complete."""
    watcher = watch_disconnect(request, job)
    finals: dict[int, RequestOutput] = {}
    failed: dict[str, Any] | None = None
    try:
        for chunk in head:
            yield sse(_with_usage(chunk, include_usage))
        async with aclosing(iterate(job)) as outputs:
            async for i, out in outputs:
                chunks = chunks_for(i, out)
                if aborted(out):
                    failed = error_body(503, "the request was aborted: the server is shutting down")
                elif out.finished:
                    finals[i] = out
                if failed is None and len(finals) == len(job.streams):
                    ordered = [finals[k] for k in range(len(job.streams))]
                    if include_usage:
                        chunks.append({**base, "choices": [], "usage": usage(job, ordered)})
                    if not chunks:
                        chunks.append({**base, "choices": []})
                    chunks[-1]["metrics"] = anatomy(ordered)
                    trace_spans(request, job, ordered)
                for chunk in chunks:
                    yield sse(_with_usage(chunk, include_usage))
                if failed is not None:
                    break
    except RequestError as e:
        failed = error_body(e.status, e.message)
    finally:
        watcher.cancel()
        job.abort_unfinished()
    if failed is not None:
        yield sse(failed)
    else:
        yield "data: [DONE]\n\n"


def _with_usage(chunk: dict[str, Any], include_usage: bool) -> dict[str, Any]:
    if include_usage and "usage" not in chunk:
        chunk["usage"] = None
    return chunk


def usage(job: Job, finals: list[RequestOutput]) -> dict[str, Any]:
    prompt = sum(len(p) for p in job.prompts)
    completion = 0 if job.discard_outputs else sum(len(o.token_ids) for r in finals for o in r.outputs)
    cached = sum(r.metrics.cached_prompt_tokens for r in finals if r.metrics is not None)
    return {
        "prompt_tokens": prompt,
        "completion_tokens": completion,
        "total_tokens": prompt + completion,
        "prompt_tokens_details": {"cached_tokens": cached},
    }


def request_metrics(finals: list[RequestOutput]) -> RequestMetrics | None:
    """One request's anatomy, as the engine finalized it; for a batch of prompts, the engine's merge."""
    parts = [r.metrics for r in finals if r.metrics is not None]
    if not parts:
        return None
    return parts[0] if len(parts) == 1 else merge_metrics(parts, shared_prompt=False)


def anatomy(finals: list[RequestOutput]) -> dict[str, Any]:
    """The ``metrics`` object (request_metrics as a dict)."""
    m = request_metrics(finals)
    return {} if m is None else m.as_dict()


def trace_spans(request: Request, job: Job, finals: list[RequestOutput]) -> None:
    """Hand a finished request to the OpenTelemetry tracer (server/tracing.py), when the server has one."""
    tracer = getattr(request.app.state.glassbox, "tracer", None)
    if tracer is not None:
        tracer.record(request.headers, job, finals, request.url.path)
