"""The n-gram (prompt lookup) proposer: draft the tokens that followed an earlier occurrence of the
sequence's last n tokens (torch-free; the scheduler asks it once per decoding sequence and step).

The rule is vLLM's: the longest n in [prompt_lookup_min, prompt_lookup_max] whose suffix occurs earlier in
prompt + output, its earliest occurrence, and up to k tokens after it (fewer where the sequence ends).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from glassbox.engine.sequence import Sequence


def find_ngram_drafts(tokens: list[int], lo: int, hi: int, k: int) -> list[int]:
    """Up to ``k`` tokens that followed the earliest earlier occurrence of the longest suffix of
    ``tokens`` of length ``lo``..``hi``; [] when no suffix that long occurs before."""
    total = len(tokens)
    if k <= 0 or total < lo + 1:
        return []
    for n in range(min(hi, total - 1), lo - 1, -1):
        suffix = tokens[total - n :]
        first = suffix[0]
        i = 0
        last_start = total - n - 1  # an occurrence must start before the suffix itself
        while True:
            try:
                i = tokens.index(first, i, last_start + 1)
            except ValueError:
                break
            if tokens[i : i + n] == suffix:
                start = i + n
                return tokens[start : min(start + k, total)]
            i += 1
    return []


class NgramProposer:
    """Prompt-lookup drafts of up to ``k`` tokens for a sequence, within ``max_model_len`` positions."""

    def __init__(self, k: int, lookup_min: int, lookup_max: int, max_model_len: int) -> None:
        self.k = k
        self.lookup_min = lookup_min
        self.lookup_max = lookup_max
        self.max_model_len = max_model_len

    def propose(self, seq: Sequence, max_drafts: int) -> list[int]:
        """Drafts for ``seq``'s next positions: at most ``max_drafts`` (the scheduler's limit from the token
        budget and max_tokens), and no position at or past ``max_model_len``."""
        limit = min(self.k, max_drafts, self.max_model_len - len(seq))
        if limit <= 0:
            return []
        return find_ngram_drafts(seq.token_ids, self.lookup_min, self.lookup_max, limit)
