"""Scorers that read an answer as text: exact match, normalised match, a regular expression, a number within a
tolerance. Each is built from a suite line's parameters (checked there) and scores one answer in [0, 1]."""
from __future__ import annotations

import math
import re
import unicodedata
from dataclasses import dataclass

from tally.errors import clip
from tally.quality.scorer_params import ItemScore, Params

_NUMBER = re.compile(r"[-+]?(?:\d[\d,]*(?:\.\d*)?|\.\d+)(?:[eE][-+]?\d+)?")
_SPACE = re.compile(r"\s+")
REGEX_FLAGS = {"IGNORECASE": re.IGNORECASE, "MULTILINE": re.MULTILINE, "DOTALL": re.DOTALL}


def _result(ok: bool, answer: str, wanted: str) -> ItemScore:
    return ItemScore(1.0) if ok else ItemScore(0.0, reason=f"answer {clip(answer.strip(), 80)!r} is not {wanted}")


@dataclass(frozen=True)
class Exact:
    """The answer, stripped of surrounding whitespace, equals one of `expected`."""

    expected: tuple[str, ...]

    @classmethod
    def parse(cls, p: Params) -> Exact:
        return cls(p.texts("expected"))

    def score(self, answer: str, prompt: str | None) -> ItemScore:
        return _result(answer.strip() in self.expected, answer, f"one of {list(self.expected)}")


def normalize(text: str) -> str:
    """Unicode NFKC, case folded, punctuation and symbols dropped, runs of whitespace as one space, stripped:
    'The  Eiffel-Tower!' and 'the eiffel tower' are the same answer."""
    text = unicodedata.normalize("NFKC", text).casefold()
    text = "".join(" " if unicodedata.category(c)[0] in "PS" else c for c in text)
    return _SPACE.sub(" ", text).strip()


@dataclass(frozen=True)
class Normalized:
    """normalize(answer) equals normalize(one of `expected`), or with `contains: true` holds it as whole words."""

    expected: tuple[str, ...]
    contains: bool

    @classmethod
    def parse(cls, p: Params) -> Normalized:
        expected = p.texts("expected")
        if not all(normalize(e) for e in expected):
            p.fail("expected", "normalises to an empty string (it is only punctuation or spaces)")
        return cls(tuple(normalize(e) for e in expected), p.boolean("contains", False))

    def score(self, answer: str, prompt: str | None) -> ItemScore:
        got = normalize(answer)
        ok = any(f" {e} " in f" {got} " if self.contains else got == e for e in self.expected)
        return _result(ok, answer, f"{'holding' if self.contains else 'equal to'} one of {list(self.expected)} "
                                   "once normalised")


@dataclass(frozen=True)
class Regex:
    """`mode: search` (the default): the pattern matches somewhere in the answer; `full`: the whole stripped
    answer."""

    pattern: re.Pattern[str]
    full: bool

    @classmethod
    def parse(cls, p: Params) -> Regex:
        flags = 0
        names = p.raw.get("flags", [])
        if not isinstance(names, list) or any(n not in REGEX_FLAGS for n in names):
            p.fail("flags", f"must be a list of {', '.join(REGEX_FLAGS)}, got {names!r}")
        for name in names:
            flags |= REGEX_FLAGS[name]
        text = p.text("pattern")
        try:
            pattern = re.compile(text, flags)
        except re.error as e:
            p.fail("pattern", f"is not a valid Python regular expression: {e}")
        return cls(pattern, p.choice("mode", ("search", "full")) == "full")

    def score(self, answer: str, prompt: str | None) -> ItemScore:
        found = self.pattern.fullmatch(answer.strip()) if self.full else self.pattern.search(answer)
        return _result(found is not None, answer, f"matched by /{self.pattern.pattern}/")


@dataclass(frozen=True)
class Numeric:
    """A number in the answer (`pick`: the last, the default, the first, or any) within the tolerance of `expected`:
    |got − expected| ≤ max(abs_tol, rel_tol × |expected|). Thousands separators are ignored."""

    expected: float
    abs_tol: float
    rel_tol: float
    pick: str

    @classmethod
    def parse(cls, p: Params) -> Numeric:
        return cls(p.number("expected"), p.number("abs_tol", 0.0, minimum=0), p.number("rel_tol", 0.0, minimum=0),
                   p.choice("pick", ("last", "first", "any")))

    def close(self, got: float) -> bool:
        return abs(got - self.expected) <= max(self.abs_tol, self.rel_tol * abs(self.expected))

    def score(self, answer: str, prompt: str | None) -> ItemScore:
        numbers = [float(m.replace(",", "")) for m in _NUMBER.findall(answer) if any(c.isdigit() for c in m)]
        numbers = [n for n in numbers if math.isfinite(n)]
        if not numbers:
            return ItemScore(0.0, reason="the answer holds no number")
        chosen = numbers if self.pick == "any" else [numbers[-1] if self.pick == "last" else numbers[0]]
        if any(self.close(n) for n in chosen):
            return ItemScore(1.0)
        return ItemScore(0.0, reason=f"{chosen[0] if len(chosen) == 1 else chosen} is not within tolerance of "
                                     f"{self.expected:g}")
