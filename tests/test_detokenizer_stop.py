from __future__ import annotations

import random
import tracemalloc

import transformers

from tally.engine.detokenizer import IncrementalDetokenizer
from tally.engine.stop import StopChecker


# The engine checks stop strings through Sequence; this wrapper feeds StopChecker one delta at a time.
class StopStringStream:
    """Accumulates text deltas of one output; `push` returns only text that is final."""

    def __init__(self, checker: StopChecker) -> None:
        self.checker = checker
        self.text = ""
        self.stop_str: str | None = None  # set when a stop string ended the output
        self._sent_len = 0

    def push(self, delta: str) -> str:
        """Add a delta; return the text now safe to send. After a stop string, `stop_str` is set,
        the text is truncated and everything left is returned."""
        self.text += delta
        stop, truncate_to = self.checker.check(self.text, len(delta))
        if stop is not None:
            self.text, self.stop_str = self.text[:truncate_to], stop
            return self.flush()
        safe_len = len(self.text) - self.checker.holdback_len(self.text)
        out = self.text[self._sent_len : safe_len]
        self._sent_len = max(self._sent_len, safe_len)
        return out

    def flush(self) -> str:
        """The output ended (stop, length, EOS): release the held-back tail."""
        out = self.text[self._sent_len :]
        self._sent_len = len(self.text)
        return out


def run_stream(stop: list[str], deltas: list[str], include: bool = False):
    """Push deltas until a stop string ends the output; returns (stream, pieces sent)."""
    s = StopStringStream(StopChecker(stop, include))
    sent = []
    for d in deltas:
        sent.append(s.push(d))
        if s.stop_str is not None:
            break
    else:
        sent.append(s.flush())
    return s, sent


def reference_truncation(text: str, stop: list[str], include: bool = False) -> str:
    """The text a one-character-at-a-time generator would have produced."""
    hits = [(text.find(s) + len(s), text.find(s), s) for s in stop if s in text]
    if not hits:
        return text
    end, start, _ = min(hits)
    return text[:end] if include else text[:start]


def test_stop_string_split_across_deltas_is_caught_and_cut():
    s, sent = run_stream(["###"], ["Hel", "lo #", "#", "# world"])
    assert s.stop_str == "###"
    assert s.text == "".join(sent) == "Hello "


def test_include_stop_str_in_output_keeps_the_stop_string_only():
    s, sent = run_stream(["###"], ["Hello #", "## more"], include=True)
    assert "".join(sent) == s.text == "Hello ###"


def test_the_stop_string_that_ends_first_wins():
    checker = StopChecker(["cdef", "de"])
    assert checker.check("abcdefg", 7) == ("de", 3)


def test_check_reports_only_a_match_that_ends_in_the_new_characters():
    # A checker follows one sequence's growing text.
    assert StopChecker(["###"]).check("xx### abc", 3) == (None, None)  # ended before min_tokens allowed it
    checker = StopChecker(["###"])
    assert checker.check("xx##", 1) == (None, None)
    assert checker.check("xx###", 1) == ("###", 2)


def test_holdback_is_the_longest_tail_that_starts_a_stop_string():
    tails = ("Hello #", "Hello ##", "Hello #a", "The E", "THEN", "THX")
    assert [StopChecker(["###", "END"]).holdback_len(t) for t in tails] == [1, 2, 0, 1, 2, 0]


def test_holdback_follows_a_growing_text():
    checker = StopChecker(["abac", "abd"])
    text = ""
    for ch, held in zip("ababax", [1, 2, 3, 2, 3, 0]):
        text += ch
        assert checker.holdback_len(text) == held, text


def test_a_long_stop_string_costs_memory_linear_in_its_length():
    """A set of every proper prefix of a long stop string grows with the square of its length: a 1 MiB string's
    would exhaust the server's memory."""
    stop = "ab" * 32_768  # 64K characters: gigabytes as a set of prefixes
    tracemalloc.start()
    checker = StopChecker([stop])
    text = "ab" * 40_000
    assert checker.check(text, len(text)) == (stop, 0)
    peak = tracemalloc.get_traced_memory()[1]
    tracemalloc.stop()
    assert peak < 8 * len(stop) + 2**20


def test_stream_never_sends_text_a_later_stop_string_cuts():
    rng = random.Random(0)
    for _ in range(300):
        stop = ["##a", "ab#", "b"] if rng.random() < 0.3 else ["##a", "ab#"]
        include = rng.random() < 0.5
        text = "".join(rng.choice("ab#") for _ in range(rng.randrange(1, 30)))
        deltas, i = [], 0
        while i < len(text):
            n = rng.randrange(1, 5)
            deltas.append(text[i : i + n])
            i += n
        s, sent = run_stream(stop, deltas, include)
        expected = reference_truncation(text, stop, include)
        streamed = ""
        for piece in sent:
            streamed += piece
            assert expected.startswith(streamed), (text, stop, sent)
        assert streamed == s.text == expected


def test_multi_token_stop_string_on_real_detokenized_text(tiny_llama):
    tok = transformers.AutoTokenizer.from_pretrained(tiny_llama)
    text = "Unicode: café naïve 日本語 中文 emoji 🙂🚀"
    ids = tok.encode(text)
    detok = IncrementalDetokenizer(tok, [])
    stream = StopStringStream(StopChecker(["日本", "🚀"]))
    sent = []
    for i in ids:
        sent.append(stream.push(detok.push([i])))
        if stream.stop_str:
            break
    assert stream.stop_str == "日本"
    assert "".join(sent) == "Unicode: café naïve "
