"""POST /v1/completions: prompts (text or token ids, one or a batch) in, text completions out."""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Any

from fastapi.responses import JSONResponse, StreamingResponse
from starlette.background import BackgroundTask
from starlette.requests import Request
from starlette.responses import Response

from glassbox.outputs import RequestOutput
from glassbox.server.errors import bad_request, unsupported
from glassbox.server.generation import (
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


@dataclass
class _Cursor:
    """How much of one choice a stream has sent."""

    text_len: int = 0
    tokens: int = 0
    text_offset: int = 0
    done: bool = False


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


async def create_completion(state: ServerState, req: CompletionRequest, request: Request) -> Response:
    state.check_model(req.model)
    if req.echo and req.logprobs is not None:
        raise unsupported(
            "echo with logprobs is not supported: it needs the prompt's logprobs, which the engine does not "
            "compute; use echo or logprobs alone",
            "echo",
            "unsupported_value",
        )
    if req.suffix:
        raise unsupported("suffix is not supported", "suffix")
    if req.best_of is not None and req.best_of != req.n:
        raise bad_request(f"best_of ({req.best_of}) must equal n ({req.n}) or be omitted", "best_of")
    base = with_structured_outputs(state, req, sampling_params(req, req.max_tokens, req.logprobs))
    prompts: list[list[int]] = []
    tokenize_s: list[float] = []
    items = _prompt_list(req.prompt)
    for item in items:
        t0 = time.perf_counter()
        prompts.append(state.tokenizer.encode(item) if isinstance(item, str) else list(item))
        tokenize_s.append(time.perf_counter() - t0)
    job = prepare(state, state.new_id("cmpl"), prompts, tokenize_s, base, req.max_tokens, "prompt")
    # echo: each choice's text starts with its prompt's (token ids decoded verbatim)
    echo = [
        (item if isinstance(item, str) else state.tokenizer.decode(item, skip_special_tokens=False))
        if req.echo
        else ""
        for item in items
    ]
    submit(state, job)
    k = req.logprobs
    head = {
        "id": job.id,
        "object": "text_completion",
        "created": job.created,
        "model": job.model,
        "system_fingerprint": state.fingerprint,
    }
    if req.stream:
        include_usage = bool(req.stream_options and req.stream_options.include_usage)
        cursors = [_Cursor() for _ in range(len(prompts) * job.n)]

        def chunks_for(i: int, out: RequestOutput) -> list[dict[str, Any]]:
            chunks = []
            for o in out.outputs:
                index = i * job.n + o.index
                c = cursors[index]
                if c.done:
                    continue
                text = o.text[c.text_len :]
                logprobs = None
                if k is not None and o.logprobs is not None:
                    logprobs = state.logprobs.completion(
                        o.token_ids[c.tokens :], o.logprobs[c.tokens :], k, c.text_offset
                    )
                if text or (logprobs and logprobs["tokens"]):
                    choice = {"index": index, "text": text, "logprobs": logprobs, "finish_reason": None}
                    chunks.append({**head, "choices": [choice]})
                if logprobs is not None:
                    c.text_offset += sum(len(t) for t in logprobs["tokens"])
                c.text_len, c.tokens, c.done = len(o.text), o.num_tokens, o.finish_reason is not None
                if c.done and o.finish_reason != "abort":
                    chunks.append(finish_chunk(head, index, {"text": ""}, o))
            return chunks

        first = [
            {
                **head,
                "choices": [
                    {"index": i * job.n + j, "text": echo[i], "logprobs": None, "finish_reason": None}
                ],
            }
            for i in range(len(prompts))
            for j in range(job.n)
            if echo[i]
        ]
        events = stream_events(job, request, first, chunks_for, head, include_usage)
        # the background task also runs when the client left before the stream began
        return StreamingResponse(
            events, media_type="text/event-stream", background=BackgroundTask(job.abort_unfinished)
        )

    finals = await collect(job, request)
    choices: list[dict[str, Any]] = []
    for i, final in enumerate(finals):
        for o in final.outputs:
            logprobs = None
            if k is not None and o.logprobs is not None:
                logprobs = state.logprobs.completion(o.token_ids, o.logprobs, k)
            choices.append(
                {
                    "index": i * job.n + o.index,
                    "text": echo[i] + o.text,
                    "logprobs": logprobs,
                    "finish_reason": o.finish_reason,
                    "stop_reason": o.stop_reason,
                }
            )
    choices.sort(key=lambda c: c["index"])
    return JSONResponse({**head, "choices": choices, "usage": usage(job, finals), "metrics": anatomy(finals)})
