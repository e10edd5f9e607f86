"""Forwarding one request to its model's process, and its answer back (torch-free).

The answer streams through unchanged but for the anatomy: a request that waited for its model to load
gets the load as its own phase, ``metrics.load_s`` in the JSON body or the stream's last event (and
Ollama's own ``load_duration``, in nanoseconds), and an ``x-glassbox-load-seconds`` header. If the model's
process dies mid-request the client gets the API's own error (a 503 before the answer started, an error
event or line in a stream) naming the exit, never a hang.
"""

from __future__ import annotations

import asyncio
import json
import logging
from collections.abc import AsyncIterator, Callable
from typing import Any

import httpx
from fastapi import Request
from fastapi.responses import Response, StreamingResponse

from glassbox.server.errors import error_body, error_response_for
from glassbox.server.model_process import ModelProcess

logger = logging.getLogger(__name__)

# hop-by-hop and recomputed headers, not forwarded either way
_DROP = frozenset({"host", "content-length", "connection", "keep-alive", "transfer-encoding", "te", "upgrade",
                   "proxy-connection", "accept-encoding", "content-encoding"})  # fmt: skip
LOAD_HEADER = "x-glassbox-load-seconds"


def with_load(obj: Any, load_s: float) -> bool:
    """Put the load into an answer's anatomy (``metrics.load_s``; Ollama's ``load_duration``); whether the
    object carried one."""
    if not isinstance(obj, dict):
        return False
    found = False
    if isinstance(obj.get("metrics"), dict):
        obj["metrics"]["load_s"] = round(load_s, 6)
        found = True
    if "load_duration" in obj:
        obj["load_duration"] = int(load_s * 1e9)
        found = True
    return found


def _line_with_load(line: bytes, load_s: float) -> bytes:
    """An SSE ``data:`` line or an NDJSON line, with the load put in if it carries the anatomy."""
    if b'"metrics"' not in line and b'"load_duration"' not in line:
        return line
    prefix, text = (b"data: ", line[6:]) if line.startswith(b"data: ") else (b"", line)
    try:
        obj = json.loads(text)
    except ValueError:
        return line
    return prefix + json.dumps(obj).encode() if with_load(obj, load_s) else line


def _stream_error(path: str, media: str, message: str) -> bytes:
    """A failure told inside a stream, in the API's own words."""
    if "ndjson" in media:
        return json.dumps({"error": message}).encode() + b"\n"
    if path.startswith("/v1/messages"):
        body = {"type": "error", "error": {"type": "api_error", "message": message}}
        return b"event: error\ndata: " + json.dumps(body).encode() + b"\n\n"
    return b"data: " + json.dumps(error_body(503, message)).encode() + b"\n\n"


async def forward(
    client: httpx.AsyncClient,
    request: Request,
    body: bytes,
    process: ModelProcess,
    load_s: float,
    lost: Callable[[], str | None],
    done: Callable[[], None],
    drop_params: tuple[str, ...] = (),
) -> Response:
    """Send ``request`` (its ``body`` already read) to ``process``; ``lost()`` says why the process is gone,
    ``done()`` is called once the answer has been sent (or failed); ``drop_params``: query parameters that
    were the router's."""
    path = request.url.path
    headers = {k: v for k, v in request.headers.items() if k.lower() not in _DROP}
    params = httpx.QueryParams(
        [(k, v) for k, v in request.query_params.multi_items() if k not in drop_params]
    )
    outgoing = client.build_request(request.method, process.url + path, params=params, content=body,
                                    headers=headers)  # fmt: skip
    try:
        upstream = await client.send(outgoing, stream=True)
    except httpx.HTTPError as e:
        done()
        return error_response_for(
            request.app, path, 503, await _why(process, lost, e), "model", "model_crashed"
        )
    out_headers = {k: v for k, v in upstream.headers.items() if k.lower() not in _DROP}
    if load_s:
        out_headers[LOAD_HEADER] = f"{load_s:.3f}"
    media = upstream.headers.get("content-type", "")
    if "text/event-stream" not in media and "ndjson" not in media:
        try:
            data = await upstream.aread()
        except httpx.HTTPError as e:
            return error_response_for(
                request.app, path, 503, await _why(process, lost, e), "model", "model_crashed"
            )
        finally:
            await upstream.aclose()
            done()
        if load_s and "json" in media:
            try:
                obj = json.loads(data)
                if with_load(obj, load_s):
                    data = json.dumps(obj).encode()
            except ValueError:
                pass
        return Response(data, upstream.status_code, out_headers, media_type=None)

    async def lines() -> AsyncIterator[bytes]:
        buffer = b""
        try:
            async for chunk in upstream.aiter_raw():
                buffer += chunk
                *complete, buffer = buffer.split(b"\n")
                if complete:
                    yield b"\n".join(_line_with_load(x, load_s) if load_s else x for x in complete) + b"\n"
            if buffer:
                yield _line_with_load(buffer, load_s) if load_s else buffer
        except httpx.HTTPError as e:
            message = await _why(process, lost, e)
            logger.warning("%s %s: %s", request.method, path, message)
            yield _stream_error(path, media, message)
        finally:
            await upstream.aclose()
            done()

    return StreamingResponse(lines(), upstream.status_code, out_headers, media_type=media)


async def _why(process: ModelProcess, lost: Callable[[], str | None], error: Exception) -> str:
    """Why the process stopped answering: its exit where it died (waited for briefly), else the error."""
    if process.proc is not None and process.proc.returncode is None:
        try:
            await asyncio.wait_for(process.proc.wait(), 1.0)
        except asyncio.TimeoutError:
            pass
    return lost() or f"the model's process stopped answering: {type(error).__name__}: {error}"
