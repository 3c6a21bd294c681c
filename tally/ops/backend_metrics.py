"""The canary's second source: each backend's own `/metrics` (a Tally or a vLLM server, told apart by the names it
serves), scraped once per evaluation interval and kept as long as the rules' window reaches back. An evaluation adds
up, per side, what its backends' counters and histograms increased by between the first scrape inside the window and
the latest, into the figures the backend rules read (tally/ops/canary_rules.py). A backend's `/metrics` counts all
its traffic, including what did not come through this proxy."""
from __future__ import annotations

import logging
from collections import deque
from dataclasses import dataclass, field

import httpx

from tally.metric_names import (
    HTTP_REQUESTS,
    KV_CACHE_USAGE_PERC,
    NUM_PREEMPTIONS,
    REQUEST_ERROR,
    REQUEST_GENERATION_TOKENS,
    REQUEST_REJECTED,
    REQUEST_SUCCESS,
    REQUEST_TIME_PER_OUTPUT_TOKEN_SECONDS,
    REQUEST_TIMEOUT,
    TIME_TO_FIRST_TOKEN_SECONDS,
)
from tally.ops.canary_rules import BackendFigures
from tally.prometheus_text import Exposition, Histogram, counter_increase, histogram_increase, parse

HISTOGRAMS = {"ttft": TIME_TO_FIRST_TOKEN_SECONDS, "tpot": REQUEST_TIME_PER_OUTPUT_TOKEN_SECONDS,
              "output_tokens": REQUEST_GENERATION_TOKENS}
log = logging.getLogger("tally.route")


@dataclass(frozen=True)
class Scrape:
    """One backend's /metrics at one moment."""

    t_s: float  # monotonic, when the answer arrived
    metrics: Exposition


def parse_scrape(text: str, t_s: float) -> Scrape:
    """ValueError when the text is unreadable or serves neither tally: nor vllm: series."""
    try:
        metrics = parse(text)
    except ValueError as exc:
        raise ValueError(f"its /metrics is not Prometheus' text format ({exc})") from None
    if metrics.prefix is None:
        raise ValueError("its /metrics serves no tally: or vllm: series")
    return Scrape(t_s, metrics)


def _is_5xx(code: str) -> bool:
    return code.startswith("5")


def _errors(first: Exposition, last: Exposition) -> float | None:
    """5xx, rejections and timeouts in the window; None when the server counts none of them. A vLLM server counts no
    errors under vllm:, so there its 5xx and 429 come from its API server's http_requests_total, when it serves that."""
    if REQUEST_ERROR in last.counters:  # Tally: a failed request is counted once, as one of these three
        server_errors = counter_increase(first, last, REQUEST_ERROR, lambda labels: _is_5xx(labels.get("code", "")))
        rejected = counter_increase(first, last, REQUEST_REJECTED) or 0.0
        return server_errors + rejected + (counter_increase(first, last, REQUEST_TIMEOUT) or 0.0)
    return counter_increase(first, last, HTTP_REQUESTS, lambda labels: labels.get("handler", "").startswith("/v1/")
                            and (_is_5xx(labels.get("status", "")) or labels.get("status") == "429"))


@dataclass
class Delta:
    """One backend over one window."""

    span_s: float
    prefix: str
    histograms: dict[str, Histogram | None]  # by HISTOGRAMS key
    success: dict[str, float] | None  # by finished_reason
    errors: float | None
    preemptions: float | None
    kv_usage: float | None


def delta(first: Scrape, last: Scrape) -> Delta:
    before, after = first.metrics, last.metrics
    success = None
    if REQUEST_SUCCESS in after.counters:
        success = {}
        for labels, _ in after.counters[REQUEST_SUCCESS]:
            reason = labels.get("finished_reason", "")
            if reason not in success:
                success[reason] = counter_increase(before, after, REQUEST_SUCCESS,
                                                   lambda lb, r=reason: lb.get("finished_reason", "") == r)
    return Delta(last.t_s - first.t_s, after.prefix,
                 {key: histogram_increase(before, after, name) for key, name in HISTOGRAMS.items()},
                 success, _errors(before, after), counter_increase(before, after, NUM_PREEMPTIONS),
                 after.gauge(KV_CACHE_USAGE_PERC))


def _merged(histograms: list[Histogram]) -> Histogram:
    """Several backends' histograms as one: cumulative counts added at every bound any of them has (a backend
    without that bound counts what its next lower bound holds)."""
    bounds = sorted({b for h in histograms for b in h.buckets})
    out = Histogram({}, sum(h.sum for h in histograms), sum(h.count for h in histograms))
    for h in histograms:
        own = sorted(h.buckets)
        for b in bounds:
            below = [x for x in own if x <= b]
            out.buckets[b] = out.buckets.get(b, 0.0) + (h.buckets[below[-1]] if below else 0.0)
    return out


