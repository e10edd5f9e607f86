"""The one check of a request's size against the engine: a pure function the engine and the server call."""

from __future__ import annotations

from glassbox.sampling_params import SamplingParams

CONTEXT_LENGTH_EXCEEDED = "context_length_exceeded"  # OpenAI's code for a request longer than the model's


class RequestCheckError(ValueError):
    """A request the engine could never run; ``param`` names the API parameter at fault, ``code`` says why
    in OpenAI's words ("context_length_exceeded", else "invalid_value")."""

    def __init__(self, message: str, param: str, code: str = "invalid_value") -> None:
        super().__init__(message)
        self.param = param
        self.code = code


def check_request(
    prompt_ids: list[int],
    max_tokens: int | None,
    vocab_size: int,
    max_model_len: int,
    kv_capacity_tokens: int,
    where: str = "prompt",
    param: str = "prompt",
    params: SamplingParams | None = None,
) -> int:
    """The request's max_tokens: as given, or (None) all the room the prompt leaves.

    Raises RequestCheckError when the prompt is empty, holds ids outside the vocabulary, or prompt plus
    output cannot fit in the model length or the whole KV cache; or when ``params`` name token ids outside
    the vocabulary (stop_token_ids, logit_bias). ``where`` names the prompt in messages ("prompt[1]"),
    ``param`` the API parameter that holds it.
    """
    n = len(prompt_ids)
    if n == 0:
        raise RequestCheckError(f"{where} is empty: it must hold at least one token", param)
    bad = [t for t in prompt_ids if not 0 <= t < vocab_size]
    if bad:
        raise RequestCheckError(
            f"{where} holds token ids outside the vocabulary [0, {vocab_size}): {bad[:5]}", param
        )
    if params is not None:
        for name, ids in (("stop_token_ids", params.stop_token_ids), ("logit_bias", params.logit_bias or {})):
            outside = sorted(t for t in ids if not 0 <= t < vocab_size)
            if outside:
                raise RequestCheckError(
                    f"{name} holds token ids outside the vocabulary [0, {vocab_size}): {outside[:5]}", name
                )
    limit = min(max_model_len, kv_capacity_tokens)
    what = (
        f"the maximum model length of {max_model_len} tokens"
        if limit == max_model_len
        else f"the KV cache's {limit} tokens"
    )
    if max_tokens is None:
        if n >= limit:
            raise RequestCheckError(
                f"{where} has {n} tokens, leaving no room for output within {what}",
                param,
                CONTEXT_LENGTH_EXCEEDED,
            )
        return limit - n
    if n + max_tokens > limit:
        raise RequestCheckError(
            f"{where} ({n} tokens) + max_tokens ({max_tokens}) = {n + max_tokens} exceeds {what}",
            "max_tokens" if n < limit else param,
            CONTEXT_LENGTH_EXCEEDED,
        )
    return max_tokens
