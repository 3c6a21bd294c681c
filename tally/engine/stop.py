"""Stop strings on detokenized text, and the hold-back that keeps a stream from sending text a
stop string later cuts off.

One Knuth–Morris–Pratt matcher per stop string reads the generated text once, character by character, and
knows at every point the longest tail of the text that is a prefix of its stop string. So a stop string
split over several tokens is found when its last character arrives, the hold-back is the longest such tail,
and the cost is memory linear in the stop strings' length (their failure tables) and time linear in the
generated text (times the number of stop strings, which the request limits bound: tally/sampling_params.py).
"""
from __future__ import annotations

from array import array


def _failure_table(s: str) -> array:
    """fail[i]: length of the longest proper prefix of s[:i + 1] that is also its suffix."""
    fail = array("i", bytes(4 * len(s)))
    k = 0
    for i in range(1, len(s)):
        while k and s[i] != s[k]:
            k = fail[k - 1]
        if s[i] == s[k]:
            k += 1
        fail[i] = k
    return fail


class StopChecker:
    """Follows one sequence's text, which only grows, and finds the stop string that ends first."""

    def __init__(self, stop: list[str], include_stop_str_in_output: bool = False) -> None:
        self.stop = list(stop)
        self.include_stop_str_in_output = include_stop_str_in_output
        self._fail = [_failure_table(s) for s in self.stop]
        self._matched = [0] * len(self.stop)  # per stop string: the text's longest tail that is its prefix
        self._read = 0  # characters of the text read so far

    def check(self, text: str, new_delta_len: int) -> tuple[str | None, int | None]:
        """(stop string, length to truncate `text` to) if a stop string ends in the last
        `new_delta_len` characters, else (None, None).

        When several match, the one that ends first wins: it is the one that would have stopped
        generation had the characters come one at a time (at the same end, the first listed)."""
        if not self.stop or new_delta_len <= 0:
            return None, None
        found = self._read_up_to(text, first_end_from=len(text) - new_delta_len)
        if found is None:
            return None, None
        end, s = found
        return s, end if self.include_stop_str_in_output else end - len(s)

    def holdback_len(self, text: str) -> int:
        """How many trailing characters of `text` could still be the start of a stop string."""
        self._read_up_to(text, first_end_from=len(text))
        return max(self._matched, default=0)

    def _read_up_to(self, text: str, first_end_from: int) -> tuple[int, str] | None:
        """Reads the unread characters; returns (end, stop string) of the first match ending after
        `first_end_from` characters. A match that ends earlier (text produced before min_tokens allowed
        stopping) is passed over."""
        found = None
        for pos in range(self._read, len(text)):
            c = text[pos]
            for j, s in enumerate(self.stop):
                k, fail = self._matched[j], self._fail[j]
                while k and s[k] != c:
                    k = fail[k - 1]
                if s[k] == c:
                    k += 1
                if k == len(s):
                    if found is None and pos + 1 > first_end_from:
                        found = (pos + 1, s)
                    k = fail[k - 1]  # keep reading: an overlapping occurrence may follow
                self._matched[j] = k
            self._read = pos + 1
            if found is not None:
                break
        return found
