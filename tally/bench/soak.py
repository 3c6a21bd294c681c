"""Soak mode: sample the server while a long run goes on (its /metrics, its process memory, the
client's own TTFT P99 per window), then fit a line to each series and flag a trend (a leak,
fragmentation creep, latency drift) with the numbers behind it."""
from __future__ import annotations

import asyncio
from dataclasses import asdict, dataclass

import httpx
import numpy as np

from tally.bench.runner import RunState
from tally.bench.scrape import process_rss_bytes, scrape
from tally.metric_names import (
    KV_CACHE_FRAGMENTATION_PERC,
    KV_CACHE_USAGE_PERC,
    NUM_REQUESTS_RUNNING,
    NUM_REQUESTS_WAITING,
    PROCESS_RESIDENT_MEMORY_BYTES,
)

MIN_SAMPLES = 4
MIN_R2 = 0.5  # a trend must explain at least half the variance to be flagged
# series: (limit on the change over the run, whether the limit is relative, the smallest absolute change that
# can be flagged, what it means). The floor keeps scheduler noise on a fast server (a P99 TTFT going from 0.8 to
# 1.3 ms is +60% but nobody's problem) from reading as a trend.
THRESHOLDS = {
    "rss_bytes": (0.05, True, 16 * 2**20, "memory leak suspected"),
    "kv_usage": (0.05, False, 0.0, "KV usage creeping up (blocks not freed?)"),
    "fragmentation": (0.02, False, 0.0, "fragmentation creep"),
    "ttft_p99_s": (0.20, True, 0.05, "TTFT P99 drifting up"),
}
GAUGES = {"kv_usage": KV_CACHE_USAGE_PERC, "fragmentation": KV_CACHE_FRAGMENTATION_PERC,
          "running": NUM_REQUESTS_RUNNING, "waiting": NUM_REQUESTS_WAITING}  # sample field -> the server's gauge


@dataclass
class SoakSample:
    t_s: float
    completed: int  # requests that finished in this sample's window
    ttft_p99_s: float | None
    kv_usage: float | None = None
    fragmentation: float | None = None
    running: float | None = None
    waiting: float | None = None
    rss_bytes: float | None = None


async def sample_loop(state: RunState, http: httpx.AsyncClient, base_url: str, sample_s: float,
                      server_pid: int | None, samples: list[SoakSample]) -> None:
    """Appends one sample every `sample_s` until cancelled."""
    while True:
        await asyncio.sleep(sample_s)
        snapshot = await scrape(http, base_url)
        now_s = state.now_s()
        window = [r for r in state.records if r.end_s is not None and r.end_s > now_s - sample_s]
        ttfts = [r.ttft_s for r in window if r.ok]
        rss = process_rss_bytes(server_pid) if server_pid else None
        sample = SoakSample(now_s, len(window), float(np.percentile(ttfts, 99)) if ttfts else None)
        if snapshot is not None:
            for key, name in GAUGES.items():
                setattr(sample, key, snapshot.gauge(name))
            rss = rss if rss is not None else snapshot.gauge(PROCESS_RESIDENT_MEMORY_BYTES)
        sample.rss_bytes = rss
        samples.append(sample)


def trend(t_s: np.ndarray, values: np.ndarray) -> dict:
    """Least-squares line: slope per hour, fitted start and end, and r²."""
    slope, intercept = np.polyfit(t_s, values, 1)
    fitted = slope * t_s + intercept
    total = float(((values - values.mean()) ** 2).sum())
    r2 = 1.0 - float(((values - fitted) ** 2).sum()) / total if total > 0 else 0.0
    return {"slope_per_h": float(slope * 3600), "start": float(fitted[0]), "end": float(fitted[-1]),
            "change": float(fitted[-1] - fitted[0]), "r2": r2, "samples": len(values)}


def verdict(samples: list[SoakSample], warmup_s: float = 0.0) -> dict:
    """Trends of every series with data, and a flag for each one past its threshold."""
    kept = [s for s in samples if s.t_s >= warmup_s]
    result: dict = {"samples": [asdict(s) for s in samples], "series": {}, "flags": []}
    for key, (limit, relative, floor, meaning) in THRESHOLDS.items():
        points = [(s.t_s, getattr(s, key)) for s in kept if getattr(s, key) is not None]
        if len(points) < MIN_SAMPLES:
            continue
        t_s, values = (np.array(col, dtype=np.float64) for col in zip(*points))
        fit = trend(t_s, values)
        change = fit["change"] / abs(fit["start"]) if relative and fit["start"] else fit["change"]
        fit["change_relative" if relative else "change_absolute"] = change
        result["series"][key] = fit
        if change > limit and fit["change"] > floor and fit["r2"] >= MIN_R2:
            size = f"{change:+.1%}" if relative else f"{change:+.3f}"
            result["flags"].append(
                f"{meaning}: {key} {fit['start']:.4g} -> {fit['end']:.4g} ({size} over the run, "
                f"{fit['slope_per_h']:+.4g}/h, r²={fit['r2']:.2f}, {fit['samples']} samples; "
                f"limit {limit:g}{' relative' if relative else ''})")
    if not result["series"]:
        result["verdict"] = f"not enough samples (need {MIN_SAMPLES} after warmup)"
    else:
        result["verdict"] = "trend found" if result["flags"] else "stable"
    return result
