"""A run's result in GuideLLM's report shape: the benchmarks.json that `guidellm run --output kind=json` writes (its
GenerativeBenchmarksReport, report format version 2, GuideLLM 0.8), which GuideLLM's own loader
(`GenerativeBenchmarksReport.load_file`) reads, so notebooks written for GuideLLM read Tally's runs unchanged."""
from __future__ import annotations

import uuid
from datetime import datetime

import numpy as np

STATUSES = ("successful", "incomplete", "errored")
PERCENTILES = {"p001": 0.001, "p01": 0.01, "p05": 0.05, "p10": 0.1, "p25": 0.25, "p50": 0.5, "p75": 0.75,
               "p90": 0.9, "p95": 0.95, "p99": 0.99, "p999": 0.999}
MERGE_S = 1e-4  # events closer than this count as one instant (GuideLLM's threshold)
INFO_STATUS = {"successful": "completed", "incomplete": "cancelled", "errored": "errored"}
# GuideLLM's summaries of what Tally does not measure: the multimodal and tool-call token counts
_EMPTY_USAGE = dict.fromkeys(("input", "input_per_second", "input_concurrency", "output", "output_per_second",
                              "output_concurrency", "total", "total_per_second", "total_concurrency"))
# GuideLLM's scheduler timings that have no counterpart in Tally's client (it sends each request itself)
_SCHEDULER_DELAYS = ("queued_time_avg", "resolve_start_delay_avg", "request_start_delay_avg", "resolve_end_delay_avg",
                     "finalized_delay_avg", "processed_delay_avg")


def as_guidellm(result: dict) -> dict:
    """`config` is GuideLLM's scenario: the backend (the server's URL, model and endpoint), the profile — Tally's
    arrivals by GuideLLM's names: synchronous, concurrent, poisson (gamma and phased arrivals, which GuideLLM lacks, as
    poisson at their first rate), replay — and the data: the lengths actually sent, as a synthetic_text spec (mean,
    stdev, min, max). Tally's own description of the workload is kept beside it (`tally_workload`). One benchmark holds
    every measured request by status (`successful`, `incomplete` — cancelled by an early stop —, `errored`) as
    GuideLLM's GenerativeRequestStats: the timings and token counts GuideLLM derives its per-request figures from, and
    those figures as GuideLLM writes them out (in milliseconds; its `time_per_output_token_ms` includes the first token;
    its `inter_token_latency_ms` is what Tally calls TPOT). `metrics` are GuideLLM's distribution summaries (mean,
    median, mode, std_dev, min, max, count, total_sum, percentiles p001 ... p999) by status and in total; rates and
    concurrency weighted by time as GuideLLM computes them: a rate at each event over the span around it, the requests
    in flight over each interval. What Tally does not measure (GuideLLM's scheduler internals, websocket round trips,
    images, audio, tool calls) is zero, empty or null. Times are epoch seconds."""
    t0 = datetime.strptime(result["started_at"], "%Y-%m-%dT%H:%M:%S%z").timestamp()
    server = result["server"]
    measured = [r for r in result["requests"] if not r["warmup"] and r["sent_s"] is not None]
    by_status = {s: [_request(r, t0, s) for r in measured if _status(r) == s] for s in STATUSES}
    starts = [r["sent_s"] for r in measured]
    ends = [r["end_s"] for r in measured if r["end_s"] is not None]
    start, end = t0 + min(starts, default=0.0), t0 + max(ends, default=0.0)
    totals = {s: len(by_status[s]) for s in STATUSES}
    backend = {"kind": "openai_http", "target": server["url"], "model": server["model"],
               "request_format": "/v1/chat/completions" if server["endpoint"] == "chat" else "/v1/completions"}
    strategy, profile = _strategy(result["workload"])
    requests = [r for s in STATUSES for r in by_status[s]]
    lateness = [r["info"]["timings"]["request_start"] - r["info"]["timings"]["targeted_start"] for r in requests]
    latency = [r["request_latency"] for r in requests]
    return {
        "config": {"metadata": {"labels": {"written_by": "tally bench", "command": " ".join(result["command"])}},
                   "spec": {"backend": backend, "profile": profile, "data": [_data(measured)]}},
        "benchmarks": [{
            "type_": "generative_benchmark",
            "config": {"run_id": str(uuid.uuid4()), "run_index": 0, "strategy": strategy, "constraints": {},
                       "profile": profile, "requests": {}, "backend": backend, "environment": {},
                       "tally_workload": result["workload"]},
            "scheduler_state": {"start_time": start, "end_time": end, "start_requests_time": start,
                                "end_requests_time": end, "created_requests": len(requests),
                                "processed_requests": len(requests), "successful_requests": totals["successful"],
                                "errored_requests": totals["errored"], "cancelled_requests": totals["incomplete"]},
            "scheduler_metrics": {"start_time": start, "request_start_time": start, "measure_start_time": start,
                                  "measure_end_time": end, "request_end_time": end, "end_time": end,
                                  "requests_made": {**totals, "total": sum(totals.values())},
                                  **dict.fromkeys(_SCHEDULER_DELAYS, 0.0),
                                  "resolve_targeted_start_delay_avg": _mean(lateness),
                                  "request_targeted_start_delay_avg": _mean(lateness),
                                  "request_time_avg": _mean(latency), "resolve_time_avg": _mean(latency),
                                  "strategy_type": strategy["type_"]},
            "metrics": _metrics(by_status, start, end),
            "requests": {**by_status, "total": None},
            "start_time": start, "end_time": end, "duration": end - start,
        }],
    }


