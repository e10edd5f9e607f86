"""POST /v1/completions: prompts (text or token ids, one or a batch) in, text completions out."""

from __future__ import annotations

import asyncio
from dataclasses import dataclass
from typing import Any

from fastapi.responses import JSONResponse, StreamingResponse
from starlette.background import BackgroundTask
from starlette.requests import Request
from starlette.responses import Response

from glassbox.outputs import CompletionOutput, RequestOutput
from glassbox.server.chat_prompt import text_prompts
from glassbox.server.errors import bad_request, unsupported
from glassbox.server.generation import (
    Job,
    anatomy,
    collect,
    finish_chunk,
    prepare,
    sampling_params,
    stream_events,
    submit,
    usage,
)
from glassbox.server.protocol import CompletionRequest
from glassbox.server.response_format import with_structured_outputs
from glassbox.server.state import ServerState
from glassbox.tokenizer.request_text import decode_in_pieces


@dataclass
class _Cursor:
    """How much of one choice a stream has sent."""

    text_len: int = 0
    tokens: int = 0
    text_offset: int = 0
    echoed: bool = False
    done: bool = False


def _joined(first: dict[str, list[Any]], then: dict[str, list[Any]]) -> dict[str, list[Any]]:
    """Two completions logprobs objects as one (the prompt's, then the generated tokens')."""
    return {key: first[key] + then[key] for key in first}


def _prompt_list(prompt: str | list[str] | list[int] | list[list[int]]) -> list[str | list[int]]:
    if isinstance(prompt, str):
        items: list[str | list[int]] = [prompt]
    elif not prompt:
        raise bad_request(
            "prompt is empty: give a string, strings, token ids or lists of token ids", "prompt"
        )
    elif all(isinstance(p, int) for p in prompt):
        items = [list(prompt)]  # type: ignore[arg-type]
    else:
        items = list(prompt)  # type: ignore[arg-type]
    for i, item in enumerate(items):
        if len(item) == 0:
            where = "prompt" if len(items) == 1 else f"prompt[{i}]"
            raise bad_request(f"{where} is empty: it must hold at least one token", "prompt")
    return items


@dataclass
class _Run:
    """One completions request under way: its job, each prompt's echo, and the logprobs it asked for."""

    state: ServerState
    req: CompletionRequest
    job: Job
    echo: list[str]  # each prompt's text, leading its choices (echo), else ""
    k: int | None  # logprobs per generated token
    echo_k: int | None  # the prompt tokens' logprobs lead each choice (echo with logprobs)
    echo_only: bool  # OpenAI's scoring call (max_tokens 0): the prompt and its logprobs, nothing generated
    head: dict[str, Any]

    def prompt_part(self, out: RequestOutput) -> dict[str, list[Any]] | None:
        if self.echo_k is None or out.prompt_logprobs is None:
            return None
        return self.state.logprobs.completion(out.prompt_token_ids, out.prompt_logprobs, self.echo_k)

    def reason(self, o: CompletionOutput) -> str | None:
        return "length" if self.echo_only and o.finish_reason is not None else o.finish_reason


async def create_completion(state: ServerState, req: CompletionRequest, request: Request) -> Response:
    run = await _start(state, req)
    if req.stream:
        return _stream(run, request)
    return await _whole(run, request)


async def _start(state: ServerState, req: CompletionRequest) -> _Run:
    """Check the request, tokenize its prompts and submit them."""
    state.check_model(req.model)
    if req.suffix:
        raise unsupported("suffix is not supported", "suffix")
    if req.best_of is not None and req.best_of != req.n:
        raise bad_request(f"best_of ({req.best_of}) must equal n ({req.n}) or be omitted", "best_of")
    if req.max_tokens == 0 and not req.echo:
        raise bad_request("max_tokens must be at least 1 (0 only with echo: the prompt alone)", "max_tokens")
    echo_only = req.max_tokens == 0
    max_tokens = 1 if echo_only else req.max_tokens
    k = req.logprobs
    echo_k = k if req.echo else None
    prompt_k = req.prompt_logprobs if echo_k is None else max(echo_k, req.prompt_logprobs or 0)
    params = sampling_params(req, max_tokens, None if echo_only else k, prompt_k)
    base = await with_structured_outputs(state, req, params)
    items = _prompt_list(req.prompt)
    texts = [item for item in items if isinstance(item, str)]  # all the items, or none
    if texts:
        encoded = await text_prompts(state, texts, True, req.special_tokens_in_user_text)
        prompts, tokenize_s = [p.ids for p in encoded], [p.tokenize_s for p in encoded]
    else:
        prompts, tokenize_s = [list(item) for item in items], [0.0] * len(items)  # type: ignore[arg-type]
    job = prepare(state, state.new_id("cmpl"), prompts, tokenize_s, base, max_tokens, "prompt")
    job.discard_outputs = echo_only
    # echo: each choice's text starts with its prompt's (token ids decoded verbatim, in a worker thread)
    echo = [""] * len(items)
    if req.echo:
        echo = texts or await asyncio.to_thread(
            lambda: [decode_in_pieces(state.tokenizer, p) for p in prompts]
        )
    submit(state, job)
    head = {
        "id": job.id,
        "object": "text_completion",
        "created": job.created,
        "model": job.model,
        "system_fingerprint": state.fingerprint,
    }
    return _Run(state, req, job, echo, k, echo_k, echo_only, head)


