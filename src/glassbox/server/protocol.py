"""The OpenAI-compatible wire format: pydantic request models (validated) and response models (documented).

Request fields use OpenAI's names plus vLLM's sampling extras (top_k, min_p, repetition_penalty,
ignore_eos, min_tokens, stop_token_ids, ...). Unknown fields are ignored, as OpenAI clients send some we
do not use; NaN and infinity are rejected, and so is a string holding a lone UTF-16 surrogate (JSON lets
"\\ud800" through; no tokenizer can encode it). Every response also carries ``metrics``: the anatomy of
the request (queue, prefill, decode, ...), which OpenAI clients ignore and our bench client reads.
"""

from __future__ import annotations

import re
from typing import Annotated, Any, Literal

from pydantic import AfterValidator, BaseModel, ConfigDict, Field, WithJsonSchema
from pydantic_core import PydanticCustomError

from glassbox.sampling_params import INT64_MAX, INT64_MIN, MAX_LOGPROBS

MAX_N = 128


def _token_id(value: int) -> int:
    if value < 0:
        raise PydanticCustomError("token_id", "token ids must be >= 0, got {value}", {"value": value})
    return value


# a vocabulary index: the error says so (a negative id in a prompt union is not "a valid string")
TokenId = Annotated[int, AfterValidator(_token_id), WithJsonSchema({"type": "integer", "minimum": 0})]


class _Request(BaseModel):
    # strict: a number field takes a JSON number (a bool is not 1, "5" is not 5), a bool field true/false
    model_config = ConfigDict(extra="ignore", allow_inf_nan=False, strict=True)


_SURROGATE = re.compile("[\ud800-\udfff]")


def _has_surrogate(text: str) -> bool:
    return _SURROGATE.search(text) is not None


def _lone_surrogate(value: Any, path: str) -> str | None:
    """The path of the first string in ``value`` holding a lone UTF-16 surrogate ("messages[0].content";
    for a key, the path of its object, "" at the top), or None."""
    if isinstance(value, str):
        return path if _has_surrogate(value) else None
    if isinstance(value, dict):
        for key, item in value.items():
            if _has_surrogate(str(key)):
                return path
            found = _lone_surrogate(item, f"{path}.{key}" if path else str(key))
            if found is not None:
                return found
    elif isinstance(value, list):
        for i, item in enumerate(value):
            found = _lone_surrogate(item, f"{path}[{i}]")
            if found is not None:
                return found
    return None


class _Body(_Request):
    """A whole request body. Its JSON was checked before validation (server/request_limits.py): no lone
    surrogate, at most MAX_JSON_VALUES values."""


_SPECIALS = (
    "true: a special token's text in the prompt or messages becomes that token (default: the server's "
    "--special-tokens-in-user-text, else it stays text; the chat template's own markup is always tokens)"
)


class StreamOptions(_Request):
    include_usage: bool = False


class SamplingFields(_Body):
    """Fields shared by /v1/completions and /v1/chat/completions."""

    model: str | None = Field(None, description="the served model name (default: the one served)")
    n: int = Field(1, ge=1, le=MAX_N)
    temperature: float | None = Field(None, ge=0.0, le=100.0, description="0 is greedy (default 1)")
    top_p: float | None = Field(None, gt=0.0, le=1.0)
    stop: str | list[str] | None = None
    seed: int | None = Field(None, ge=INT64_MIN, le=INT64_MAX)
    stream: bool = False
    stream_options: StreamOptions | None = None
    presence_penalty: float | None = Field(None, ge=-2.0, le=2.0)
    frequency_penalty: float | None = Field(None, ge=-2.0, le=2.0)
    logit_bias: dict[str, float] | None = Field(
        None, description="token id (a string) -> bias in [-100, 100], added to the logit before sampling"
    )
    user: str | None = None
    # vLLM's extras
    top_k: int | None = Field(None, ge=-1, description="-1 or 0: off")
    min_p: float | None = Field(None, ge=0.0, le=1.0)
    repetition_penalty: float | None = Field(None, ge=0.01, le=100.0)
    ignore_eos: bool = False
    min_tokens: int = Field(0, ge=0)
    stop_token_ids: list[TokenId] | None = None
    include_stop_str_in_output: bool = False
    skip_special_tokens: bool = True
    prompt_logprobs: int | None = Field(
        None, ge=0, le=MAX_LOGPROBS, description="each prompt token's logprob and the top N (not with stream)"
    )
    # structured outputs (server/response_format.py): OpenAI's, vLLM's, vLLM's older names; one at most
    response_format: dict[str, Any] | None = Field(
        None,
        description='{"type": "text" | "json_object" | "json_schema", "json_schema": {"name", "schema"}}',
    )
    structured_outputs: dict[str, Any] | None = Field(
        None, description="vLLM's: one of json (a schema), regex, choice, grammar (Lark or GBNF), json_object"
    )
    guided_json: dict[str, Any] | str | None = None
    guided_regex: str | None = None
    guided_choice: list[str] | None = None
    guided_grammar: str | None = None
    guided_whitespace_pattern: str | None = Field(None, description="not supported: must be null")
    guided_decoding_backend: str | None = Field(None, description="ignored: the backend is llguidance")
    special_tokens_in_user_text: bool | None = Field(None, description=_SPECIALS)


