"""Reading a server's Prometheus `/metrics` (Tally's `tally:` names or vLLM's `vllm:`) and a
local process's resident memory, for queue times, soak series and the report's server view."""
from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

import httpx
from prometheus_client.parser import text_string_to_metric_families
from prometheus_client.samples import Sample

PREFIXES = ("tally:", "vllm:")
# What the bench reads, by the name each server family uses for it.
GAUGES = {
    "kv_usage": ("kv_cache_usage_perc", "gpu_cache_usage_perc"),
    "fragmentation": ("kv_cache_fragmentation_perc",),
    "running": ("num_requests_running",),
    "waiting": ("num_requests_waiting",),
}
COUNTERS = {  # speculative decoding and outcomes, same names in both families
    "success": ("request_success",),
    "spec_drafts": ("spec_decode_num_drafts",),
    "spec_draft_tokens": ("spec_decode_num_draft_tokens",),
    "spec_accepted_tokens": ("spec_decode_num_accepted_tokens",),
}
HISTOGRAMS = {
    "queue_time_s": ("request_queue_time_seconds",),
    "ttft_s": ("time_to_first_token_seconds",),
    "tpot_s": ("request_time_per_output_token_seconds", "time_per_output_token_seconds"),
    "itl_s": ("inter_token_latency_seconds",),
    "e2e_s": ("e2e_request_latency_seconds",),
    "output_tokens": ("request_generation_tokens",),
}


@dataclass
class Histogram:
    buckets: dict[float, float] = field(default_factory=dict)  # upper bound -> cumulative count
    sum: float = 0.0
    count: float = 0.0

    def add_samples(self, samples: list[Sample]) -> None:
        """A histogram family's samples (several label sets add up)."""
        for s in samples:
            if s.name.endswith("_bucket"):
                le = float(s.labels["le"])
                self.buckets[le] = self.buckets.get(le, 0.0) + s.value
            elif s.name.endswith("_sum"):
                self.sum += s.value
            elif s.name.endswith("_count"):
                self.count += s.value


@dataclass
class Snapshot:
    gauges: dict[str, float] = field(default_factory=dict)  # unprefixed for tally:/vllm: names
    histograms: dict[str, Histogram] = field(default_factory=dict)
    counters: dict[str, float] = field(default_factory=dict)  # unprefixed, summed over label sets
    # unprefixed counter -> (labels, value) per label set, e.g. request_error by HTTP code
    labeled: dict[str, list[tuple[dict[str, str], float]]] = field(default_factory=dict)

    def gauge(self, key: str) -> float | None:
        """One of GAUGES' keys, or `rss_bytes` (process_resident_memory_bytes)."""
        names = GAUGES.get(key, ("process_resident_memory_bytes",) if key == "rss_bytes" else ())
        return next((self.gauges[n] for n in names if n in self.gauges), None)

    def counter(self, key: str) -> float | None:
        """One of COUNTERS' keys; None when the server does not count it."""
        return next((self.counters[n] for n in COUNTERS[key] if n in self.counters), None)

    def histogram(self, key: str) -> Histogram | None:
        return next((self.histograms[n] for n in HISTOGRAMS[key] if n in self.histograms), None)


def _unprefixed(name: str) -> str:
    return next((name[len(p):] for p in PREFIXES if name.startswith(p)), name)


def parse_metrics(text: str) -> Snapshot:
    """Gauges are averaged over label sets (e.g. one per model); histograms are summed."""
    snapshot, seen = Snapshot(), {}
    for family in text_string_to_metric_families(text):
        name = _unprefixed(family.name)
        if family.type == "histogram":
            snapshot.histograms.setdefault(name, Histogram()).add_samples(family.samples)
        elif family.type == "counter":
            totals = [(s.labels, s.value) for s in family.samples if s.name.endswith("_total")]
            snapshot.counters[name] = sum(v for _, v in totals)
            snapshot.labeled[name] = totals
        elif family.type in ("gauge", "unknown", "untyped"):
            for sample in family.samples:
                total, n = seen.get(name, (0.0, 0))
                seen[name] = (total + sample.value, n + 1)
    snapshot.gauges = {name: total / n for name, (total, n) in seen.items()}
    return snapshot


def histogram_delta(before: Histogram | None, after: Histogram | None) -> dict | None:
    """Mean and bucket-interpolated percentiles of what was observed between two scrapes."""
    if after is None:
        return None
    before = before or Histogram()
    count = after.count - before.count
    if count <= 0:
        return None
    bounds = sorted(after.buckets)
    cumulative = [after.buckets[b] - before.buckets.get(b, 0.0) for b in bounds]
    out = {"count": int(count), "mean": (after.sum - before.sum) / count}
    for q in (50, 90, 99):
        rank, lower, below = q / 100 * count, 0.0, 0.0
        for bound, cum in zip(bounds, cumulative):
            if cum >= rank:
                inside = (rank - below) / (cum - below) if cum > below else 1.0
                # past the last finite bucket only a lower bound is known: report that bound
                out[f"p{q}"] = lower if bound == float("inf") else lower + (bound - lower) * inside
                break
            lower, below = bound, cum
    return out


async def scrape(http: httpx.AsyncClient, base_url: str) -> Snapshot | None:
    """The server's metrics now, or None when it has no usable /metrics."""
    try:
        response = await http.get(f"{base_url}/metrics")
        if response.status_code != 200:
            return None
        return parse_metrics(response.text)
    except (httpx.HTTPError, ValueError):
        return None


def process_rss_bytes(pid: int) -> int | None:
    """VmRSS of a local process (Linux /proc), or None if it is gone or unreadable."""
    try:
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) * 1024
    except (OSError, ValueError, IndexError):
        return None
    return None
