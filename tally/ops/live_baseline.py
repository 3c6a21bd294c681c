"""A baseline from a live server instead of a `tally bench` run: its /metrics scraped at the start and the end of
a window (the waiting gauge every few seconds between), turned into the figures tally/ops/alerts.py reads from a
bench result: P99s from the histograms' bucket deltas, the most requests waiting, the 5xx share, mean output
tokens. Only what finished inside the window counts, so the window should hold normal traffic."""
from __future__ import annotations

import time

import httpx

from tally.errors import ConfigError
from tally.metric_names import (
    E2E_REQUEST_LATENCY_SECONDS,
    INTER_TOKEN_LATENCY_SECONDS,
    NUM_REQUESTS_WAITING,
    REQUEST_ERROR,
    REQUEST_GENERATION_TOKENS,
    REQUEST_QUEUE_TIME_SECONDS,
    REQUEST_SUCCESS,
    REQUEST_TIME_PER_OUTPUT_TOKEN_SECONDS,
    TIME_TO_FIRST_TOKEN_SECONDS,
)
from tally.prometheus_text import Exposition, counter_increase, histogram_delta, parse

SAMPLE_EVERY_S = 5.0
# a bench result's summary key -> the server's histogram that stands in for the client's measurement
HISTOGRAMS = {"ttft_s": TIME_TO_FIRST_TOKEN_SECONDS, "tpot_s": REQUEST_TIME_PER_OUTPUT_TOKEN_SECONDS,
              "itl_s": INTER_TOKEN_LATENCY_SECONDS, "e2e_s": E2E_REQUEST_LATENCY_SECONDS,
              "output_tokens": REQUEST_GENERATION_TOKENS}


def live_baseline(url: str, window_s: float, sample_every_s: float = SAMPLE_EVERY_S) -> dict:
    """A result dict shaped like a `tally bench --out` result's parts that alerts read."""
    base = url.rstrip("/").removesuffix("/metrics")
    with httpx.Client(timeout=10.0) as http:
        first = _scrape(http, base)
        waiting, end = [], time.monotonic() + window_s
        while (left := end - time.monotonic()) > 0:
            time.sleep(min(sample_every_s, left))
            waiting.append(_scrape(http, base).gauge(NUM_REQUESTS_WAITING))
        last = _scrape(http, base)
    return baseline_from_scrapes(first, last, [w for w in waiting if w is not None])


def baseline_from_scrapes(first: Exposition, last: Exposition, waiting: list[float]) -> dict:
    summary: dict = {}
    for key, name in HISTOGRAMS.items():
        delta = histogram_delta(first, last, name)
        if delta is not None:
            summary[key] = delta
    successes = counter_increase(first, last, REQUEST_SUCCESS) or 0.0
    errors_5xx = counter_increase(first, last, REQUEST_ERROR, _5xx) or 0.0
    if successes + errors_5xx <= 0:
        raise ConfigError("no request finished during the baseline window: send normal traffic while it runs, or "
                          "use a longer --baseline-window")
    summary["counts"] = {"requests": int(successes + errors_5xx)}
    summary["errors"] = {"http_5xx": int(errors_5xx)} if errors_5xx else {}
    queue = histogram_delta(first, last, REQUEST_QUEUE_TIME_SECONDS)
    return {"summary": summary, "server_metrics": {"queue_time_s": queue} if queue else {},
            "soak": {"samples": [{"waiting": w} for w in waiting]}}


def _5xx(labels: dict[str, str]) -> bool:
    return labels.get("code", "").startswith("5")


def _scrape(http: httpx.Client, base: str) -> Exposition:
    try:
        response = http.get(f"{base}/metrics")
    except httpx.HTTPError as exc:
        raise ConfigError(f"cannot scrape {base}/metrics: {exc}") from None
    if response.status_code != 200:
        raise ConfigError(f"{base}/metrics answered {response.status_code}; a baseline needs a Tally or vLLM server")
    return parse(response.text)
