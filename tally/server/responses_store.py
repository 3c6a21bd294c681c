"""The Responses API's memory: finished responses by id, for `previous_response_id` and GET /v1/responses/{id}.
In-process and bounded (`--responses-store-size` entries and STORE_MAX_CHARS of conversation text in all), the least
recently used evicted first; a restart forgets everything."""
from __future__ import annotations

from collections import OrderedDict
from dataclasses import dataclass

from tally.server.protocol import ChatMessage

STORE_MAX_CHARS = 64 * 2**20  # of conversation text held in all, whatever the entry count


@dataclass(frozen=True)
class StoredResponse:
    response: dict  # the response object as GET returns it
    conversation: list[ChatMessage]  # the turns a follow-up continues: earlier ones, this input, this output

    @property
    def chars(self) -> int:
        return sum(len(m.text()) + sum(len(str(c)) for c in m.tool_calls or ()) for m in self.conversation)


class ResponsesStore:
    def __init__(self, max_entries: int, max_chars: int = STORE_MAX_CHARS) -> None:
        self.max_entries, self.max_chars = max_entries, max_chars
        self._entries: OrderedDict[str, StoredResponse] = OrderedDict()
        self._chars = 0

    def __len__(self) -> int:
        return len(self._entries)

    def put(self, entry: StoredResponse) -> None:
        if self.max_entries <= 0 or entry.chars > self.max_chars:
            return
        self._drop(entry.response["id"])
        self._entries[entry.response["id"]] = entry
        self._chars += entry.chars
        while len(self._entries) > self.max_entries or self._chars > self.max_chars:
            self._drop(next(iter(self._entries)))

    def get(self, response_id: str) -> StoredResponse | None:
        entry = self._entries.get(response_id)
        if entry is not None:
            self._entries.move_to_end(response_id)
        return entry

    def _drop(self, response_id: str) -> None:
        old = self._entries.pop(response_id, None)
        if old is not None:
            self._chars -= old.chars
