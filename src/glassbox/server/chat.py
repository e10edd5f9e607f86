"""POST /v1/chat/completions: messages rendered with the model's chat template, an assistant reply out."""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Any

from fastapi.responses import JSONResponse, StreamingResponse
from starlette.background import BackgroundTask
from starlette.requests import Request
from starlette.responses import Response

from glassbox.engine.request_check import CONTEXT_LENGTH_EXCEEDED
from glassbox.outputs import RequestOutput
from glassbox.sampling_params import SamplingParams
from glassbox.server.chat_output import ChatPlan, ChoiceReader, choice_chunks, finish_reason, plan_chat
from glassbox.server.chat_prompt import chat_prompt
from glassbox.server.errors import bad_request, param_of_value_error
from glassbox.server.generation import (
    Job,
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


@dataclass
class ChatRun:
    """A request checked and queued: its job, one reader per choice, its max_tokens and whether that was
    cut to the room the prompt leaves (``fit_max_tokens``)."""

    job: Job
    readers: list[ChoiceReader]
    max_tokens: int | None
    fitted: bool = False


@dataclass
class Prompt:
    """A chat request's prompt: how its reply is read (``plan``), the template's text and its token ids."""

    plan: ChatPlan
    text: str
    ids: list[int]
    tokenize_s: float
    max_tokens: int | None


async def render_prompt(state: ServerState, req: ChatCompletionRequest) -> Prompt:
    """Check a chat request (model, sampling params, tools, structured outputs, template variables) and
    render its prompt with the chat template, in a worker thread (server/chat_prompt.py); 400 naming the
    parameter for anything wrong."""
    state.check_model(req.model)
    if req.top_logprobs is not None and not req.logprobs:
        raise bad_request("top_logprobs needs logprobs to be true", "top_logprobs")
    k = (req.top_logprobs or 0) if req.logprobs else None
    max_tokens = req.max_completion_tokens if req.max_completion_tokens is not None else req.max_tokens
    params = sampling_params(req, max_tokens, k, req.prompt_logprobs)
    plan = plan_chat(state, req, await with_structured_outputs(state, req, params))
    messages = [m.model_dump(exclude_none=True) for m in req.messages]
    prompt = await chat_prompt(
        state, messages, *chat_flags(req), plan.template_kwargs, req.special_tokens_in_user_text
    )
    return Prompt(plan, prompt.text, prompt.ids, prompt.tokenize_s, max_tokens)


async def start_chat(
    state: ServerState, req: ChatCompletionRequest, prefix: str = "chatcmpl", fit_max_tokens: bool = False
) -> ChatRun:
    """The one path from a chat request to queued engine requests, whichever API it came through: the
    request's checks, sampling params, tools, structured outputs and reasoning, the chat template, the
    length limits and submission (``start_run``)."""
    p = await render_prompt(state, req)
    readers = p.plan.readers(p.plan.params.n, p.text)
    return start_run(state, prefix, p.ids, p.tokenize_s, p.plan.params, p.max_tokens, readers, fit_max_tokens)


def start_run(
    state: ServerState,
    prefix: str,
    ids: list[int],
    tokenize_s: float,
    params: SamplingParams,
    max_tokens: int | None,
    readers: list[ChoiceReader],
    fit_max_tokens: bool = False,
) -> ChatRun:
    """Check a prompt against the length limits and queue it. ``fit_max_tokens`` (the Anthropic, Ollama and
    Responses doors): a max_tokens beyond the room the prompt leaves is cut to that room rather than
    refused, as clients of those APIs send their own large defaults (Claude Code's 32000); a prompt that
    leaves no room is a 400 in Anthropic's words, which Claude Code reads to compact the chat."""
    limit = min(state.max_model_len, state.kv_capacity_tokens)
    room = limit - len(ids)
    if fit_max_tokens and room <= 0:
        raise bad_request(
            f"prompt is too long: {len(ids)} tokens > {limit - 1} maximum (the context holds {limit} "
            "tokens, prompt and output)",
            "messages",
            CONTEXT_LENGTH_EXCEEDED,
        )
    fitted = fit_max_tokens and max_tokens is not None and room < max_tokens
    if fitted:
        max_tokens = room
        try:
            params = replace(params, max_tokens=room)
        except ValueError as e:  # min_tokens above the room left
            raise bad_request(str(e), param_of_value_error(str(e), {"min_tokens"})) from None
    job = prepare(state, state.new_id(prefix), [ids], [tokenize_s], params, max_tokens, "messages")
    submit(state, job)
    return ChatRun(job, readers, max_tokens, fitted)


async def create_chat_completion(
    state: ServerState, req: ChatCompletionRequest, request: Request
) -> Response:
    run = await start_chat(state, req)
    job, readers = run.job, run.readers
    k = (req.top_logprobs or 0) if req.logprobs else None
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
