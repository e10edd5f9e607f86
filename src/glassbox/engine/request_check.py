"""The one check of a request's size against the engine: a pure function the engine and the server call."""

from __future__ import annotations


class RequestCheckError(ValueError):
    """A request the engine could never run; ``param`` names the API parameter at fault."""

    def __init__(self, message: str, param: str) -> None:
        super().__init__(message)
        self.param = param


def check_request(
    prompt_ids: list[int],
    max_tokens: int | None,
    vocab_size: int,
    max_model_len: int,
    kv_capacity_tokens: int,
    where: str = "prompt",
    param: str = "prompt",
) -> int:
    """The request's max_tokens: as given, or (None) all the room the prompt leaves.

    Raises RequestCheckError when the prompt is empty, holds ids outside the vocabulary, or prompt plus
    output cannot fit in the model length or the whole KV cache. ``where`` names the prompt in messages
    ("prompt[1]"), ``param`` the API parameter that holds it.
    """
    n = len(prompt_ids)
    if n == 0:
        raise RequestCheckError(f"{where} is empty: it must hold at least one token", param)
    bad = [t for t in prompt_ids if not 0 <= t < vocab_size]
    if bad:
        raise RequestCheckError(
            f"{where} holds token ids outside the vocabulary [0, {vocab_size}): {bad[:5]}", param
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
                f"{where} has {n} tokens, leaving no room for output within {what}", param
            )
        return limit - n
    if n + max_tokens > limit:
        raise RequestCheckError(
            f"{where} ({n} tokens) + max_tokens ({max_tokens}) = {n + max_tokens} exceeds {what}",
            "max_tokens",
        )
    return max_tokens
