"""POST /v1/chat/completions: messages rendered with the model's chat template, an assistant reply out."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from fastapi.responses import JSONResponse, StreamingResponse
from starlette.background import BackgroundTask
from starlette.requests import Request
from starlette.responses import Response

from glassbox.outputs import RequestOutput
from glassbox.server.chat_output import choice_chunks, finish_reason, plan_chat
from glassbox.server.chat_prompt import chat_prompt
from glassbox.server.errors import bad_request
from glassbox.server.generation import (
    anatomy,
    collect,
    prepare,
    sampling_params,
    stream_events,
    submit,
    usage,
)
from glassbox.server.protocol import ChatCompletionRequest, TokenizeRequest
from glassbox.server.response_format import with_structured_outputs
from glassbox.server.state import ServerState


@dataclass
class _Cursor:
    text_len: int = 0
    tokens: int = 0
    done: bool = False


def chat_flags(req: ChatCompletionRequest | TokenizeRequest) -> tuple[bool, bool]:
    """(add_generation_prompt, continue_final_message): continuing the last message opens no new turn, so
    add_generation_prompt is false unless the request set it, and 400 when it set both true."""
    if not req.continue_final_message:
        return req.add_generation_prompt, False
    if req.add_generation_prompt and "add_generation_prompt" in req.model_fields_set:
        raise bad_request(
            "continue_final_message and add_generation_prompt cannot both be true: the first continues the "
            "last message, the second opens a new assistant turn",
            "continue_final_message",
        )
    return False, True


async def create_chat_completion(
    state: ServerState, req: ChatCompletionRequest, request: Request
) -> Response:
    state.check_model(req.model)
    if req.top_logprobs is not None and not req.logprobs:
        raise bad_request("top_logprobs needs logprobs to be true", "top_logprobs")
    k = (req.top_logprobs or 0) if req.logprobs else None
    max_tokens = req.max_completion_tokens if req.max_completion_tokens is not None else req.max_tokens
    params = sampling_params(req, max_tokens, k, req.prompt_logprobs)
    plan = plan_chat(state, req, await with_structured_outputs(state, req, params))
    base = plan.params
    messages = [m.model_dump(exclude_none=True) for m in req.messages]
    prompt = await chat_prompt(
        state, messages, *chat_flags(req), plan.template_kwargs, req.special_tokens_in_user_text
    )
    job = prepare(state, state.new_id("chatcmpl"), [prompt.ids], [prompt.tokenize_s], base, max_tokens,
                  "messages")  # fmt: skip
    submit(state, job)
    readers = plan.readers(job.n, prompt.text)
    head = {
        "id": job.id,
        "object": "chat.completion.chunk",
        "created": job.created,
        "model": job.model,
        "system_fingerprint": state.fingerprint,
    }
    if req.stream:
        include_usage = bool(req.stream_options and req.stream_options.include_usage)
        cursors = [_Cursor() for _ in range(job.n)]
        first = [
            {
                **head,
                "choices": [
                    {
                        "index": j,
                        "delta": {"role": "assistant", "content": ""},
                        "logprobs": None,
                        "finish_reason": None,
                    }
                ],
            }
            for j in range(job.n)
        ]

        def chunks_for(i: int, out: RequestOutput) -> list[dict[str, Any]]:
            chunks = []
            for o in out.outputs:
                c = cursors[o.index]
                if c.done:
                    continue
                text = o.text[c.text_len :]
                logprobs = None
                if k is not None and o.logprobs is not None:
                    logprobs = {
                        "content": state.logprobs.chat(o.token_ids[c.tokens :], o.logprobs[c.tokens :], k)
                    }
                if not text and o.finish_reason is None and not (logprobs and logprobs["content"]):
                    continue
                c.text_len, c.tokens, c.done = len(o.text), o.num_tokens, o.finish_reason is not None
                reader = readers[o.index]
                chunks += choice_chunks(head, o.index, reader, text, logprobs, o.finish_reason, o.stop_reason)
            return chunks

        events = stream_events(job, request, first, chunks_for, head, include_usage)
        # the background task also runs when the client left before the stream began
        return StreamingResponse(
            events, media_type="text/event-stream", background=BackgroundTask(job.abort_unfinished)
        )

    final = (await collect(job, request))[0]
    choices: list[dict[str, Any]] = []
    for o in final.outputs:
        logprobs = None
        if k is not None and o.logprobs is not None:
            logprobs = {"content": state.logprobs.chat(o.token_ids, o.logprobs, k)}
        choices.append(
            {
                "index": o.index,
                "message": readers[o.index].message(o.text),
                "logprobs": logprobs,
                "finish_reason": finish_reason(readers[o.index], o.finish_reason),
                "stop_reason": o.stop_reason,
            }
        )
    choices.sort(key=lambda c: c["index"])
    body = {
        **head,
        "object": "chat.completion",
        "choices": choices,
        "usage": usage(job, [final]),
        "metrics": anatomy([final]),
    }
    if req.prompt_logprobs is not None:  # vLLM's field
        body["prompt_logprobs"] = state.logprobs.prompt_vllm(final, req.prompt_logprobs)
    return JSONResponse(body)
