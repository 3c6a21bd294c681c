"""Stop strings on detokenized text, and the hold-back that keeps a stream from sending text a
stop string later cuts off.

A stop string can arrive split over several tokens, so each check looks at the new delta plus the
max_stop_len - 1 characters before it. A stream holds back the longest tail of the text that is a
proper prefix of some stop string, and releases it once the next characters rule the match out."""
from __future__ import annotations


class StopChecker:
    def __init__(self, stop: list[str], include_stop_str_in_output: bool = False) -> None:
        self.stop = list(stop)
        self.include_stop_str_in_output = include_stop_str_in_output
        self.max_stop_len = max(map(len, self.stop), default=0)
        self._proper_prefixes = {s[:i] for s in self.stop for i in range(1, len(s))}

    def check(self, text: str, new_delta_len: int) -> tuple[str | None, int | None]:
        """(stop string, length to truncate `text` to) if a stop string ends in the last
        `new_delta_len` characters, else (None, None). Earlier text was checked on earlier calls.

        When several match, the one that ends first wins: it is the one that would have stopped
        generation had the characters come one at a time."""
        if not self.stop or new_delta_len <= 0:
            return None, None
        start = max(0, len(text) - new_delta_len - self.max_stop_len + 1)
        found: tuple[int, int, str] | None = None
        for s in self.stop:
            i = text.find(s, start)
            if i >= 0 and (found is None or i + len(s) < found[0] + len(found[2])):
                found = (i, len(s), s)
        if found is None:
            return None, None
        i, length, s = found
        return s, i + length if self.include_stop_str_in_output else i

    def holdback_len(self, text: str) -> int:
        """How many trailing characters of `text` could still be the start of a stop string."""
        for k in range(min(self.max_stop_len - 1, len(text)), 0, -1):
            if text[-k:] in self._proper_prefixes:
                return k
        return 0
