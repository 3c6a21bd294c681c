"""Programmatic checks of task answers: each returns a score in [0, 1] for one answer.

Checks are strict about the thing the prompt asked for (fields, digits, format) and lenient about what
a chat model wraps around it (code fences around JSON, a sentence around a number).
"""
from __future__ import annotations

import json
import re
from typing import Any

_NUMBER = re.compile(r"\d[\d,]*")
_BULLET = re.compile(r"^\s*([-*•]|\d+[.)])\s+\S")


def parse_json_object(text: str) -> dict[str, Any] | None:
    """The first {...} span of the answer parsed as a JSON object, or None."""
    start, end = text.find("{"), text.rfind("}")
    if start < 0 or end <= start:
        return None
    try:
        obj = json.loads(text[start:end + 1])
    except json.JSONDecodeError:
        return None
    return obj if isinstance(obj, dict) else None


def same_value(got: Any, want: Any) -> bool:
    """Numbers compare as numbers ("1,200" is 1200), text ignoring case and surrounding spaces, anything else
    exactly."""
    if isinstance(want, (dict, list, bool)) or want is None:
        return got == want
    if isinstance(want, (int, float)):
        try:
            return float(str(got).replace(",", "")) == float(want)
        except ValueError:
            return False
    return str(got).strip().casefold() == str(want).strip().casefold()


def json_fields(text: str, fields: dict[str, Any]) -> float:
    """Share of the expected fields present with the right value; 0 when the answer holds no JSON object."""
    obj = parse_json_object(text)
    if obj is None:
        return 0.0
    return sum(k in obj and same_value(obj[k], v) for k, v in fields.items()) / len(fields)


def number(text: str, expected: str) -> float:
    """1 when the expected number appears in the answer as a whole number (thousands separators ignored)."""
    return float(any(m.replace(",", "") == expected for m in _NUMBER.findall(text)))


def _words(text: str) -> list[str]:
    return [w for w in text.split() if any(c.isalnum() for c in w)]


def word_count(text: str, n: int) -> float:
    return float(len(_words(text)) == n)


def uppercase(text: str) -> float:
    letters = [c for c in text if c.isalpha()]
    return float(bool(letters) and all(not c.islower() for c in letters))


def lowercase(text: str) -> float:
    letters = [c for c in text if c.isalpha()]
    return float(bool(letters) and all(not c.isupper() for c in letters))


def bullets(text: str, n: int) -> float:
    """Exactly n non-empty lines, every one a bullet."""
    lines = [ln for ln in text.strip().splitlines() if ln.strip()]
    return float(len(lines) == n and all(_BULLET.match(ln) for ln in lines))


def starts_with(text: str, word: str) -> float:
    return float(text.lstrip().startswith(word))


def ends_with(text: str, word: str) -> float:
    return float(text.rstrip().rstrip(".!").endswith(word))


CHECKS = {
    "json_fields": lambda text, c: json_fields(text, c["fields"]),
    "number": lambda text, c: number(text, c["expected"]),
    "word_count": lambda text, c: word_count(text, c["n"]),
    "bullets": lambda text, c: bullets(text, c["n"]),
    "starts_with": lambda text, c: starts_with(text, c["text"]),
    "ends_with": lambda text, c: ends_with(text, c["text"]),
    "uppercase": lambda text, c: uppercase(text),
    "lowercase": lambda text, c: lowercase(text),
}


def score(text: str, check: dict[str, Any]) -> float:
    if check["type"] not in CHECKS:
        raise ValueError(f"unknown check type {check['type']!r} in a task suite; known: {', '.join(sorted(CHECKS))}")
    return CHECKS[check["type"]](text, check)


def token_agreement(baseline: list[int], candidate: list[int]) -> tuple[float, int | None]:
    """(share of positions that agree before the first divergence, that position or None when identical).
    The share is over the longer of the two outputs, so stopping early counts as disagreeing."""
    longest = max(len(baseline), len(candidate))
    if baseline == candidate:
        return 1.0, None
    first = next((i for i, (a, b) in enumerate(zip(baseline, candidate)) if a != b), min(len(baseline),
                                                                                        len(candidate)))
    return first / longest, first
