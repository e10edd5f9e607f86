"""Prompts from API requests, the same for every dialect (chat, /tokenize, and each dialect's translation):

- ``template_variables``: a request's extra chat-template variables, refused when one names something the
  renderer sets itself (RESERVED_TEMPLATE_NAMES): one list for every route that renders a chat.
- ``chat_prompt`` / ``text_prompts``: the prompt's length checked before anything is read (text longer than
  max_model_len tokens can span is a 400, unread), then template rendering and tokenization in a worker
  thread (the event loop keeps serving), special-token strings in the request's text tokenized as text
  unless ``special_tokens_in_user_text`` (the request's field, else the server's flag) says otherwise
  (tokenizer/request_text.py).
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from glassbox.engine.request_check import CONTEXT_LENGTH_EXCEEDED
from glassbox.server.errors import ApiError, bad_request
from glassbox.server.state import ServerState
from glassbox.server.tools import template_messages
from glassbox.tokenizer.hf_tokenizer import Tokenizer
from glassbox.tokenizer.request_text import TRIM_CHARS, encode_chat_as_text, release_freed_memory

# Names a request may not set as template variables: the renderer's own parameters (a duplicate keyword is
# a TypeError) and the variables the server fills from checked fields (tools, documents).
RESERVED_TEMPLATE_NAMES = frozenset(
    {"self", "tokenizer", "messages", "add_generation_prompt", "continue_final_message", "tools", "documents"}
)


def template_variables(
    kwargs: Mapping[str, Any] | None, param: str = "chat_template_kwargs"
) -> dict[str, Any]:
    """The request's extra chat-template variables; 400 naming ``param`` when one is reserved."""
    variables = dict(kwargs or {})
    bad = sorted(RESERVED_TEMPLATE_NAMES & set(variables))
    if bad:
        raise bad_request(
            f"{param} may not set {', '.join(bad)}: the server sets these itself (from the request's own "
            "fields where it has them)",
            param,
        )
    return variables


@dataclass
class Prompt:
    """A prompt ready for the engine: its text (a chat: as rendered), ids and the seconds it took."""

    text: str
    ids: list[int]
    tokenize_s: float


def split_specials(state: ServerState, special_tokens_in_user_text: bool | None) -> bool:
    """Whether the request's text is tokenized with special-token strings kept as text."""
    allowed = special_tokens_in_user_text
    if allowed is None:
        allowed = state.settings.special_tokens_in_user_text
    return not allowed


def check_text_length(state: ServerState, chars: int, where: str, param: str) -> None:
    """400 (context_length_exceeded) for text longer than max_model_len tokens can span, before it is read."""
    limit = state.max_prompt_chars
    if limit is not None and chars > limit:
        raise bad_request(
            f"{where} has {chars} characters, more than the {limit} that this model's maximum length of "
            f"{state.max_model_len} tokens can hold; it was not tokenized",
            param,
            CONTEXT_LENGTH_EXCEEDED,
        )


def text_chars(value: Any) -> int:
    """Characters of every string in JSON-like ``value`` (keys too)."""
    total, stack = 0, [value]
    while stack:
        item = stack.pop()
        if isinstance(item, str):
            total += len(item)
        elif isinstance(item, dict):
            stack.extend(item.keys())
            stack.extend(item.values())
        elif isinstance(item, (list, tuple)):
            stack.extend(item)
    return total


def render_chat(
    tok: Tokenizer,
    messages: list[dict[str, Any]],
    add_generation_prompt: bool = True,
    continue_final_message: bool = False,
    variables: dict[str, Any] | None = None,
    as_text: bool = True,
) -> tuple[str, list[int]]:
    """(text, ids) of ``messages`` through the chat template (``as_text``: special-token strings in the
    request's data tokenized as text); 400 for anything the template rejects. Synchronous: ``chat_prompt``
    runs it in a worker thread."""
    chat = template_messages(messages)
    variables = variables or {}
    try:
        if as_text:
            text, ids = encode_chat_as_text(
                tok, chat, add_generation_prompt, continue_final_message, variables
            )
        else:
            text = tok.apply_chat_template(chat, add_generation_prompt, continue_final_message, **variables)
            ids = tok.encode(text, add_special_tokens=False)  # the template wrote any BOS
    except ValueError as e:
        raise bad_request(str(e), "messages") from None
    except ApiError:
        raise
    except Exception as e:  # a template's raise_exception, undefined fields, bad types: all the user's input
        raise bad_request(
            f"the chat template rejected the messages: {type(e).__name__}: {e}", "messages"
        ) from None
    if len(text) >= TRIM_CHARS:
        release_freed_memory()
    return text, ids


async def chat_prompt(
    state: ServerState,
    messages: list[dict[str, Any]],
    add_generation_prompt: bool = True,
    continue_final_message: bool = False,
    variables: dict[str, Any] | None = None,
    special_tokens_in_user_text: bool | None = None,
    param: str = "messages",
) -> Prompt:
    """``messages`` (plain dicts, OpenAI's shape) rendered with the chat template and tokenized, in a worker
    thread; ``variables``: checked template variables (``template_variables``, plus the server's ``tools``).
    400 for text too long to read, and for anything the template rejects."""
    variables = dict(variables or {})
    check_text_length(state, text_chars([messages, variables]), param, param)
    t0 = time.perf_counter()
    text, ids = await asyncio.to_thread(
        render_chat,
        state.tokenizer,
        messages,
        add_generation_prompt,
        continue_final_message,
        variables,
        split_specials(state, special_tokens_in_user_text),
    )
    return Prompt(text, ids, time.perf_counter() - t0)


def _encode_all(tok: Tokenizer, texts: list[str], add_special_tokens: bool, as_text: bool) -> list[Prompt]:
    out = []
    for text in texts:
        t0 = time.perf_counter()
        ids = tok.encode(text, add_special_tokens=add_special_tokens, split_special_tokens=as_text)
        out.append(Prompt(text, ids, time.perf_counter() - t0))
    if sum(len(text) for text in texts) >= TRIM_CHARS:
        release_freed_memory()
    return out


async def text_prompts(
    state: ServerState,
    texts: list[str],
    add_special_tokens: bool = True,
    special_tokens_in_user_text: bool | None = None,
    param: str = "prompt",
) -> list[Prompt]:
    """Each text tokenized (in a worker thread), after its length is checked (``param[i]`` names it)."""
    for i, text in enumerate(texts):
        check_text_length(state, len(text), param if len(texts) == 1 else f"{param}[{i}]", param)
    as_text = split_specials(state, special_tokens_in_user_text)
    return await asyncio.to_thread(_encode_all, state.tokenizer, texts, add_special_tokens, as_text)
