"""A run's result in GuideLLM's report shape (the `benchmarks.json` of `guidellm benchmark --output-path`, its
GenerativeBenchmarksReport), so notebooks written for GuideLLM read Tally's runs unchanged.

One benchmark holds every measured request by status (`successful`, `incomplete` — cancelled by an early stop —,
`errored`) with GuideLLM's per-request fields, and `metrics`: GuideLLM's distribution summaries (mean, median,
mode, std_dev, min, max, count, total_sum, percentiles p001 ... p999), each by status and in total. Latencies are
per request, in milliseconds as GuideLLM names them (its `time_per_output_token_ms` includes the first token; its
`inter_token_latency_ms` is what Tally calls TPOT). Rates and concurrency are weighted by time, as GuideLLM
computes them: a rate at each event over the span around it, the requests in flight over each interval.
Times are epoch seconds."""
from __future__ import annotations

from datetime import datetime

import numpy as np

STATUSES = ("successful", "incomplete", "errored")
PERCENTILES = {"p001": 0.001, "p01": 0.01, "p05": 0.05, "p10": 0.1, "p25": 0.25, "p50": 0.5, "p75": 0.75,
               "p90": 0.9, "p95": 0.95, "p99": 0.99, "p999": 0.999}
MERGE_S = 1e-4  # events closer than this count as one instant (GuideLLM's threshold)


def as_guidellm(result: dict) -> dict:
    t0 = datetime.strptime(result["started_at"], "%Y-%m-%dT%H:%M:%S%z").timestamp()
    measured = [r for r in result["requests"] if not r["warmup"] and r["sent_s"] is not None]
    by_status = {s: [_request(r, t0, result["server"]["endpoint"]) for r in measured if _status(r) == s]
                 for s in STATUSES}
    starts = [r["sent_s"] for r in measured]
    ends = [r["end_s"] for r in measured if r["end_s"] is not None]
    start, end = t0 + min(starts, default=0.0), t0 + max(ends, default=0.0)
    totals = {s: len(by_status[s]) for s in STATUSES}
    return {
        "args": {"target": result["server"]["url"], "model": result["server"]["model"],
                 "command": result["command"]},
        "benchmarks": [{
            "type_": "generative_benchmark",
            "config": {"strategy": _strategy(result["workload"]), "tally_workload": result["workload"]},
            "start_time": start, "end_time": end, "duration": end - start,
            "scheduler_metrics": {"start_time": start, "request_start_time": start, "measure_start_time": start,
                                  "measure_end_time": end, "request_end_time": end, "end_time": end,
                                  "requests_made": {**totals, "total": sum(totals.values())}},
            "metrics": _metrics(by_status, start, end),
            "requests": {**by_status, "total": None},
        }],
    }


def _status(r: dict) -> str:
    if r["error"] is None:
        return "successful"
    return "incomplete" if r["error"] == "cancelled" or r["end_s"] is None else "errored"


def _request(r: dict, t0: float, endpoint: str) -> dict:
    """One request as GuideLLM's GenerativeRequestStats dumps it (its computed fields included)."""
    start, end = t0 + r["sent_s"], t0 + (r["end_s"] if r["end_s"] is not None else r["sent_s"])
    first = None if r["first_token_s"] is None else t0 + r["first_token_s"]
    last = None if r["last_token_s"] is None else t0 + r["last_token_s"]
    n_prompt, n_out = r["prompt_tokens"], r["output_tokens"]
    latency = end - start
    out = {
        "type_": "generative_request_stats", "request_id": str(r["id"]),
        "request_type": "chat_completions" if endpoint == "chat" else "text_completions",
        "info": {"timings": {"request_start": start, "request_end": end, "first_token_iteration": first,
                             "last_token_iteration": last,
                             "token_iterations": len(r["itl_s"]) + 1 if first is not None else 0}},
        "request_start_time": start, "request_end_time": end, "first_token_time": first, "last_token_time": last,
        "request_latency": latency, "prompt_tokens": n_prompt, "output_tokens": n_out,
        "total_tokens": n_prompt + n_out,
        "time_to_first_token_ms": None if first is None else 1e3 * (first - start),
        "time_per_output_token_ms": 1e3 * ((last or end) - start) / n_out if n_out else None,
        "inter_token_latency_ms": 1e3 * (last - first) / (n_out - 1) if first is not None and n_out > 1 else None,
        "tokens_per_second": (n_prompt + n_out) / latency if latency > 0 else None,
        "output_tokens_per_second": n_out / latency if latency > 0 else None,
    }
    if r["error"] is not None:
        out["error"] = f"{r['error']}: {r.get('detail') or ''}"
    return out


def _strategy(workload: dict) -> dict:
    """The arrival process by GuideLLM's strategy names where it has one (synchronous, concurrent, poisson);
    Tally's own kind otherwise (gamma, phases, replay)."""
    arrivals = workload["arrivals"]
    if arrivals["kind"] == "closed_loop":
        streams = arrivals["concurrency"]
        return {"type_": "synchronous"} if streams == 1 else {"type_": "concurrent", "streams": streams}
    return {"type_": arrivals["kind"], "rate": arrivals.get("rate_per_s"),
            "max_concurrency": arrivals.get("max_concurrency")}


