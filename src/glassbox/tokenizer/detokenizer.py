"""IncrementalDetokenizer: streamed text deltas from generated ids, never half of a UTF-8 character.

Each step decodes only a short window of ids. ``prefix_offset:read_offset`` is the span whose text was
already emitted at the previous step (it is re-decoded only as context, so that decoders which look at
neighbouring tokens, e.g. leading-space rules, produce the same text as a full decode); ``read_offset:``
are the ids not yet emitted. The text of the unemitted ids is the window's text minus the prefix's text.
"""

from __future__ import annotations

import time

from glassbox.tokenizer.hf_tokenizer import Tokenizer

REPLACEMENT_CHAR = "\ufffd"
# Prompt tokens kept as decoding context for the first output tokens.
PROMPT_CONTEXT_TOKENS = 6
# Held-back ids after which we stop waiting for a character to complete (longest UTF-8 char is 4 bytes,
# a token holds >= 1 byte, so a wait this long means the bytes are genuinely invalid).
MAX_PENDING_TOKENS = 16


class IncrementalDetokenizer:
    """Turns generated token ids into text deltas, one ``add`` call per engine step.

    Invariants: a delta never ends inside a multi-byte character (an incomplete one is held back until
    its last byte arrives); ``"".join(deltas) + flush()`` equals ``tokenizer.decode(output_ids,
    skip_special_tokens)`` (for decoders that strip a leading space, the first output token keeps the
    space it has in context after the prompt). ``elapsed_s`` accumulates the wall time spent decoding.
    """

    def __init__(
        self, tokenizer: Tokenizer, prompt_token_ids: list[int], skip_special_tokens: bool = True
    ) -> None:
        self.tokenizer = tokenizer
        self.skip_special_tokens = skip_special_tokens
        self.elapsed_s = 0.0
        self.output_text = ""  # everything emitted so far
        self.output_token_ids: list[int] = []
        context = list(prompt_token_ids[-PROMPT_CONTEXT_TOKENS:])
        if self._decode(context).endswith(REPLACEMENT_CHAR):
            # The prompt ends inside a character; its tail cannot give clean context.
            context = []
        self._ids: list[int] = context  # context ids + output ids not yet dropped from the front
        self._prefix_offset = 0
        self._read_offset = len(context)

    def _decode(self, ids: list[int]) -> str:
        return self.tokenizer.decode(ids, skip_special_tokens=self.skip_special_tokens)

    def _compact(self) -> None:
        # Drop ids before the window so memory stays O(window) however long the output grows.
        if self._prefix_offset > 64:
            del self._ids[: self._prefix_offset]
            self._read_offset -= self._prefix_offset
            self._prefix_offset = 0

    def _emit_until(self, end: int, prefix_text: str, text: str) -> str:
        delta = text[len(prefix_text) :]
        self._prefix_offset, self._read_offset = self._read_offset, end
        self.output_text += delta
        self._compact()
        return delta

    def add(self, new_token_ids: list[int]) -> str:
        """Append generated ids; return the text that is now complete (possibly "")."""
        start = time.perf_counter()
        try:
            self.output_token_ids.extend(new_token_ids)
            self._ids.extend(new_token_ids)
            return self._step(final=False)
        finally:
            self.elapsed_s += time.perf_counter() - start

    def flush(self) -> str:
        """Release anything held back (an incomplete or invalid byte sequence renders as U+FFFD)."""
        start = time.perf_counter()
        try:
            return self._step(final=True)
        finally:
            self.elapsed_s += time.perf_counter() - start

    def _step(self, final: bool) -> str:
        if self._read_offset == len(self._ids):
            return ""
        prefix_text = self._decode(self._ids[self._prefix_offset : self._read_offset])
        text = self._decode(self._ids[self._prefix_offset :])
        if final or (len(text) > len(prefix_text) and not text.endswith(REPLACEMENT_CHAR)):
            return self._emit_until(len(self._ids), prefix_text, text)
        if len(self._ids) - self._read_offset < MAX_PENDING_TOKENS:
            return ""
        # A long run without a complete character: emit up to the last clean token boundary, if any,
        # else everything (the bytes are junk either way).
        for end in range(len(self._ids) - 1, self._read_offset, -1):
            head = self._decode(self._ids[self._prefix_offset : end])
            if len(head) > len(prefix_text) and not head.endswith(REPLACEMENT_CHAR):
                return self._emit_until(end, prefix_text, head)
        return self._emit_until(len(self._ids), prefix_text, text)