class CompletionRequest(SamplingFields):
    """POST /v1/completions. ``prompt``: a string, strings, token ids, or lists of token ids."""

    # token ids before strings: a union tries its members in turn, and list[str] on 262,144 ids builds an
    # error per id (216 ms of pydantic, against 41 ms this way round)
    prompt: str | list[TokenId] | list[str] | list[list[TokenId]]
    max_tokens: int | None = Field(
        16, ge=0, description="null: up to the max model length; 0 (with echo only): the prompt alone"
    )
    logprobs: int | None = Field(None, ge=0, le=MAX_LOGPROBS)
    echo: bool = Field(False, description="the prompt (with logprobs: and its logprobs) before each choice's")
    suffix: str | None = Field(None, description="not supported: must be null")
    best_of: int | None = Field(None, ge=1, le=MAX_N, description="must equal n when given")


class TextPart(_Request):
    type: Literal["text"]
    text: str


class ChatMessage(BaseModel):
    model_config = ConfigDict(extra="allow", allow_inf_nan=False)

    role: Literal["system", "developer", "user", "assistant", "tool"]
    content: str | list[TextPart] | None = None
    name: str | None = None


class ChatCompletionRequest(SamplingFields):
    """POST /v1/chat/completions: the messages are rendered with the model's chat template."""

    messages: list[ChatMessage] = Field(min_length=1)
    max_tokens: int | None = Field(None, ge=1, description="null: up to the max model length")
    max_completion_tokens: int | None = Field(None, ge=1, description="OpenAI's newer name for max_tokens")
    logprobs: bool = False
    top_logprobs: int | None = Field(None, ge=0, le=MAX_LOGPROBS)
    tools: list[dict[str, Any]] | None = Field(None, description='[{"type": "function", "function": {...}}]')
    tool_choice: str | dict[str, Any] | None = Field(None, description="none, auto, required or named")
    parallel_tool_calls: bool | None = Field(None, description="false: at most one call (default true)")
    chat_template_kwargs: dict[str, Any] | None = Field(None, description="extra chat template variables")
    add_generation_prompt: bool = Field(
        True, description="false when continue_final_message is and this is unset"
    )
    continue_final_message: bool = Field(
        False, description="leave the last message open (no end-of-turn) for the model to continue"
    )


class TokenizeRequest(_Body):
    """POST /tokenize: exactly one of ``prompt`` (text) or ``messages`` (rendered with the chat template,
    as /v1/chat/completions renders them)."""

    model: str | None = None
    prompt: str | None = None
    messages: list[ChatMessage] | None = None
    tools: list[dict[str, Any]] | None = Field(None, description="for messages: the tools the template shows")
    chat_template_kwargs: dict[str, Any] | None = None
    add_special_tokens: bool = Field(True, description="for a prompt: add the tokenizer's BOS/EOS")
    add_generation_prompt: bool = Field(
        True, description="false when continue_final_message is and this is unset"
    )
    continue_final_message: bool = False
    return_token_strs: bool = Field(False, description="also return each token's vocabulary string")
    special_tokens_in_user_text: bool | None = Field(None, description=_SPECIALS)


class DetokenizeRequest(_Body):
    model: str | None = None
    tokens: list[TokenId]


# -- responses (documentation; handlers build the same shapes as dicts) ------------------------------