def _status(r: dict) -> str:
    if r["error"] is None:
        return "successful"
    return "incomplete" if r["error"] == "cancelled" or r["end_s"] is None else "errored"


def _request(r: dict, t0: float, status: str) -> dict:
    """One request as GuideLLM's GenerativeRequestStats dumps it: what it is computed from, then its computed
    fields."""
    start, end = t0 + r["sent_s"], t0 + (r["end_s"] if r["end_s"] is not None else r["sent_s"])
    first = None if r["first_token_s"] is None else t0 + r["first_token_s"]
    last = None if r["last_token_s"] is None else t0 + r["last_token_s"]
    n_prompt, n_out = r["prompt_tokens"], r["output_tokens"]
    iterations = len(r["itl_s"]) + 1 if first is not None else 0  # streamed chunks that carried text
    latency = end - start
    timings = {"targeted_start": t0 + r["scheduled_s"], "resolve_start": start, "request_start": start,
               "first_token_iteration": first, "first_output_token_iteration": first, "last_token_iteration": last,
               "token_iterations": iterations, "request_end": end, "resolve_end": end}
    error = None if r["error"] is None else f"{r['error']}: {r.get('detail') or ''}"
    return {
        "type_": "generative_request_stats", "request_id": str(r["id"]),
        "info": {"request_id": str(r["id"]), "status": INFO_STATUS[status], "scheduler_start_time": t0,
                 "timings": timings, "error": error},
        "input_metrics": {"text_tokens": n_prompt, "total_tokens": n_prompt},
        "output_metrics": {"text_tokens": n_out, "total_tokens": n_out},
        "request_start_time": start, "request_end_time": end, "request_latency": latency,
        "request_dispatch_delay": start - timings["targeted_start"],
        "prompt_tokens": n_prompt, "output_tokens": n_out, "total_tokens": n_prompt + n_out,
        "time_to_first_token_ms": None if first is None else 1e3 * (first - start),
        "time_to_first_output_token_ms": None if first is None else 1e3 * (first - start),
        "time_per_output_token_ms": 1e3 * ((last or end) - start) / n_out if n_out else None,
        "inter_token_latency_ms": 1e3 * (last - first) / (n_out - 1) if first is not None and n_out > 1 else None,
        "tokens_per_second": (n_prompt + n_out) / latency if latency > 0 else None,
        "output_tokens_per_second": n_out / latency if latency > 0 else None,
        "output_tokens_per_iteration": n_out / iterations if iterations else None,
        "iter_tokens_per_iteration": (n_out - 1) / (iterations - 1) if n_out > 1 and iterations > 1 else None,
    }


