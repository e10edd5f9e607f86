"""An embedding or rerank request checked and tokenized: the one function each door (LLM.embed, OpenAI's
/v1/embeddings, Ollama's /api/embed, /v1/rerank) calls before anything is queued.

Errors are ``InputError`` (a ValueError naming the request's parameter): the server answers them as 400s
in its dialect's shape. An input past the model's limit is refused unless ``truncate`` (then cut at its
end, special tokens kept: tokenizer/encoder_inputs.py).
"""

from __future__ import annotations

from typing import Any

import torch
import torch.nn.functional as F

from glassbox.engine.embedding_model import EmbeddingModel
from glassbox.tokenizer.encoder_inputs import TooLong, encode_pair, encode_text
from glassbox.tokenizer.request_text import TRIM_CHARS, max_text_chars, release_freed_memory

MAX_INPUTS = 2048  # inputs of one request (OpenAI's limit for /v1/embeddings)


class InputError(ValueError):
    """A request mistake; ``param`` names the field, ``code`` is OpenAI's code for it."""

    def __init__(self, message: str, param: str, code: str = "invalid_value") -> None:
        super().__init__(message)
        self.message = message
        self.param = param
        self.code = code


def _too_long(e: TooLong, where: str, param: str) -> InputError:
    return InputError(
        f"{where} has {e.tokens} tokens, more than this model's maximum of {e.limit}; shorten it or ask "
        "for truncation",
        param,
        "context_length_exceeded",
    )


def _ids(model: EmbeddingModel, ids: list[Any], where: str, param: str, truncate: bool) -> list[int]:
    if not ids:
        raise InputError(f"{where} is an empty token array", param)
    if not all(type(t) is int for t in ids):  # bools are ints to Python, not token ids
        raise InputError(f"{where} must hold integer token ids", param, "invalid_type")
    bad = [t for t in ids if not 0 <= t < model.vocab_size]
    if bad:
        raise InputError(
            f"{where} holds ids outside the vocabulary [0, {model.vocab_size}): {bad[:5]}", param
        )
    if len(ids) > model.max_tokens:
        if not truncate:
            raise _too_long(TooLong(len(ids), model.max_tokens), where, param)
        ids = ids[: model.max_tokens]
    return list(ids)


def _text(model: EmbeddingModel, text: str, where: str, param: str, truncate: bool) -> list[int]:
    if not text:
        raise InputError(f"{where} is an empty string", param)
    limit = max_text_chars(model.tokenizer, model.max_tokens)
    if limit is not None and len(text) > limit:  # more than max_tokens tokens: not read past the limit
        if not truncate:
            raise InputError(
                f"{where} has {len(text)} characters, more than the {limit} that this model's maximum of "
                f"{model.max_tokens} tokens can hold; shorten it or ask for truncation",
                param,
                "context_length_exceeded",
            )
        text = text[: 2 * limit]  # the first max_tokens tokens lie in the first half
    try:
        ids = encode_text(
            model.tokenizer, text.lower() if model.do_lower_case else text, model.max_tokens, truncate
        )
    except TooLong as e:
        raise _too_long(e, where, param) from None
    if len(text) >= TRIM_CHARS:
        release_freed_memory()
    if not ids:
        raise InputError(f"{where} has no tokens", param)
    return ids


def embedding_inputs(
    model: EmbeddingModel, inputs: Any, truncate: bool, param: str = "input"
) -> list[list[int]]:
    """OpenAI's ``input``: a string, a list of strings, a token array, or a list of token arrays -> the ids
    of each input (a token array as given: no special tokens added)."""
    if isinstance(inputs, str):
        return [_text(model, inputs, param, param, truncate)]
    if not isinstance(inputs, list):
        raise InputError(
            f"{param} must be a string, a list of strings or token arrays, got {type(inputs).__name__}",
            param,
            "invalid_type",
        )
    if not inputs:
        raise InputError(f"{param} must not be empty", param)
    if len(inputs) > MAX_INPUTS:
        raise InputError(
            f"{param} has {len(inputs)} items, more than {MAX_INPUTS}", param, "array_above_max_length"
        )
    if all(type(x) is int for x in inputs):  # one token array
        return [_ids(model, inputs, param, param, truncate)]
    out = []
    for i, item in enumerate(inputs):
        where = f"{param}[{i}]"
        if isinstance(item, str):
            out.append(_text(model, item, where, param, truncate))
        elif isinstance(item, list):
            out.append(_ids(model, item, where, param, truncate))
        else:
            raise InputError(
                f"{where} must be a string or a token array, got {type(item).__name__}", param, "invalid_type"
            )
    return out


def rerank_inputs(
    model: EmbeddingModel, query: Any, documents: Any, truncate: bool
) -> tuple[list[str], list[list[int]], list[list[int]]]:
    """(the documents' texts, ids and token types of each (query, document) pair)."""
    if not isinstance(query, str) or not query:
        raise InputError(
            "query must be a non-empty string",
            "query",
            "invalid_type" if not isinstance(query, str) else "invalid_value",
        )
    if not isinstance(documents, list) or not documents:
        raise InputError(
            "documents must be a non-empty list of strings (or {'text': ...} objects)", "documents"
        )
    if len(documents) > MAX_INPUTS:
        raise InputError(f"documents has {len(documents)} items, more than {MAX_INPUTS}", "documents")
    texts, ids, types = [], [], []
    for i, doc in enumerate(documents):
        text = doc.get("text") if isinstance(doc, dict) else doc
        if not isinstance(text, str) or not text:
            raise InputError(f"documents[{i}] must be a non-empty string or {{'text': str}}", "documents")
        try:
            pair_ids, pair_types = encode_pair(model.tokenizer, query, text, model.max_tokens, truncate)
        except TooLong as e:
            raise _too_long(e, f"the pair (query, documents[{i}])", "documents") from None
        texts.append(text)
        ids.append(pair_ids)
        types.append(pair_types)
    return texts, ids, types


def check_dimensions(model: EmbeddingModel, dimensions: Any, param: str = "dimensions") -> int | None:
    """``dimensions`` as an int the model can give (Matryoshka prefixes), or None for the full size."""
    if dimensions is None:
        return None
    if type(dimensions) is not int:
        raise InputError(f"{param} must be an integer", param, "invalid_type")
    if model.dimensions_ok(dimensions):
        return dimensions
    if model.matryoshka is None:
        sizes = f"at most {model.dimension}"
    elif model.matryoshka:
        sizes = f"one of {sorted({*model.matryoshka, model.dimension})}"
    else:
        sizes = f"{model.dimension} (this model does not say it was trained for shorter, Matryoshka, vectors)"
    raise InputError(f"{param} must be {sizes}, got {dimensions}", param)


def shorten(vectors: torch.Tensor, dimensions: int | None, normalized: bool) -> torch.Tensor:
    """(N, D) -> (N, dimensions): the first ``dimensions`` values, renormalized when the model normalizes."""
    if dimensions is None or dimensions == vectors.shape[1]:
        return vectors
    cut = vectors[:, :dimensions]
    return F.normalize(cut, dim=-1) if normalized else cut
