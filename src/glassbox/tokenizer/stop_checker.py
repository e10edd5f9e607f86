"""StopChecker: finds user stop strings in streamed text, across delta (token) boundaries.

Text that could still turn into a stop string is held back, so a client never sees the first half of a
stop string that is later cut off.
"""

from __future__ import annotations


class StopChecker:
    """Feed text deltas in order; get back the text safe to emit and the stop string once one matches.

    Matching rule: the stop string that is complete earliest in the text wins (on a tie, the one that
    starts earlier). Text is fed in any chunking with the same result. After a match nothing more is
    emitted; ``matched`` holds the stop string.
    """

    def __init__(self, stop: list[str], include_stop_str_in_output: bool = False) -> None:
        if any(not isinstance(s, str) or s == "" for s in stop):
            raise ValueError(f"stop must be a list of non-empty strings, got {stop!r}")
        self.stop = list(dict.fromkeys(stop))
        self.include_stop_str_in_output = include_stop_str_in_output
        self.matched: str | None = None
        self._held = ""  # invariant: the longest suffix of the text so far that is a proper prefix of a stop
        self._max_len = max((len(s) for s in self.stop), default=0)

    def _find(self, text: str) -> tuple[int, int, str] | None:
        """(start, end, stop) of the match that ends first in ``text`` (ties: earliest start)."""
        best: tuple[int, int, str] | None = None
        for s in self.stop:
            i = text.find(s)
            if i < 0:
                continue
            # The earliest occurrence of s also ends earliest, since all occurrences have the same length.
            if best is None or (i + len(s), i) < (best[1], best[0]):
                best = (i, i + len(s), s)
        return best

    def _holdback(self, text: str) -> int:
        """Length of the longest suffix of ``text`` that is a proper prefix of some stop string."""
        for k in range(min(len(text), self._max_len - 1), 0, -1):
            tail = text[-k:]
            if any(s.startswith(tail) for s in self.stop):
                return k
        return 0

    def feed(self, delta: str) -> tuple[str, str | None]:
        """Consume the next text delta; return (text to emit now, the stop string if one just matched)."""
        if self.matched is not None:
            return "", None
        if not self.stop:
            return delta, None
        text = self._held + delta  # only the held suffix can begin a match that spans into delta
        found = self._find(text)
        if found is not None:
            start, end, s = found
            self.matched = s
            self._held = ""
            return text[: end if self.include_stop_str_in_output else start], s
        keep = self._holdback(text)
        self._held = text[len(text) - keep :]
        return text[: len(text) - keep], None

    def flush(self) -> str:
        """At the end of generation (no stop matched): release the held-back text."""
        held, self._held = self._held, ""
        return held if self.matched is None else ""