def _stream(run: _Run, request: Request) -> Response:
    """The choices as server-sent events, each choice's prompt echo in its first chunk."""
    state, req, job, k = run.state, run.req, run.job, run.k
    include_usage = bool(req.stream_options and req.stream_options.include_usage)
    cursors = [_Cursor() for _ in range(len(run.echo) * job.n)]

    def chunks_for(i: int, out: RequestOutput) -> list[dict[str, Any]]:
        chunks = []
        for o in out.outputs:
            index = i * job.n + o.index
            c = cursors[index]
            if c.done:
                continue
            text, logprobs = "", None
            if not c.echoed:  # the prompt leads the choice's first chunk
                c.echoed = True
                text, logprobs = run.echo[i], run.prompt_part(out)
                if logprobs is not None:
                    c.text_offset = sum(len(t) for t in logprobs["tokens"])
            if not run.echo_only:
                text += o.text[c.text_len :]
                if k is not None and o.logprobs is not None:
                    new = state.logprobs.completion(
                        o.token_ids[c.tokens :], o.logprobs[c.tokens :], k, c.text_offset
                    )
                    c.text_offset += sum(len(t) for t in new["tokens"])
                    logprobs = new if logprobs is None else _joined(logprobs, new)
            if text or (logprobs and logprobs["tokens"]):
                choice = {"index": index, "text": text, "logprobs": logprobs, "finish_reason": None}
                chunks.append({**run.head, "choices": [choice]})
            c.text_len, c.tokens, c.done = len(o.text), o.num_tokens, o.finish_reason is not None
            if c.done and o.finish_reason != "abort":
                chunk = finish_chunk(run.head, index, {"text": ""}, o)
                chunk["choices"][0]["finish_reason"] = run.reason(o)
                chunks.append(chunk)
        return chunks

    events = stream_events(job, request, [], chunks_for, run.head, include_usage)
    # the background task also runs when the client left before the stream began
    return StreamingResponse(
        events, media_type="text/event-stream", background=BackgroundTask(job.abort_unfinished)
    )


async def _whole(run: _Run, request: Request) -> Response:
    """Every choice at once, with usage and the anatomy."""
    state, req, job, k = run.state, run.req, run.job, run.k
    finals = await collect(job, request)
    choices: list[dict[str, Any]] = []
    for i, final in enumerate(finals):
        lead = run.prompt_part(final)
        offset = 0 if lead is None else sum(len(t) for t in lead["tokens"])
        for o in final.outputs:
            logprobs = lead
            if not run.echo_only and k is not None and o.logprobs is not None:
                new = state.logprobs.completion(o.token_ids, o.logprobs, k, offset)
                logprobs = new if lead is None else _joined(lead, new)
            choice = {
                "index": i * job.n + o.index,
                "text": run.echo[i] + ("" if run.echo_only else o.text),
                "logprobs": logprobs,
                "finish_reason": run.reason(o),
                "stop_reason": None if run.echo_only else o.stop_reason,
            }
            if req.prompt_logprobs is not None:  # vLLM's field
                choice["prompt_logprobs"] = state.logprobs.prompt_vllm(final, req.prompt_logprobs)
            choices.append(choice)
    choices.sort(key=lambda c: c["index"])
    return JSONResponse(
        {**run.head, "choices": choices, "usage": usage(job, finals), "metrics": anatomy(finals)}
    )
