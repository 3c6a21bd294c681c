"""The canary's second source: each backend's own `/metrics`, when it is a Tally server (`tally:` names) or a vLLM
server (`vllm:` names) — which one is detected from the names it serves, per scrape.

Every backend is scraped once per evaluation interval (tally/ops/router.py runs one loop per backend) and its
scrapes are kept for as long as the rules' window needs them. An evaluation reads, per side, the difference between
the first scrape inside its window and the latest one — histogram buckets and counters, as Prometheus' increase()
would, a counter that went down (a restarted server) counting from zero — summed over the side's backends, and
computes the figures the proxy's rules read (tally/ops/canary_rules.py):

- TTFT and TPOT P99: `time_to_first_token_seconds`, `request_time_per_output_token_seconds` (an older vLLM's
  `time_per_output_token_seconds`), interpolated within the buckets;
- error share: 5xx (`request_error{code=~"5.."}`), rejections and timeouts over finished requests; a vLLM server
  counts no errors under `vllm:`, so there its 5xx and 429 come from `http_requests_total{handler=~"/v1/.*"}` when
  it serves that (prometheus-fastapi-instrumentator), else the error share is not exposed;
- mean output tokens: `request_generation_tokens`;
- length share: `request_success{finished_reason="length"}` over the requests that finished for any reason but
  abort (per request, where the proxy counts per choice);
- recorded but not judged: preemptions (`num_preemptions`) and KV usage (`kv_cache_usage_perc`, an older vLLM's
  `gpu_cache_usage_perc`) at the window's end.

A backend without `/metrics`, or whose `/metrics` has neither prefix (a plain OpenAI-compatible server), gives no
figures; a side with no backend read gives "no data", and the backend rules hold the step (tally/ops/canary.py).
Everything a backend's `/metrics` counts is counted, including traffic that did not come through this proxy.
"""
from __future__ import annotations

import logging
from collections import deque
from dataclasses import dataclass, field

import httpx
from prometheus_client.parser import text_string_to_metric_families

from tally.bench.scrape import Histogram, histogram_delta
from tally.ops.canary_rules import BackendFigures

PREFIXES = ("tally:", "vllm:")
HISTOGRAMS = {
    "ttft": ("time_to_first_token_seconds",),
    "tpot": ("request_time_per_output_token_seconds", "time_per_output_token_seconds"),
    "output_tokens": ("request_generation_tokens",),
}
KV_USAGE = ("kv_cache_usage_perc", "gpu_cache_usage_perc")
HTTP_REQUESTS = "http_requests"  # prometheus-fastapi-instrumentator's counter, unprefixed (vLLM's API server)
log = logging.getLogger("tally.route")


@dataclass(frozen=True)
class Scrape:
    """One backend's /metrics at one moment, its names without the prefix; histograms summed over label sets."""

    t_s: float  # monotonic, when the answer arrived
    prefix: str
    histograms: dict[str, Histogram]
    counters: dict[str, list[tuple[dict[str, str], float]]]  # by label set
    gauges: dict[str, list[float]]  # by label set


def parse_scrape(text: str, t_s: float) -> Scrape:
    """The Prometheus text format (prometheus_client's parser) → a Scrape; ValueError when it is unreadable or
    serves neither tally: nor vllm: series."""
    try:
        families = list(text_string_to_metric_families(text))
    except ValueError as exc:
        raise ValueError(f"its /metrics is not Prometheus' text format ({exc})") from None
    prefix = next((p for p in PREFIXES if any(f.name.startswith(p) for f in families)), None)
    if prefix is None:
        raise ValueError("its /metrics serves no tally: or vllm: series")
    histograms: dict[str, Histogram] = {}
    counters: dict[str, list] = {}
    gauges: dict[str, list[float]] = {}
    for family in families:
        if family.name.startswith(prefix):
            name = family.name[len(prefix):]
        elif family.name == HTTP_REQUESTS:
            name = family.name
        else:
            continue  # process_*, python_*, the other prefix
        if family.type == "histogram":
            histograms.setdefault(name, Histogram()).add_samples(family.samples)
        elif family.type == "counter":
            counters[name] = [({k: v for k, v in s.labels.items()}, s.value) for s in family.samples
                              if s.name.endswith("_total") or s.name == family.name]
        elif family.type in ("gauge", "unknown", "untyped"):
            gauges[name] = [s.value for s in family.samples]
    return Scrape(t_s, prefix, histograms, counters, gauges)


def _increase(before: float, after: float) -> float:
    return after - before if after >= before else after  # gone down: the server restarted, counting from 0


def _counter(first: Scrape, last: Scrape, name: str, keep=lambda labels: True) -> float | None:
    """The increase of one counter's label sets that `keep` accepts; None when the server has no such counter."""
    if name not in last.counters:
        return None
    before = {tuple(sorted(labels.items())): v for labels, v in first.counters.get(name, [])}
    return sum(_increase(before.get(tuple(sorted(labels.items())), 0.0), v)
               for labels, v in last.counters[name] if keep(labels))


def _histogram(first: Scrape, last: Scrape, names: tuple[str, ...]) -> Histogram | None:
    name = next((n for n in names if n in last.histograms), None)
    if name is None:
        return None
    after, before = last.histograms[name], first.histograms.get(name, Histogram())
    if after.count < before.count:  # restarted
        before = Histogram()
    return Histogram({b: _increase(before.buckets.get(b, 0.0), c) for b, c in after.buckets.items()},
                     after.sum - before.sum, after.count - before.count)


def _is_5xx(code: str) -> bool:
    return code.startswith("5")


def _errors(first: Scrape, last: Scrape) -> float | None:
    """5xx, rejections and timeouts in the window; None when the server counts none of them."""
    if "request_error" in last.counters:  # Tally: a failed request is counted once, as one of these three
        server_errors = _counter(first, last, "request_error", lambda labels: _is_5xx(labels.get("code", "")))
        rejected = _counter(first, last, "request_rejected") or 0.0
        return server_errors + rejected + (_counter(first, last, "request_timeout") or 0.0)
    return _counter(first, last, HTTP_REQUESTS, lambda labels: labels.get("handler", "").startswith("/v1/") and (
        _is_5xx(labels.get("status", "")) or labels.get("status") == "429"))


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
    success = None
    if "request_success" in last.counters:
        success = {}
        for labels, _ in last.counters["request_success"]:
            reason = labels.get("finished_reason", "")
            if reason not in success:
                success[reason] = _counter(first, last, "request_success",
                                           lambda lb, r=reason: lb.get("finished_reason", "") == r)
    kv = next((last.gauges[n] for n in KV_USAGE if last.gauges.get(n)), None)
    return Delta(last.t_s - first.t_s, last.prefix, {k: _histogram(first, last, names)
                                                     for k, names in HISTOGRAMS.items()},
                 success, _errors(first, last), _counter(first, last, "num_preemptions"),
                 sum(kv) / len(kv) if kv else None)


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
        summary = histogram_delta(None, _merged(present)) if present else None
        hist[key] = summary or {"count": 0}
        if not present:
            unexposed.append({"ttft": "ttft_p99_s", "tpot": "tpot_p99_s",
                              "output_tokens": "mean_output_tokens"}[key])
    reasons: dict[str, float] = {}
    for d in parts:
        for reason, n in (d.success or {}).items():
            reasons[reason] = reasons.get(reason, 0.0) + n
    if all(d.success is None for d in parts):
        unexposed.append("length_share")
    finished = sum(n for reason, n in reasons.items() if reason != "abort")
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
        if history and history[-1].prefix != scrape.prefix:  # a different server now: its counters start afresh
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
