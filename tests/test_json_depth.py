"""JSON text's nesting depth, counted without parsing it, is the parsed value's: brackets inside strings are left out
however the strings hide their quotes (escaped quotes, runs of backslashes before a closing quote, \\u escapes, raw
multi-byte characters), on random documents and at the edges of the text."""
from __future__ import annotations

import json
import random

from tally.json_text import json_depth

PIECES = ["[", "]", "{", "}", '"', "\\", "\\\\", '\\"', "é", "🙂", "\u2028", " ", "a"]


def _depth(value: object) -> int:
    if isinstance(value, dict):
        return 1 + max(map(_depth, value.values()), default=0)
    if isinstance(value, list):
        return 1 + max(map(_depth, value), default=0)
    return 0


def _text(rng: random.Random) -> str:
    return "".join(rng.choice(PIECES) for _ in range(rng.randrange(6)))


def _value(rng: random.Random, level: int = 0) -> object:
    r = rng.random()
    if level > 6 or r < 0.3:
        return _text(rng)
    if r < 0.4:
        return rng.randrange(10)
    if r < 0.7:
        return [_value(rng, level + 1) for _ in range(rng.randrange(4))]
    return {_text(rng): _value(rng, level + 1) for _ in range(rng.randrange(4))}


def test_the_depth_counted_without_parsing_is_the_parsed_values():
    rng = random.Random(0)
    for _ in range(2000):
        value = _value(rng)
        for text in (json.dumps(value), json.dumps(value, ensure_ascii=False)):
            assert json_depth(text) == _depth(value), text
            assert json_depth(text.encode()) == _depth(value), text


def test_quotes_and_backslashes_at_the_edges_of_the_text():
    assert json_depth('"[["') == 0 and json_depth('"\\\\"[[]]') == 2 and json_depth('"\\"[["') == 0
    assert json_depth("") == 0 and json_depth("\\") == 0 and json_depth('[["\\\\\\"]"]]') == 2
