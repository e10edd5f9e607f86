"""Inputs of encoders: a text cut to a token limit with its special tokens kept, and text pairs with their
token types (a cross-encoder's [CLS] query [SEP] document [SEP]), as transformers' fast tokenizer makes them
with ``truncation=True, max_length=N`` (the ``tokenizers`` library's longest-first rule for pairs)."""

from __future__ import annotations

from glassbox.tokenizer.hf_tokenizer import Tokenizer


class TooLong(ValueError):
    """An input past the limit where truncation is off (the caller answers it as a 400)."""

    def __init__(self, tokens: int, limit: int) -> None:
        super().__init__(f"the input has {tokens} tokens, more than this model's {limit}")
        self.tokens = tokens
        self.limit = limit


def encode_text(tok: Tokenizer, text: str, limit: int, truncate: bool) -> list[int]:
    """``text``'s ids with the model's special tokens; past ``limit`` ids, cut at the end of the text
    (the specials kept) when ``truncate``, else TooLong."""
    ids = tok.encode(text)
    if len(ids) <= limit:
        return ids
    if not truncate:
        raise TooLong(len(ids), limit)
    body = tok.encode(text, add_special_tokens=False)
    specials = len(ids) - len(body)
    if specials >= limit:
        raise ValueError(f"a limit of {limit} tokens leaves no room inside the {specials} special tokens")
    # ids = prefix + body + suffix: find where the body starts (after at most ``specials`` tokens)
    start = next(p for p in range(specials + 1) if ids[p : p + len(body)] == body)
    return ids[:start] + body[: limit - specials] + ids[start + len(body) :]


def encode_pair(
    tok: Tokenizer, first: str, second: str, limit: int, truncate: bool
) -> tuple[list[int], list[int]]:
    """(ids, token types) of a text pair through the tokenizer's pair template; past ``limit`` ids the longer
    text is cut first (both to half when both are long), as ``tokenizers``' LongestFirst, or TooLong."""
    backend = tok.backend
    whole = backend.encode(first, second)
    if len(whole.ids) <= limit:
        return list(whole.ids), list(whole.type_ids)
    if not truncate:
        raise TooLong(len(whole.ids), limit)
    budget = limit - backend.num_special_tokens_to_add(True)
    if budget < 2:
        raise ValueError(f"a limit of {limit} tokens leaves no room for a pair")
    a = backend.encode(first, add_special_tokens=False)
    b = backend.encode(second, add_special_tokens=False)
    short, long_ = sorted((len(a.ids), len(b.ids)))
    keep_short, keep_long = short, max(short, budget - short)
    if keep_short + keep_long > budget:  # both longer than half the budget: each gets half
        keep_short, keep_long = budget // 2, budget // 2 + budget % 2
    n_a, n_b = (keep_short, keep_long) if len(a.ids) <= len(b.ids) else (keep_long, keep_short)
    a.truncate(n_a)
    b.truncate(n_b)
    merged = backend.post_process(a, b, add_special_tokens=True)
    return list(merged.ids), list(merged.type_ids)
