"""A bench result's structured parts as a report reads them: SLOs and failure causes in words, never a Python dict
(`TTFT ≤ 2 s, TPOT ≤ 100 ms`, `3 http_503, 1 timeout`)."""
from __future__ import annotations

SLO_NAMES = {"ttft_s": "TTFT", "tpot_s": "TPOT", "e2e_s": "E2E"}


def duration_words(seconds: float) -> str:
    """2.0 -> '2 s', 0.1 -> '100 ms'."""
    return f"{seconds:g} s" if seconds >= 1 else f"{seconds * 1e3:.4g} ms"


def slo_words(slo: dict[str, float]) -> str:
    """{'ttft_s': 2.0, 'tpot_s': 0.1} -> 'TTFT ≤ 2 s, TPOT ≤ 100 ms'."""
    return ", ".join(f"{SLO_NAMES.get(key, key)} ≤ {duration_words(limit)}" for key, limit in slo.items())


def causes_words(errors: dict[str, int]) -> str:
    """{'http_503': 3, 'timeout': 1} -> '3 http_503, 1 timeout'."""
    return ", ".join(f"{count} {cause}" for cause, count in errors.items())