def side_figures(deltas: dict[str, Delta], missing: dict[str, str]) -> BackendFigures:
    """A side's backends' deltas (by URL) → the figures its backend rules read."""
    parts = list(deltas.values())
    unexposed = []
    hist = {}
    for key in HISTOGRAMS:
        present = [d.histograms[key] for d in parts if d.histograms[key] is not None]
        hist[key] = (_merged(present).summary() if present else None) or {"count": 0}
        if not present:
            unexposed.append({"ttft": "ttft_p99_s", "tpot": "tpot_p99_s",
                              "output_tokens": "mean_output_tokens"}[key])
    reasons: dict[str, float] = {}
    for d in parts:
        for reason, n in (d.success or {}).items():
            reasons[reason] = reasons.get(reason, 0.0) + n
    if all(d.success is None for d in parts):
        unexposed.append("length_share")
    finished = sum(n for reason, n in reasons.items() if reason != "abort")  # requests, where the proxy counts choices
    errors = None if any(d.errors is None for d in parts) else sum(d.errors for d in parts)
    if errors is None:
        unexposed.append("error_rate")
    requests = finished + (errors or 0.0)
    preemptions = [d.preemptions for d in parts if d.preemptions is not None]
    kv = [d.kv_usage for d in parts if d.kv_usage is not None]
    return BackendFigures(
        requests=int(requests), errors=int(errors or 0),
        error_rate=errors / requests if errors is not None and requests else None,
        ttft_samples=hist["ttft"]["count"], ttft_p99_s=hist["ttft"].get("p99"),
        tpot_samples=hist["tpot"]["count"], tpot_p99_s=hist["tpot"].get("p99"),
        output_samples=hist["output_tokens"]["count"], mean_output_tokens=hist["output_tokens"].get("mean"),
        finished_choices=int(finished), length_share=reasons.get("length", 0.0) / finished if finished else None,
        window_s=max(d.span_s for d in parts), prefix="+".join(sorted({d.prefix for d in parts})),
        replicas=tuple(deltas), missing=missing, unexposed=tuple(unexposed),
        preemptions=sum(preemptions) if preemptions else None, kv_usage=sum(kv) / len(kv) if kv else None)


@dataclass
class BackendScrapes:
    """Every backend's scrapes, by side; `keep_s`: how long the window can reach back (older ones are dropped)."""

    sides: dict[str, tuple[str, ...]]  # side -> its backends' base URLs
    keep_s: float
    history: dict[str, deque[Scrape]] = field(init=False)
    problem: dict[str, str | None] = field(init=False)  # the latest failed scrape's reason; None once one worked

    def __post_init__(self) -> None:
        self.history = {url: deque() for url in self.urls}
        self.problem = {url: "not scraped yet" for url in self.urls}

    @property
    def urls(self) -> list[str]:
        return [url for urls in self.sides.values() for url in urls]

    def add(self, url: str, t_s: float, text: str) -> None:
        """One scrape's text, read at t_s."""
        try:
            scrape = parse_scrape(text, t_s)
        except ValueError as exc:
            self.fail(url, str(exc))
            return
        history = self.history[url]
        if history and history[-1].metrics.prefix != scrape.metrics.prefix:  # another server now: counts start afresh
            history.clear()
        history.append(scrape)
        while history and history[0].t_s < t_s - self.keep_s:
            history.popleft()
        self.problem[url] = None

    def fail(self, url: str, reason: str) -> None:
        if reason != self.problem[url]:
            log.warning("canary: cannot read %s/metrics: %s; rules with source: backend hold the step (no data)",
                        url, reason)
        self.problem[url] = reason

    async def scrape(self, http: httpx.AsyncClient, url: str, clock, timeout_s: float) -> None:
        """GET url/metrics once; `clock()` stamps the answer (time.monotonic in the proxy)."""
        try:
            response = await http.get(f"{url}/metrics", timeout=timeout_s)
        except httpx.HTTPError as exc:
            self.fail(url, f"{type(exc).__name__} on /metrics")
            return
        if response.status_code != 200:
            self.fail(url, f"/metrics answered {response.status_code} (not a Tally or vLLM server?)")
            return
        self.add(url, clock(), response.text)

    def side(self, side: str, since_s: float, now_s: float) -> BackendFigures | str:
        """The side's figures between the first scrape at or after since_s and the latest, or why there are none."""
        deltas, missing = {}, {}
        for url in self.sides[side]:
            history = self.history[url]
            while history and history[0].t_s < since_s:
                history.popleft()
            inside = [s for s in history if s.t_s <= now_s]
            if len(inside) >= 2:
                deltas[url] = delta(inside[0], inside[-1])
            else:
                missing[url] = self.problem[url] or "fewer than two scrapes in the window yet"
        if not deltas:
            return "; ".join(f"{url}: {why}" for url, why in missing.items()) or "no backend on this side"
        return side_figures(deltas, missing)