def _metrics(by_status: dict[str, list[dict]], start: float, end: float) -> dict:
    def values(field: str) -> dict:
        return _by_status(by_status, lambda rs: _summary([r[field] for r in rs if r[field] is not None]))

    def rate(tokens: str | None) -> dict:
        return _by_status(by_status, lambda rs: _rate(_token_events(rs, tokens), start, end))

    return {
        "request_totals": {**{s: len(by_status[s]) for s in STATUSES},
                           "total": sum(len(v) for v in by_status.values())},
        "requests_per_second": rate(None),
        "request_concurrency": _by_status(by_status, _concurrency),
        "request_latency": values("request_latency"),
        "prompt_token_count": values("prompt_tokens"),
        "output_token_count": values("output_tokens"),
        "total_token_count": values("total_tokens"),
        "time_to_first_token_ms": values("time_to_first_token_ms"),
        "time_per_output_token_ms": values("time_per_output_token_ms"),
        "inter_token_latency_ms": values("inter_token_latency_ms"),
        "prompt_tokens_per_second": rate("prompt"),
        "output_tokens_per_second": rate("output"),
        "tokens_per_second": rate("total"),
    }


def _by_status(by_status: dict[str, list[dict]], summarize) -> dict:
    return {**{s: summarize(by_status[s]) for s in STATUSES},
            "total": summarize([r for s in STATUSES for r in by_status[s]])}


def _token_events(requests: list[dict], tokens: str | None) -> list[tuple[float, float]]:
    """(time, count) events: a request at its end; prompt tokens at the first token; output tokens spread evenly
    from the first token to the last, as GuideLLM spreads them over a stream's iterations."""
    events: list[tuple[float, float]] = []
    for r in requests:
        if tokens is None:
            events.append((r["request_end_time"], 1.0))
            continue
        first = r["first_token_time"] or r["request_end_time"]
        if tokens in ("prompt", "total"):
            events.append((first, float(r["prompt_tokens"])))
        if tokens in ("output", "total") and r["output_tokens"]:
            last = r["last_token_time"] or first
            events += [(float(t), 1.0) for t in np.linspace(first, last, r["output_tokens"])]
    return events


def _rate(events: list[tuple[float, float]], start: float, end: float) -> dict:
    """Events per second, time-weighted: each (merged) instant's count over the span between its neighbours'
    midpoints."""
    data = np.array([(start, 0.0), *events, (end, 0.0)], dtype=np.float64)
    keys, inverse = np.unique(np.round(data[:, 0] / MERGE_S), return_inverse=True)
    counts = np.bincount(inverse, weights=data[:, 1])
    if len(keys) < 2:
        return _summary([], count=int(counts.sum()))
    times = keys * MERGE_S
    edges = np.concatenate([[times[0]], (times[1:] + times[:-1]) / 2, [times[-1]]])
    spans = np.maximum(np.diff(edges), 1e-9)
    return _summary(counts / spans, spans, count=round(counts.sum()))


def _concurrency(requests: list[dict]) -> dict:
    """Requests in flight, weighted by how long each level lasted."""
    if not requests:
        return _summary([])
    starts = [r["request_start_time"] for r in requests]
    ends = [r["request_end_time"] for r in requests]
    times = np.array(starts + ends)
    steps = np.array([1.0] * len(starts) + [-1.0] * len(ends))
    order = np.lexsort((steps, times))  # at a tie, an end before a start
    levels = np.cumsum(steps[order])[:-1]
    spans = np.diff(times[order])
    if spans.sum() <= 0:
        return _summary([float(len(requests))], count=len(requests))
    return _summary(levels, spans, count=len(requests))


def _summary(values, weights=None, count: int | None = None) -> dict:
    """GuideLLM's DistributionSummary of (weighted) values."""
    v = np.asarray(values, dtype=np.float64)
    w = np.ones_like(v) if weights is None else np.asarray(weights, dtype=np.float64)
    count = len(v) if count is None else count
    if v.size == 0 or w.sum() <= 0:
        return {"mean": 0.0, "median": 0.0, "mode": 0.0, "variance": 0.0, "std_dev": 0.0, "min": 0.0, "max": 0.0,
                "count": count, "total_sum": 0.0, "percentiles": dict.fromkeys(PERCENTILES, 0.0)}
    order = np.argsort(v, kind="stable")
    v, p = v[order], w[order] / w.sum()
    cdf = np.cumsum(p)
    at = {k: float(v[min(np.searchsorted(cdf, q - 1e-12), len(v) - 1)]) for k, q in PERCENTILES.items()}
    mean = float(np.sum(v * p))
    variance = float(np.sum((v - mean) ** 2 * p))
    unique, inverse = np.unique(v, return_inverse=True)
    return {"mean": mean, "median": at["p50"], "mode": float(unique[np.argmax(np.bincount(inverse, weights=p))]),
            "variance": variance, "std_dev": variance ** 0.5, "min": float(v[0]), "max": float(v[-1]),
            "count": count, "total_sum": mean * count, "percentiles": at}
