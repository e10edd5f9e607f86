"""One benchmark request over an OpenAI-compatible streaming API, timed chunk by chunk; and server probes.

Works with glassbox, vLLM, llama.cpp's server and Ollama's OpenAI endpoint. Output tokens come from the
stream's ``usage`` (stream_options.include_usage) when the server sends it, else from the number of
content chunks. Server-side timings come from a top-level ``metrics`` object (glassbox) or llama.cpp's
``timings``.
"""

from __future__ import annotations

import asyncio
import json
import time
from dataclasses import dataclass, field
from typing import Any

import httpx

from glassbox.anatomy import METRIC_KEYS
from glassbox.bench.workloads import RequestSpec

SERVER_KEYS = METRIC_KEYS  # what glassbox reports per request in ``metrics`` (engine/sequence.py)


def client_limits() -> httpx.Limits:
    """Connection limits for a benchmark's client: no cap on connections, and idle ones dropped after 2 s.

    httpx keeps an idle connection 5 s by default, exactly uvicorn's keep-alive timeout: a request sent on a
    connection the server is closing at that moment fails with "server disconnected". Dropping ours first
    costs a new TCP connection after an idle gap of 2 s or more (well under a millisecond on a LAN).
    """
    return httpx.Limits(max_connections=None, max_keepalive_connections=256, keepalive_expiry=2.0)


@dataclass
class RequestOptions:
    """How requests are sent (the same for every request of a benchmark)."""

    base_url: str
    model: str
    endpoint: str = "completions"  # or "chat"
    fixed_output: bool = True  # ask for exactly max_tokens (ignore_eos + min_tokens)
    temperature: float = 0.0
    timeout_s: float = 300.0
    api_key: str | None = None


@dataclass
class RequestResult:
    """What one request did. Times are seconds from the moment it was sent."""

    ok: bool
    start: float = 0.0  # time.perf_counter() when sent
    ttft_s: float | None = None
    ttfr_s: float | None = None  # to the first chunk with a choice, content or not (llama-benchy's ttfr)
    e2e_s: float | None = None
    itl_s: list[float] = field(default_factory=list)  # gaps between content chunks
    prompt_tokens: int | None = None
    output_tokens: int = 0
    usage_reported: bool = False
    cached_prompt_tokens: int | None = None  # usage.prompt_tokens_details.cached_tokens, when reported
    max_tokens: int = 0
    finish_reason: str | None = None
    error: str | None = None  # error class: http_400, timeout, connect_error, stream_error, ...
    error_detail: str = ""
    server: dict[str, float] | None = None  # the server's per-request metrics, when it sends them

    @property
    def end(self) -> float:
        return self.start + (self.e2e_s or 0.0)


def build_body(spec: RequestSpec, opts: RequestOptions) -> dict[str, Any]:
    """The JSON body of one streaming request."""
    body: dict[str, Any] = {
        "model": opts.model,
        "max_tokens": spec.max_tokens,
        "temperature": opts.temperature,
        "stream": True,
        "stream_options": {"include_usage": True},
    }
    if opts.endpoint == "chat":
        body["messages"] = [{"role": "user", "content": spec.prompt}]
    else:
        body["prompt"] = spec.prompt
    if opts.fixed_output:
        body["ignore_eos"] = True
        body["min_tokens"] = spec.max_tokens
    return body


def _error_message(raw: bytes) -> str:
    try:
        body = json.loads(raw)
    except (json.JSONDecodeError, UnicodeDecodeError):
        return raw[:300].decode("utf-8", "replace")
    err = body.get("error", body) if isinstance(body, dict) else body
    if isinstance(err, dict):
        return str(err.get("message") or err.get("detail") or err)[:300]
    return str(err)[:300]


def server_metrics(chunk: dict[str, Any]) -> dict[str, float] | None:
    """Per-request server timings in a chunk: glassbox's ``metrics`` or llama.cpp's ``timings``."""
    m = chunk.get("metrics")
    if isinstance(m, dict):
        return {k: float(m[k]) for k in SERVER_KEYS if isinstance(m.get(k), (int, float))}
    t = chunk.get("timings")
    if isinstance(t, dict) and "prompt_ms" in t:
        out = {
            "prefill_s": float(t.get("prompt_ms", 0.0)) / 1e3,
            "decode_s": float(t.get("predicted_ms", 0.0)) / 1e3,
        }
        for src, dst in (
            ("prompt_n", "prompt_tokens"),
            ("predicted_n", "output_tokens"),
            ("cache_n", "cached_prompt_tokens"),
            ("prompt_per_second", "prefill_tok_s"),
            ("predicted_per_second", "decode_tok_s"),
        ):
            if isinstance(t.get(src), (int, float)):
                out[dst] = float(t[src])
        return out
    return None


def _chunk_text(choice: dict[str, Any]) -> str:
    if "text" in choice:
        return str(choice.get("text") or "")
    delta = choice.get("delta") or {}
    return str(delta.get("content") or delta.get("reasoning_content") or "")


