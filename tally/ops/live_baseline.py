"""A baseline from a live server instead of a `tally bench` run: its /metrics scraped at the start and the end of
a window (the waiting gauge every few seconds between), turned into the figures tally/ops/alerts.py reads from a
bench result: P99s from the histograms' bucket deltas, the most requests waiting, the 5xx share, mean output
tokens. Only what finished inside the window counts, so the window should hold normal traffic."""
from __future__ import annotations

import time

import httpx

from tally.bench.scrape import Snapshot, histogram_delta, parse_metrics
from tally.errors import ConfigError

SAMPLE_EVERY_S = 5.0


def live_baseline(url: str, window_s: float, sample_every_s: float = SAMPLE_EVERY_S) -> dict:
    """A result dict shaped like a `tally bench --out` result's parts that alerts read."""
    base = url.rstrip("/").removesuffix("/metrics")
    with httpx.Client(timeout=10.0) as http:
        first = _scrape(http, base)
        waiting, end = [], time.monotonic() + window_s
        while (left := end - time.monotonic()) > 0:
            time.sleep(min(sample_every_s, left))
            waiting.append(_scrape(http, base).gauge("waiting"))
        last = _scrape(http, base)
    return baseline_from_scrapes(first, last, [w for w in waiting if w is not None])


def baseline_from_scrapes(first: Snapshot, last: Snapshot, waiting: list[float]) -> dict:
    summary: dict = {}
    for key in ("ttft_s", "tpot_s", "itl_s", "e2e_s", "output_tokens"):
        delta = histogram_delta(first.histogram(key), last.histogram(key))
        if delta is not None:
            summary[key] = delta
    successes = (last.counter("success") or 0.0) - (first.counter("success") or 0.0)
    errors_5xx = _5xx(last) - _5xx(first)
    if successes + errors_5xx <= 0:
        raise ConfigError("no request finished during the baseline window: send normal traffic while it runs, or "
                          "use a longer --baseline-window")
    summary["counts"] = {"requests": int(successes + errors_5xx)}
    summary["errors"] = {"http_5xx": int(errors_5xx)} if errors_5xx else {}
    queue = histogram_delta(first.histogram("queue_time_s"), last.histogram("queue_time_s"))
    return {"summary": summary, "server_metrics": {"queue_time_s": queue} if queue else {},
            "soak": {"samples": [{"waiting": w} for w in waiting]}}


def _5xx(snapshot: Snapshot) -> float:
    return sum(v for labels, v in snapshot.labeled.get("request_error", []) if labels.get("code", "").startswith("5"))


def _scrape(http: httpx.Client, base: str) -> Snapshot:
    try:
        response = http.get(f"{base}/metrics")
    except httpx.HTTPError as exc:
        raise ConfigError(f"cannot scrape {base}/metrics: {exc}") from None
    if response.status_code != 200:
        raise ConfigError(f"{base}/metrics answered {response.status_code}; a baseline needs a Tally or vLLM server")
    return parse_metrics(response.text)