def _strategy(workload: dict) -> tuple[dict, dict]:
    """(GuideLLM's scheduling strategy, its profile) for the run's arrival process."""
    arrivals = workload["arrivals"]
    if arrivals["kind"] == "closed_loop":
        streams = arrivals["concurrency"]
        if streams == 1:
            return {"type_": "synchronous"}, {"kind": "synchronous"}
        return {"type_": "concurrent", "streams": streams}, {"kind": "concurrent", "streams": [streams]}
    cap = arrivals.get("max_concurrency")
    if arrivals["kind"] == "replay":
        return ({"type_": "trace", "time_scale": arrivals["time_scale"], "max_concurrency": cap},
                {"kind": "replay", "time_scale": arrivals["time_scale"]})
    rate = arrivals["rate_per_s"]
    return ({"type_": "poisson", "rate": rate, "max_concurrency": cap, "random_seed": workload["seed"]},
            {"kind": "poisson", "rate": [rate], "max_concurrency": cap})


def _data(measured: list[dict]) -> dict:
    """The lengths sent, as GuideLLM's synthetic_text data spec describes a workload (whole tokens, each > 0, or
    none)."""
    spec: dict = {"kind": "synthetic_text"}
    for name, key in (("prompt_tokens", "prompt_tokens"), ("output_tokens", "expected_output_tokens")):
        values = np.array([r[key] for r in measured] or [1], dtype=np.float64)
        spec |= {name: max(1, round(values.mean())), f"{name}_stdev": round(values.std()) or None,
                 f"{name}_min": max(1, int(values.min())), f"{name}_max": max(1, int(values.max()))}
    return spec


def _mean(values: list[float]) -> float:
    return float(np.mean(values)) if values else 0.0


def _metrics(by_status: dict[str, list[dict]], start: float, end: float) -> dict:
    def values(field: str) -> dict:
        return _by_status(by_status, lambda rs: _summary([r[field] for r in rs if r[field] is not None]))

    def rate(tokens: str | None) -> dict:
        return _by_status(by_status, lambda rs: _rate(_token_events(rs, tokens), start, end))

    tokens = {"input": values("prompt_tokens"), "input_per_second": rate("prompt"), "input_concurrency": None,
              "output": values("output_tokens"), "output_per_second": rate("output"), "output_concurrency": None,
              "total": values("total_tokens"), "total_per_second": rate("total"), "total_concurrency": None}
    iterations = _by_status(by_status, lambda rs: _summary([r["info"]["timings"]["token_iterations"] for r in rs]))
    return {
        "request_totals": {**{s: len(by_status[s]) for s in STATUSES},
                           "total": sum(len(v) for v in by_status.values())},
        "requests_per_second": rate(None),
        "request_concurrency": _by_status(by_status, _concurrency),
        "request_latency": values("request_latency"),
        "request_dispatch_delay": values("request_dispatch_delay"),
        "request_streaming_iterations_count": iterations,
        "prompt_token_count": tokens["input"],
        "output_token_count": tokens["output"],
        "total_token_count": tokens["total"],
        "time_to_first_token_ms": values("time_to_first_token_ms"),
        "time_to_first_output_token_ms": values("time_to_first_output_token_ms"),
        "time_per_output_token_ms": values("time_per_output_token_ms"),
        "inter_token_latency_ms": values("inter_token_latency_ms"),
        "time_to_last_round_trip_ms": _by_status(by_status, lambda rs: _summary([])),
        "avg_round_trip_time_ms": _by_status(by_status, lambda rs: _summary([])),
        "prompt_tokens_per_second": tokens["input_per_second"],
        "output_tokens_per_second": tokens["output_per_second"],
        "tokens_per_second": tokens["total_per_second"],
        "output_tokens_per_iteration": values("output_tokens_per_iteration"),
        "iter_tokens_per_iteration": values("iter_tokens_per_iteration"),
        "text": {"tokens": tokens, "words": None, "characters": None},
        "image": {"tokens": None, "images": None, "pixels": None, "bytes": None},
        "video": {"tokens": None, "frames": None, "seconds": None, "bytes": None},
        "audio": {"tokens": None, "samples": None, "seconds": None, "bytes": None},
        "tool_call": {"tokens": _EMPTY_USAGE, "mixed_tokens": _EMPTY_USAGE, "count": _EMPTY_USAGE},
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
        timings = r["info"]["timings"]
        first = timings["first_token_iteration"] or r["request_end_time"]
        if tokens in ("prompt", "total"):
            events.append((first, float(r["prompt_tokens"])))
        if tokens in ("output", "total") and r["output_tokens"]:
            last = timings["last_token_iteration"] or first
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