async def _stream(
    client: httpx.AsyncClient, spec: RequestSpec, opts: RequestOptions, res: RequestResult
) -> None:
    path = "/v1/chat/completions" if opts.endpoint == "chat" else "/v1/completions"
    headers = {"Authorization": f"Bearer {opts.api_key}"} if opts.api_key else {}
    last = res.start
    chunks = 0
    async with client.stream("POST", opts.base_url + path, json=build_body(spec, opts), headers=headers) as r:
        if r.status_code != 200:
            res.error, res.error_detail = f"http_{r.status_code}", _error_message(await r.aread())
            return
        async for line in r.aiter_lines():
            if not line.startswith("data:"):
                continue
            data = line[5:].strip()
            if data == "[DONE]":
                break
            now = time.perf_counter()
            chunk = json.loads(data)
            if "error" in chunk:
                res.error, res.error_detail = "stream_error", _error_message(data.encode())
                return
            if (m := server_metrics(chunk)) is not None:
                res.server = m
            if isinstance(chunk.get("usage"), dict):
                usage = chunk["usage"]
                res.usage_reported = isinstance(usage.get("completion_tokens"), int)
                res.output_tokens = int(usage.get("completion_tokens") or 0)
                if isinstance(usage.get("prompt_tokens"), int):
                    res.prompt_tokens = usage["prompt_tokens"]
                cached = (usage.get("prompt_tokens_details") or {}).get("cached_tokens")
                if isinstance(cached, int):
                    res.cached_prompt_tokens = cached
            if chunk.get("choices") and res.ttfr_s is None:
                res.ttfr_s = now - res.start
            for choice in chunk.get("choices") or []:
                if choice.get("finish_reason"):
                    res.finish_reason = str(choice["finish_reason"])
                if not _chunk_text(choice):
                    continue
                if res.ttft_s is None:
                    res.ttft_s = now - res.start
                else:
                    res.itl_s.append(now - last)
                last = now
                chunks += 1
    res.e2e_s = time.perf_counter() - res.start
    if not res.usage_reported:
        res.output_tokens = chunks
    if res.ttft_s is None:
        if res.output_tokens > 0 and res.finish_reason is not None and res.ttfr_s is not None:
            # tokens were generated but none had visible text (special tokens, or bytes of an unfinished
            # UTF-8 character): a finished request, timed from its first chunk as vLLM's client does
            res.ttft_s = res.ttfr_s
        else:
            res.error, res.error_detail = "no_output", "the stream ended without any generated text"
            return
    res.ok = True


async def send_request(client: httpx.AsyncClient, spec: RequestSpec, opts: RequestOptions) -> RequestResult:
    """Send one streaming request and time it; never raises for a failed request (it returns ok=False)."""
    res = RequestResult(
        ok=False, start=time.perf_counter(), prompt_tokens=spec.prompt_tokens, max_tokens=spec.max_tokens
    )
    try:
        await asyncio.wait_for(_stream(client, spec, opts, res), timeout=opts.timeout_s)
    except asyncio.TimeoutError:
        res.error, res.error_detail = "timeout", f"no complete answer within {opts.timeout_s:g} s"
    except httpx.TimeoutException as e:
        res.error, res.error_detail = "timeout", repr(e)
    except httpx.ConnectError as e:
        res.error, res.error_detail = "connect_error", str(e)[:300]
    except httpx.HTTPError as e:
        res.error, res.error_detail = "transport_error", repr(e)[:300]
    except (json.JSONDecodeError, ValueError) as e:
        res.error, res.error_detail = "bad_stream", str(e)[:300]
    if not res.ok:  # a failed request's time counts until it failed
        res.e2e_s = time.perf_counter() - res.start
    return res


@dataclass
class ServerInfo:
    """What the server says about itself."""

    model: str
    max_model_len: int | None
    models: list[str]


def probe_server(client: httpx.Client, base_url: str, model: str | None) -> ServerInfo:
    """GET /v1/models (and llama.cpp's /props): the model to use and its context limit when given."""
    r = client.get(base_url + "/v1/models")
    r.raise_for_status()
    data = r.json().get("data") or []
    ids = [str(m.get("id")) for m in data if isinstance(m, dict) and m.get("id")]
    chosen = model or (ids[0] if ids else None)
    if chosen is None:
        raise ValueError(f"{base_url}/v1/models lists no model; pass --model")
    max_len: int | None = None
    for m in data:
        if isinstance(m, dict) and m.get("id") == chosen:
            v = m.get("max_model_len") or m.get("context_length") or (m.get("meta") or {}).get("n_ctx_train")
            max_len = int(v) if isinstance(v, int) else None
    try:  # llama.cpp: the context the server was started with
        p = client.get(base_url + "/props")
        if p.status_code == 200:
            props = p.json()
            n_ctx = props.get("n_ctx") or (props.get("default_generation_settings") or {}).get("n_ctx")
            if isinstance(n_ctx, int) and n_ctx > 0:
                max_len = n_ctx
    except (httpx.HTTPError, ValueError):
        pass
    return ServerInfo(chosen, max_len, ids)
