"""Parse and print sizes, rates and FLOP/s with their units stated, never guessed.

Convention (the whole ledger uses it): `GB`, `TB` are decimal (10^9, 10^12 bytes) and `GiB`, `MiB`
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


def canonical_name(name: str, aliases: dict[str, str], known: dict[str, int], what: str) -> str:
    """A dtype name as the ledger spells it ('bf16' -> 'bfloat16'); unknown names say what is known."""
    key = name.strip().lower()
    key = aliases.get(key, key)
    if key not in known:
        raise ConfigError(f"unknown {what} {name!r}; choose one of {', '.join(known)}")
    return key
