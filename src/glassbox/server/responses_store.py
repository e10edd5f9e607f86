"""The Responses API's stored responses (``store: true``, the default): what ``previous_response_id``
continues and ``GET`` / ``DELETE /v1/responses/{id}`` read, in memory and bounded.

Each entry holds the response object and the messages its request added to the conversation (its input
and its reply), plus the id of the response it continued: a conversation is rebuilt by walking that chain,
so a long conversation costs memory once, not once per turn. Past ``max_entries`` responses or
``max_chars`` characters of stored JSON, the least recently used entries are dropped (a conversation that
reaches a dropped one answers 400 naming it). Event-loop thread only.
"""

from __future__ import annotations

import json
from collections import OrderedDict
from dataclasses import dataclass
from typing import Any

MAX_ENTRIES = 1024
MAX_CHARS = 64 * 1024 * 1024  # ~64 MiB of ASCII JSON


@dataclass
class StoredResponse:
    response: dict[str, Any]
    messages: list[dict[str, Any]]
    previous_id: str | None
    chars: int = 0


class ResponseStore:
    def __init__(self, max_entries: int = MAX_ENTRIES, max_chars: int = MAX_CHARS) -> None:
        self.max_entries = max_entries
        self.max_chars = max_chars
        self.entries: OrderedDict[str, StoredResponse] = OrderedDict()
        self.chars = 0

    def put(self, rid: str, entry: StoredResponse) -> None:
        entry.chars = len(json.dumps(entry.response)) + len(json.dumps(entry.messages))
        self.delete(rid)
        self.entries[rid] = entry
        self.chars += entry.chars
        while self.entries and (len(self.entries) > self.max_entries or self.chars > self.max_chars):
            _, dropped = self.entries.popitem(last=False)
            self.chars -= dropped.chars

    def get(self, rid: str) -> StoredResponse | None:
        entry = self.entries.get(rid)
        if entry is not None:
            self.entries.move_to_end(rid)
        return entry

    def delete(self, rid: str) -> bool:
        entry = self.entries.pop(rid, None)
        if entry is None:
            return False
        self.chars -= entry.chars
        return True

    def conversation(self, rid: str) -> list[dict[str, Any]]:
        """The messages of ``rid``'s conversation, oldest first; KeyError naming the first missing id."""
        chain: list[StoredResponse] = []
        at: str | None = rid
        while at is not None:
            entry = self.get(at)
            if entry is None:
                raise KeyError(at)
            chain.append(entry)
            at = entry.previous_id
        return [m for entry in reversed(chain) for m in entry.messages]
