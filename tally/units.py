"""Parse and print the units people write on command lines and read in reports: sizes, bandwidths, FLOP/s,
durations, request rates, fractions — stated, never guessed. One module for every CLI (plan, bench, serve, eval).

Convention for sizes: `GB`, `TB` are decimal (10^9, 10^12 bytes) and `GiB`, `MiB`
binary (2^30, 2^20). Bandwidth and FLOP/s are always decimal. Device memory is quoted by vendors
in binary units ("80 GB" of HBM is 80 GiB), so device presets hold binary capacities.
"""
from __future__ import annotations

import re

from tally.errors import ConfigError

_PREFIX = {"": 1, "K": 10**3, "M": 10**6, "G": 10**9, "T": 10**12, "P": 10**15}
_BINARY = {"Ki": 2**10, "Mi": 2**20, "Gi": 2**30, "Ti": 2**40}
_NUMBER = r"\s*([0-9]*\.?[0-9]+(?:[eE][-+]?[0-9]+)?)\s*"

GiB = 2**30
MiB = 2**20
KiB = 2**10


def parse_bytes(text: str, *, what: str = "size") -> int:
    """'80GB' -> 80e9, '80GiB' -> 80*2^30, '512MiB', '1.5TB', '1024' (bytes)."""
    match = re.fullmatch(_NUMBER + r"([KMGTP]i?)?B?\s*", text.strip(), flags=re.IGNORECASE)
    if not match:
        raise ConfigError(f"cannot read {what} {text!r}; write it like 80GB (10^9) or 80GiB (2^30)")
    number, prefix = float(match.group(1)), (match.group(2) or "")
    prefix = prefix[0].upper() + prefix[1:].lower() if prefix else ""
    scale = _BINARY[prefix] if prefix.endswith("i") else _PREFIX[prefix]
    return int(round(number * scale))


def _parse_rate(text: str, *, what: str, unit_pattern: str, example: str) -> float:
    match = re.fullmatch(_NUMBER + r"([KMGTP])?(?:" + unit_pattern + r")?\s*", text.strip(), flags=re.IGNORECASE)
    if not match:
        raise ConfigError(f"cannot read {what} {text!r}; write it like {example}")
    return float(match.group(1)) * _PREFIX[(match.group(2) or "").upper()]


def parse_bandwidth(text: str) -> float:
    """Bytes per second: '3.35TB/s', '900GB/s', '2T'."""
    return _parse_rate(text, what="bandwidth", unit_pattern=r"B/?s|B", example="3.35TB/s")


def parse_flops(text: str) -> float:
    """FLOP per second: '989T', '989TFLOPS', '312 TFLOP/s'."""
    return _parse_rate(text, what="FLOP/s", unit_pattern=r"FLOPS|FLOP/s", example="989T or 989TFLOPS")


def fmt_gib(num_bytes: float) -> str:
    return f"{num_bytes / GiB:,.2f} GiB"


def fmt_gb(num_bytes: float) -> str:
    return f"{num_bytes / 1e9:,.2f} GB"


def fmt_small_bytes(num_bytes: float) -> str:
    """Per-token and per-block sizes read best in KiB / MiB."""
    for unit, scale in (("GiB", GiB), ("MiB", MiB), ("KiB", KiB)):
        if num_bytes >= scale:
            return f"{num_bytes / scale:,.2f} {unit} ({int(num_bytes):,} B)"
    return f"{int(num_bytes):,} B"


def fmt_rate(value: float, unit: str) -> str:
    for prefix, scale in (("P", 1e15), ("T", 1e12), ("G", 1e9), ("M", 1e6)):
        if value >= scale:
            return f"{value / scale:,.2f} {prefix}{unit}"
    return f"{value:,.0f} {unit}"


def fmt_count(value: float) -> str:
    for suffix, scale in (("B", 1e9), ("M", 1e6), ("K", 1e3)):
        if value >= scale:
            return f"{value / scale:,.2f}{suffix}"
    return f"{value:,.0f}"


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
