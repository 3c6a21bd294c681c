"""A baseline from a live server instead of a `tally bench` run: its /metrics scraped at the start and the end of
a window (the waiting gauge every few seconds between), turned into the figures tally/ops/alerts.py reads from a
bench result: P99s from the histograms' bucket deltas, the most requests waiting, the 5xx share, requests turned
away or timed out, mean output tokens. Only what finished inside the window counts, so the window should hold normal
traffic."""
from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass

import httpx

from tally.errors import ConfigError
from tally.metric_names import (
    E2E_REQUEST_LATENCY_SECONDS,
    INTER_TOKEN_LATENCY_SECONDS,
    NUM_REQUESTS_WAITING,
    REQUEST_ERROR,
    REQUEST_GENERATION_TOKENS,
    REQUEST_QUEUE_TIME_SECONDS,
    REQUEST_REJECTED,
    REQUEST_SUCCESS,
    REQUEST_TIMEOUT,
    REQUEST_TIME_PER_OUTPUT_TOKEN_SECONDS,
    TIME_TO_FIRST_TOKEN_SECONDS,
)
from tally.prometheus_text import Exposition, counter_increase, histogram_delta, parse

SAMPLE_EVERY_S = 5.0
PROGRESS_EVERY_S = 30.0  # a line on how the window goes, so a long one never looks hung
# a bench result's summary key -> the server's histogram that stands in for the client's measurement
HISTOGRAMS = {"ttft_s": TIME_TO_FIRST_TOKEN_SECONDS, "tpot_s": REQUEST_TIME_PER_OUTPUT_TOKEN_SECONDS,
              "itl_s": INTER_TOKEN_LATENCY_SECONDS, "e2e_s": E2E_REQUEST_LATENCY_SECONDS,
              "output_tokens": REQUEST_GENERATION_TOKENS}


@dataclass(frozen=True)
class Finished:
    """How the requests that ended between two scrapes ended."""
    ok: int
    errors_5xx: int
    rejected: int
    timed_out: int

    @property
    def requests(self) -> int:
        return self.ok + self.errors_5xx + self.rejected + self.timed_out


def live_baseline(url: str, window_s: float, sample_every_s: float = SAMPLE_EVERY_S,
                  log: Callable[[str], None] = lambda line: None, progress_every_s: float = PROGRESS_EVERY_S) -> dict:
    """A result dict shaped like a `tally bench --out` result's parts that alerts read; `log` gets a line at the
    start and every `progress_every_s` while the window runs."""
    base = url.rstrip("/").removesuffix("/metrics")
    with httpx.Client(timeout=10.0) as http:
        first = _scrape(http, base)
        log(f"reading {base}/metrics for {clock(window_s)}: the requests that finish meanwhile make the baseline "
            "(keep normal traffic flowing to the server)")
        waiting, start = [], time.monotonic()
        end, report_at = start + window_s, start + progress_every_s
        while (left := end - time.monotonic()) > 0:
            time.sleep(min(sample_every_s, left))
            now = _scrape(http, base)
            waiting.append(now.gauge(NUM_REQUESTS_WAITING))
            if report_at <= time.monotonic() < end:
                report_at += progress_every_s
                log(_progress_line(time.monotonic() - start, window_s, finished(first, now), waiting))
        last = _scrape(http, base)
    return baseline_from_scrapes(first, last, [w for w in waiting if w is not None])


def clock(seconds: float) -> str:
    """90 -> 1m30s, 600 -> 10m, 2.5 -> 2.5s."""
    minutes, rest = divmod(round(seconds), 60)
    if not minutes:
        return f"{seconds:.3g}s"
    return f"{minutes}m{rest}s" if rest else f"{minutes}m"


def _progress_line(elapsed_s: float, window_s: float, done: Finished, waiting: list[float | None]) -> str:
    seen = [w for w in waiting if w is not None]
    line = (f"{clock(elapsed_s)} of {clock(window_s)}: {done.requests} request(s) finished ({done.errors_5xx} 5xx, "
            f"{done.rejected} turned away, {done.timed_out} timed out)")
    if seen:
        line += f", at most {max(seen):g} waiting"
    return line if done.requests else line + "; none yet: is traffic reaching this server?"


def finished(first: Exposition, last: Exposition) -> Finished:
    def count(name: str, keep: Callable[[dict[str, str]], bool] = lambda labels: True) -> int:
        return int(counter_increase(first, last, name, keep) or 0)
    return Finished(count(REQUEST_SUCCESS), count(REQUEST_ERROR, _5xx), count(REQUEST_REJECTED),
                    count(REQUEST_TIMEOUT))


def baseline_from_scrapes(first: Exposition, last: Exposition, waiting: list[float]) -> dict:
    summary: dict = {}
    for key, name in HISTOGRAMS.items():
        delta = histogram_delta(first, last, name)
        if delta is not None:
            summary[key] = delta
    done = finished(first, last)
    if done.requests <= 0:
        raise ConfigError("no request finished during the baseline window: send normal traffic while it runs, or "
                          "use a longer --baseline-window")
    summary["counts"] = {"requests": done.requests}
    summary["errors"] = {cause: n for cause, n in (("http_5xx", done.errors_5xx), ("rejected", done.rejected),
                                                   ("timed_out", done.timed_out)) if n}
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
