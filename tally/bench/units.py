"""Parsing of the human units the CLI accepts (`10s`, `100ms`, `1h`, `5/s`, `a=1,b=2`)."""
from __future__ import annotations

import re

from tally.errors import ConfigError

_DURATION_RE = re.compile(r"^\s*([0-9]*\.?[0-9]+(?:e-?[0-9]+)?)\s*(ms|s|m|min|h)?\s*$")
_SECONDS_PER_UNIT = {None: 1.0, "s": 1.0, "ms": 1e-3, "m": 60.0, "min": 60.0, "h": 3600.0}


def parse_duration_s(text: str, what: str = "duration") -> float:
    """`'10s'`, `'100ms'`, `'2m'`, `'1h'` or a bare number of seconds → seconds."""
    match = _DURATION_RE.match(str(text))
    if not match:
        raise ConfigError(f"{what} {text!r} is not a duration; write e.g. 30s, 250ms, 5m or 1h")
    return float(match.group(1)) * _SECONDS_PER_UNIT[match.group(2)]


def parse_rate_per_s(text: str) -> float:
    """`'5/s'`, `'300/m'` or a bare number of requests per second → requests per second."""
    value, _, unit = str(text).strip().partition("/")
    per_s = {"": 1.0, "s": 1.0, "m": 1 / 60, "min": 1 / 60, "h": 1 / 3600}.get(unit.strip())
    try:
        rate = float(value) * per_s if per_s is not None else -1.0
    except ValueError:
        rate = -1.0
    if rate <= 0:
        raise ConfigError(f"rate {text!r} is not a positive rate; write e.g. 5/s or 300/m")
    return rate


def parse_pairs(text: str, what: str) -> dict[str, str]:
    """`'a=1,b=2'` → `{'a': '1', 'b': '2'}`."""
    pairs: dict[str, str] = {}
    for item in filter(None, (part.strip() for part in text.split(","))):
        key, sep, value = item.partition("=")
        if not sep or not key.strip() or not value.strip():
            raise ConfigError(f"{what}: {item!r} is not key=value (in {text!r})")
        pairs[key.strip()] = value.strip()
    return pairs


def parse_fraction(text: str, what: str) -> float:
    """`'10%'` or `'0.1'` → 0.1."""
    raw = str(text).strip()
    try:
        value = float(raw[:-1]) / 100 if raw.endswith("%") else float(raw)
    except ValueError:
        raise ConfigError(f"{what} {text!r} is not a fraction; write e.g. 0.1 or 10%") from None
    return value


def format_s(seconds: float | None) -> str:
    """Seconds in the unit a person reads fastest (µs, ms or s)."""
    if seconds is None or seconds != seconds:
        return "-"
    if abs(seconds) < 1e-3:
        return f"{seconds * 1e6:.0f}µs"
    if abs(seconds) < 1.0:
        return f"{seconds * 1e3:.1f}ms"
    return f"{seconds:.2f}s"
