"""Aggregates over request records. Latency statistics use successful requests only; failures
are counted by cause beside them. Definitions follow DESIGN.md and travel in every report."""
from __future__ import annotations

from collections import Counter
from dataclasses import dataclass

import numpy as np

from tally.bench.arrivals import Phase
from tally.bench.client import RequestRecord
from tally.errors import ConfigError
from tally.units import parse_duration_s, parse_pairs

DRAIN = "drain"
# The cause on a request that was still in flight when the run stopped early (Ctrl-C, --time-limit):
# counted apart, neither a success nor a failure.
CANCELLED = "cancelled"
PERCENTILES = (50.0, 90.0, 95.0, 99.0, 99.9)
DEFINITIONS = {
    "TTFT": "request sent by the client (its arrival at the server) -> first output token "
            "received. Includes queueing. Tokens without text (e.g. a special token) are received "
            "with the chunk that finishes the answer.",
    "TPOT": "(last token time - first token time) / (output tokens - 1). Excludes the first "
            "token; requests with one output token have none.",
    "ITL": "each gap between two consecutive streamed chunks carrying text, pooled over requests.",
    "E2E": "request sent -> last token received.",
    "Goodput": "requests per second that met every SLO given (e.g. TTFT <= 2 s and TPOT <= 100 ms).",
    "Throughput": "successful requests (and their output tokens) per second of the measured window: "
                  "from the end of warmup to the end of the last measured request.",
    "Lateness": "sent - scheduled: how far behind its own schedule the client was (open loop); "
                "a P99 over 10 ms and over 5% of the TTFT P50 is reported as a warning.",
    "Errors": "failed requests by cause (http_<status>, timeout, disconnect, ...); never part of "
              "the latency statistics.",
    "Cancelled": "requests still in flight when a run stopped early (Ctrl-C, --time-limit) and "
                 "cancelled after the grace period: neither successes nor failures.",
}


@dataclass(frozen=True)
class Slo:
    ttft_s: float | None = None
    tpot_s: float | None = None
    e2e_s: float | None = None

    @classmethod
    def parse(cls, text: str) -> Slo:
        """`'ttft=2s,tpot=100ms,e2e=10s'`."""
        pairs = parse_pairs(text, "--slo")
        unknown = sorted(set(pairs) - {"ttft", "tpot", "e2e"})
        if unknown:
            raise ConfigError(f"--slo: unknown metric(s) {', '.join(unknown)}; use ttft, tpot and/or e2e")
        return cls(**{f"{k}_s": parse_duration_s(v, f"--slo {k}") for k, v in pairs.items()})

    def met(self, record: RequestRecord) -> bool:
        checks = ((self.ttft_s, record.ttft_s), (self.tpot_s, record.tpot_s),
                  (self.e2e_s, record.e2e_s))
        return record.ok and all(limit is None or value is None or value <= limit
                                 for limit, value in checks)

    def describe(self) -> dict:
        return {k: v for k, v in vars(self).items() if v is not None}


def distribution(values: list[float] | np.ndarray) -> dict:
    """count, mean, min, max and the report percentiles (`p50` ... `p99.9`)."""
    data = np.asarray(values, dtype=np.float64)
    if data.size == 0:
        return {"count": 0}
    out = {"count": int(data.size), "mean": float(data.mean()), "min": float(data.min()),
           "max": float(data.max())}
    for q, value in zip(PERCENTILES, np.percentile(data, PERCENTILES)):
        out[f"p{q:g}"] = float(value)
    return out


def summarize(records: list[RequestRecord], start_s: float, end_s: float | None = None,
              slo: Slo | None = None) -> dict:
    """Statistics of the given (measured) records over the window [start_s, end_s]; end_s
    defaults to the end of the last request."""
    ok = [r for r in records if r.ok]
    cancelled = sum(r.error == CANCELLED for r in records)
    ends = [r.end_s for r in records if r.end_s is not None]
    end_s = max(ends, default=start_s) if end_s is None else end_s
    window_s = max(end_s - start_s, 1e-9)
    output_tokens = sum(r.output_tokens for r in ok)
    summary = {
        "window_s": window_s,
        "counts": {"requests": len(records), "ok": len(ok),
                   "failed": len(records) - len(ok) - cancelled, "cancelled": cancelled,
                   "not_finished": sum(r.end_s is None for r in records)},
        "errors": dict(Counter(r.error for r in records
                               if r.error is not None and r.error != CANCELLED).most_common()),
        "ttft_s": distribution([r.ttft_s for r in ok]),
        "tpot_s": distribution([r.tpot_s for r in ok if r.tpot_s is not None]),
        "itl_s": distribution(np.concatenate([r.itl_s for r in ok]) if ok else []),
        "e2e_s": distribution([r.e2e_s for r in ok]),
        "lateness_s": distribution([r.lateness_s for r in records if r.sent_s is not None]),
        "prompt_tokens": distribution([r.prompt_tokens for r in ok]),
        "output_tokens": distribution([r.output_tokens for r in ok]),
        "throughput": {"requests_per_s": len(ok) / window_s,
                       "output_tokens_per_s": output_tokens / window_s,
                       "prompt_tokens_per_s": sum(r.prompt_tokens for r in ok) / window_s},
    }
    if slo is not None and slo.describe():
        met = sum(slo.met(r) for r in records)
        finished = len(records) - cancelled  # a cancelled request's outcome is unknown
        summary["goodput"] = {"slo": slo.describe(), "met": met,
                              "requests_per_s": met / window_s,
                              "fraction": met / finished if finished else 0.0}
    return summary


def phase_breakdown(records: list[RequestRecord], phases: list[Phase],
                    slo: Slo | None = None) -> list[dict]:
    """Per phase: latency, errors and goodput of the requests *scheduled* in it; throughput of
    what *finished* within its time span (a burst's tail shows in the phase after it). A `drain`
    row covers what finished after the schedule ended."""
    out = []
    last_end_s = max((r.end_s for r in records if r.end_s is not None), default=0.0)
    if phases and last_end_s > phases[-1].end_s:
        phases = [*phases, Phase(DRAIN, None, phases[-1].end_s, last_end_s + 1e-9)]
    for phase in phases:
        mine = [r for r in records if r.phase == phase.name]
        summary = summarize(mine, phase.start_s, phase.end_s, slo)
        finished = [r for r in records if r.ok and phase.start_s <= r.end_s < phase.end_s]
        span_s = max(phase.end_s - phase.start_s, 1e-9)
        summary["throughput"] = {
            "requests_per_s": len(finished) / span_s,
            "output_tokens_per_s": sum(r.output_tokens for r in finished) / span_s}
        summary.update(name=phase.name, start_s=phase.start_s, end_s=phase.end_s,
                       planned_rate_per_s=phase.rate_per_s,
                       offered_rate_per_s=len(mine) / span_s)
        out.append(summary)
    return out
