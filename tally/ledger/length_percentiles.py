"""Request lengths from a real workload (any trace or `tally bench` result tally/traces.py reads, or a shipped
trace's name: `conv`, `code`), summarised as percentiles of prompt, output and total length.

Percentiles use the nearest-rank rule: P99 is a length that at least 99% of requests fit in, and it is
always a length that really occurred, so a max_model_len set to it serves exactly that share.
"""
from __future__ import annotations

import bisect
import math
from dataclasses import dataclass, field
from pathlib import Path

from tally.errors import ConfigError
from tally.traces import load_trace

PERCENTILES = (50.0, 90.0, 99.0, 99.5, 100.0)


@dataclass(frozen=True)
class LengthStats:
    num_requests: int
    prompt_tokens: dict[str, int]  # "p50", "p90", "p99", "p99.5", "max" -> tokens
    output_tokens: dict[str, int]
    total_tokens: dict[str, int]
    mean_total_tokens: float
    totals_sorted: tuple[int, ...] = field(repr=False)  # every request's prompt + output, ascending
    requests: tuple[tuple[int, int], ...] = field(repr=False)  # (prompt, output) per request

    def total_at(self, percentile: float) -> int:
        return nearest_rank(self.totals_sorted, percentile)

    @property
    def mean_decode_context_tokens(self) -> float:
        """The context an average decode step attends to: the prompt plus half the output."""
        return sum(p + o / 2 for p, o in self.requests) / self.num_requests

    def share_longer_than(self, num_tokens: int) -> float:
        return (self.num_requests - bisect.bisect_right(self.totals_sorted, num_tokens)) / self.num_requests

    def slot_share_longer_than(self, num_tokens: int) -> float:
        """Share of request-slots in flight taken by requests longer than `num_tokens`: a request holds
        its slot for as long as it decodes, so each weighs by its output length (Little's law)."""
        longer = sum(max(o, 1) for p, o in self.requests if p + o > num_tokens)
        return longer / sum(max(o, 1) for _, o in self.requests)


def nearest_rank(sorted_values: tuple[int, ...] | list[int], percentile: float) -> int:
    rank = max(math.ceil(percentile / 100 * len(sorted_values)), 1)
    return sorted_values[rank - 1]


def _label(percentile: float) -> str:
    return "max" if percentile == 100 else f"p{percentile:g}"


def summarize(pairs: list[tuple[int, int]]) -> LengthStats:
    if not pairs:
        raise ConfigError("the lengths file holds no requests with both a prompt and an output length")
    prompts = sorted(p for p, _ in pairs)
    outputs = sorted(o for _, o in pairs)
    totals = sorted(p + o for p, o in pairs)

    def table(values: list[int]) -> dict[str, int]:
        return {_label(q): nearest_rank(values, q) for q in PERCENTILES}

    return LengthStats(len(pairs), table(prompts), table(outputs), table(totals),
                       sum(totals) / len(totals), tuple(totals), tuple(pairs))


def load_lengths(path: str | Path) -> list[tuple[int, int]]:
    """(prompt tokens, output tokens) per request of a trace or `tally bench` result (tally/traces.py)."""
    return load_trace(path).pairs()
