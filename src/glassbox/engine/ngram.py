"""The n-gram (prompt lookup) proposer: draft the tokens that followed an earlier occurrence of the
sequence's last n tokens (torch-free; the scheduler asks it once per decoding sequence and step).

The rule is vLLM's: the longest n in [prompt_lookup_min, prompt_lookup_max] whose suffix occurs earlier in
prompt + output, its earliest occurrence, and up to k tokens after it (fewer where the sequence ends).
``find_ngram_drafts`` states it on a list; the proposer answers the same from an index of each sequence's
token pairs that grows with it (about 2 us a step at 8K tokens, where one scan of the list takes 0.24 ms).
"""

from __future__ import annotations

import weakref
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from glassbox.engine.sequence import Sequence


def find_ngram_drafts(tokens: list[int], lo: int, hi: int, k: int) -> list[int]:
    """Up to ``k`` tokens that followed the earliest earlier occurrence of the longest suffix of
    ``tokens`` of length ``lo``..``hi``; [] when no suffix that long occurs before.

    One pass over the earlier occurrences of the last token (``list.index``, in C), each measured backwards
    against the suffix: the first to reach ``hi`` ends the search (none can be longer, none earlier)."""
    total = len(tokens)
    if k <= 0 or total < lo + 1:
        return []
    last = total - 1
    hi = min(hi, last)
    token = tokens[last]
    best, best_end, i = 0, -1, 0
    while True:
        try:
            i = tokens.index(token, i, last)  # an occurrence ending before the suffix does
        except ValueError:
            break
        m = 1
        while m < hi and m <= i and tokens[i - m] == tokens[last - m]:
            m += 1
        if m > best:
            best, best_end = m, i
            if m == hi:
                break
        i += 1
    if best < lo:
        return []
    return tokens[best_end + 1 : min(best_end + 1 + k, total)]


class _PairIndex:
    """Where each token pair and each token first occur in one sequence, brought up to date as it grows:
    the proposer's lookups then cost the pair's earlier occurrences, not a scan of the sequence."""

    __slots__ = ("first", "pairs", "size")

    def __init__(self) -> None:
        self.size = 0
        self.pairs: dict[tuple[int, int], list[int]] = {}  # (tokens[i - 1], tokens[i]) -> every such i
        self.first: dict[int, int] = {}  # token -> its first position

    def extend(self, tokens: list[int]) -> None:
        for i in range(self.size, len(tokens)):
            t = tokens[i]
            self.first.setdefault(t, i)
            if i:
                self.pairs.setdefault((tokens[i - 1], t), []).append(i)
        self.size = len(tokens)

    def drafts(self, tokens: list[int], lo: int, hi: int, k: int) -> list[int]:
        """``find_ngram_drafts(tokens, lo, hi, k)``, from the index (which covers ``tokens``)."""
        total = len(tokens)
        if k <= 0 or total < lo + 1:
            return []
        last = total - 1
        hi = min(hi, last)
        best, best_end = 0, -1
        if hi >= 2:  # a match of 2 or more ends at an earlier occurrence of the last pair
            for i in self.pairs.get((tokens[last - 1], tokens[last]), ()):
                if i >= last:
                    break
                m = 2
                while m < hi and m <= i and tokens[i - m] == tokens[last - m]:
                    m += 1
                if m > best:
                    best, best_end = m, i
                    if m == hi:
                        break
        if best == 0:  # else only the last token matches: its first occurrence
            i = self.first.get(tokens[last], last)
            if i < last:
                best, best_end = 1, i
        if best < lo:
            return []
        return tokens[best_end + 1 : min(best_end + 1 + k, total)]


class NgramProposer:
    """Prompt-lookup drafts of up to ``k`` tokens for a sequence, within ``max_model_len`` positions."""

    def __init__(self, k: int, lookup_min: int, lookup_max: int, max_model_len: int) -> None:
        self.k = k
        self.lookup_min = lookup_min
        self.lookup_max = lookup_max
        self.max_model_len = max_model_len
        self._index: weakref.WeakKeyDictionary[Sequence, _PairIndex] = weakref.WeakKeyDictionary()

    def propose(self, seq: Sequence, max_drafts: int) -> list[int]:
        """Drafts for ``seq``'s next positions: at most ``max_drafts`` (the scheduler's limit from the token
        budget and max_tokens), and no position at or past ``max_model_len``."""
        limit = min(self.k, max_drafts, self.max_model_len - len(seq))
        if limit <= 0:
            return []
        index = self._index.get(seq)
        if index is None or index.size > len(seq.token_ids):  # (a sequence's tokens only grow)
            index = self._index[seq] = _PairIndex()
        index.extend(seq.token_ids)
        return index.drafts(seq.token_ids, self.lookup_min, self.lookup_max, limit)

    def propose_batch(self, asks: list[tuple[Sequence, int]]) -> list[list[int]]:
        return [self.propose(seq, max_drafts) for seq, max_drafts in asks]

    def release(self, seq: Sequence) -> None:
        self._index.pop(seq, None)