class RequestAnatomy(BaseModel):
    """The request's anatomy in seconds and tokens (our addition; OpenAI clients ignore it): the fields
    of engine/sequence.py's METRIC_KEYS, for the OpenAPI schema (tests/test_structure.py keeps them equal)."""

    tokenize_s: float
    queue_s: float
    prefill_s: float
    ttft_s: float
    decode_s: float
    detokenize_s: float
    e2e_s: float
    prompt_tokens: int
    cached_prompt_tokens: int
    output_tokens: int
    prefill_tok_s: float
    decode_tok_s: float
    preemptions: int
    spec_drafts: int
    spec_draft_tokens: int
    spec_accepted_tokens: int
    spec_acceptance_rate: float
    spec_mean_acceptance_length: float


class PromptTokensDetails(BaseModel):
    cached_tokens: int


class Usage(BaseModel):
    prompt_tokens: int
    completion_tokens: int
    total_tokens: int
    prompt_tokens_details: PromptTokensDetails | None = None


class CompletionLogprobs(BaseModel):
    tokens: list[str]
    token_logprobs: list[float | None]
    top_logprobs: list[dict[str, float] | None]
    text_offset: list[int]


class PromptLogprob(BaseModel):
    logprob: float
    rank: int
    decoded_token: str


PromptLogprobs = list[dict[str, PromptLogprob] | None]  # vLLM's: by token id, null for the first token


class CompletionChoice(BaseModel):
    index: int
    text: str
    logprobs: CompletionLogprobs | None = None
    finish_reason: str | None = None
    stop_reason: int | str | None = None
    prompt_logprobs: PromptLogprobs | None = Field(None, description="when prompt_logprobs was asked")


class CompletionResponse(BaseModel):
    id: str
    object: Literal["text_completion"]
    created: int
    model: str
    choices: list[CompletionChoice]
    system_fingerprint: str | None = None
    usage: Usage | None = None
    metrics: RequestAnatomy | None = None


class TopLogprob(BaseModel):
    token: str
    logprob: float
    bytes: list[int] | None = None


class TokenLogprob(TopLogprob):
    top_logprobs: list[TopLogprob]


class ChatLogprobs(BaseModel):
    content: list[TokenLogprob] | None = None


class FunctionCall(BaseModel):
    name: str
    arguments: str = Field(description="JSON text")


class ToolCall(BaseModel):
    id: str
    type: Literal["function"]
    function: FunctionCall


class AssistantMessage(BaseModel):
    role: Literal["assistant"]
    content: str | None = None
    tool_calls: list[ToolCall] | None = None
    reasoning_content: str | None = Field(None, description="with --reasoning-parser (also as reasoning)")


class ChatChoice(BaseModel):
    index: int
    message: AssistantMessage
    logprobs: ChatLogprobs | None = None
    finish_reason: str | None = None
    stop_reason: int | str | None = None


class ChatCompletionResponse(BaseModel):
    id: str
    object: Literal["chat.completion"]
    created: int
    model: str
    choices: list[ChatChoice]
    system_fingerprint: str | None = None
    prompt_logprobs: PromptLogprobs | None = Field(None, description="when prompt_logprobs was asked")
    usage: Usage | None = None
    metrics: RequestAnatomy | None = None


class ModelCard(BaseModel):
    id: str
    object: Literal["model"] = "model"
    created: int
    owned_by: str = "glassbox"
    max_model_len: int


class ModelList(BaseModel):
    object: Literal["list"] = "list"
    data: list[ModelCard]


class TokenizeResponse(BaseModel):
    count: int
    max_model_len: int
    tokens: list[int]
    token_strs: list[str | None] | None = None


class DetokenizeResponse(BaseModel):
    prompt: str


class HealthResponse(BaseModel):
    status: str
    num_requests_running: int
    num_requests_waiting: int
    kv_cache_free_blocks: int
    kv_cache_total_blocks: int
    kv_cache_usage: float
    weights_bytes: int | None = None  # what the model holds (the multi-model server reads them)
    kv_cache_bytes: int | None = None
    kv_cache_tokens: int | None = None


class ErrorDetail(BaseModel):
    message: str
    type: str
    param: str | None = None
    code: str | None = None


class ErrorResponse(BaseModel):
    error: ErrorDetail
