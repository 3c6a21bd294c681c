"""The HTML report: one self-contained file (inline SVG and CSS, no scripts, nothing fetched)
with latency CDFs, TTFT/TPOT over time against arrivals, throughput over time, the soak series,
and the same tables and definitions as the terminal report. Built from the JSON result alone."""
from __future__ import annotations

import json
from html import escape
from pathlib import Path

import numpy as np

from tally.bench.report_json import partial_line
from tally.bench.report_text import COLUMNS, LATENCIES
from tally.bench.stats import CANCELLED
from tally.bench.svg import Chart, Series, render
from tally.bench.wording import causes_words, slo_words
from tally.units import format_s

_CSS = ("body{font-family:sans-serif;max-width:1420px;margin:20px auto;color:#222}"
        "table{border-collapse:collapse;margin:8px 0}td,th{border:1px solid #ccc;padding:3px 8px;"
        "text-align:right}th{background:#f4f4f4}td:first-child{text-align:left}"
        ".warn{color:#a60}.flag{color:#c00}svg{margin:4px}pre{background:#f8f8f8;padding:8px}")


def _cdf(values: list[float]) -> tuple[np.ndarray, np.ndarray]:
    xs = np.sort(np.asarray(values, dtype=float))
    return xs, np.arange(1, len(xs) + 1) / max(len(xs), 1)


def _ok(requests: list[dict]) -> list[dict]:
    return [r for r in requests if r["error"] is None and not r["warmup"]]


def _bins(times: list[float], span_s: float, bin_s: float, weights: list[float] | None = None):
    edges = np.arange(0.0, span_s + bin_s, bin_s)
    counts, _ = np.histogram(times, bins=edges, weights=weights)
    return edges[:-1], counts / bin_s


def _charts(result: dict) -> list[Chart]:
    requests = result["requests"]
    ok = _ok(requests)
    ttft = [r["first_token_s"] - r["sent_s"] for r in ok]
    e2e = [r["last_token_s"] - r["sent_s"] for r in ok]
    tpot = [(r["last_token_s"] - r["first_token_s"]) / (r["output_tokens"] - 1) for r in ok
            if r["output_tokens"] > 1]
    itl = [x for r in ok for x in r["itl_s"]]
    span_s = max([r["end_s"] or 0.0 for r in requests] + [1e-3])
    bin_s = max(span_s / 60, 0.25)
    markers = [(p["start_s"], p["name"]) for p in result["phases"]]
    arrivals = Series("arrivals/s", *_bins([r["scheduled_s"] for r in requests], span_s, bin_s))
    failed = [r for r in requests if r["error"] not in (None, CANCELLED) and r["sent_s"] is not None]
    fail_points = Series("failed", [r["sent_s"] for r in failed], [0.0] * len(failed), "points",
                         "#c00")
    token_times = [t for r in ok for t in r["first_token_s"] + np.concatenate(
        [[0.0], np.cumsum(r["itl_s"])])]
    charts = [
        Chart("ttft_cdf", "TTFT CDF", "seconds", "fraction", [Series("TTFT", *_cdf(ttft), "step")]),
        Chart("tpot_cdf", "TPOT and ITL CDF", "seconds", "fraction",
              [Series("TPOT", *_cdf(tpot), "step"), Series("ITL", *_cdf(itl), "step")]),
        Chart("e2e_cdf", "E2E latency CDF", "seconds", "fraction", [Series("E2E", *_cdf(e2e), "step")]),
        Chart("ttft_over_time", "TTFT by send time (bars: arrivals/s)", "run time (s)", "TTFT (s)",
              [Series("TTFT", [r["sent_s"] for r in ok], ttft, "points"), fail_points],
              arrivals, markers),
        Chart("tpot_over_time", "TPOT by send time (bars: arrivals/s)", "run time (s)", "TPOT (s)",
              [Series("TPOT", [r["sent_s"] for r in ok if r["output_tokens"] > 1], tpot, "points"),
               fail_points], arrivals, markers),
        Chart("throughput_over_time", "completed requests/s (bars: arrivals/s)", "run time (s)",
              "requests/s", [Series("completed/s", *_bins([r["end_s"] for r in ok], span_s, bin_s))],
              arrivals, markers),
        Chart("token_throughput_over_time", "output tokens/s (streamed chunks)", "run time (s)",
              "tokens/s", [Series("chunks/s", *_bins(token_times, span_s, bin_s))], None, markers),
    ]
    soak = result.get("soak")
    if soak and soak["samples"]:
        samples = soak["samples"]
        t = [s["t_s"] for s in samples]

        def series(key: str, scale: float = 1.0) -> Series:
            pairs = [(s["t_s"], s[key] * scale) for s in samples if s[key] is not None]
            return Series(key, [p[0] for p in pairs], [p[1] for p in pairs], "line")
        charts += [
            Chart("soak_kv", "KV usage and fragmentation", "run time (s)", "fraction",
                  [series("kv_usage"), series("fragmentation")]),
            Chart("soak_memory", "server resident memory", "run time (s)", "MiB",
                  [series("rss_bytes", 1 / 2**20)]),
            Chart("soak_ttft_p99", "TTFT P99 per sample window", "run time (s)", "seconds",
                  [series("ttft_p99_s")], Series("completed", t, [s["completed"] for s in samples])),
        ]
    return charts


def _latency_table(summary: dict) -> str:
    head = "".join(f"<th>{c.upper()}</th>" for c in ("metric", "n") + COLUMNS)
    rows = "".join(
        f"<tr><td>{label}</td><td>{summary[key]['count']}</td>" +
        "".join(f"<td>{format_s(summary[key].get(c))}</td>" for c in COLUMNS) + "</tr>"
        for label, key in LATENCIES)
    return f"<table><tr>{head}</tr>{rows}</table>"


def _phase_table(phases: list[dict]) -> str:
    head = "".join(f"<th>{c}</th>" for c in ("phase", "span", "offered/s", "requests", "failed",
                                               "TTFT P50", "TTFT P99", "TPOT P50", "E2E P99",
                                               "req/s", "tok/s"))
    rows = "".join(
        f"<tr><td>{escape(p['name'])}</td><td>{p['start_s']:.0f}-{p['end_s']:.0f}s</td>"
        f"<td>{p['offered_rate_per_s']:.1f}</td><td>{p['counts']['requests']}</td>"
        f"<td>{p['counts']['failed']}</td><td>{format_s(p['ttft_s'].get('p50'))}</td>"
        f"<td>{format_s(p['ttft_s'].get('p99'))}</td><td>{format_s(p['tpot_s'].get('p50'))}</td>"
        f"<td>{format_s(p['e2e_s'].get('p99'))}</td><td>{p['throughput']['requests_per_s']:.1f}</td>"
        f"<td>{p['throughput']['output_tokens_per_s']:.0f}</td></tr>" for p in phases)
    return f"<table><tr>{head}</tr>{rows}</table>"


def render_html(result: dict) -> str:
    s = result["summary"]
    t, c = s["throughput"], s["counts"]
    parts = [f"<h1>tally bench: {escape(result['server']['model'])} at "
             f"{escape(result['server']['url'])}</h1>",
             f"<p>{escape(result['started_at'])} — <code>{escape(' '.join(result['command']))}</code></p>"]
    if result.get("partial"):
        parts.append(f'<p class="flag" data-partial="{escape(result["stopped"]["reason"])}">'
                     f'<b>PARTIAL REPORT</b> {escape(partial_line(result["stopped"]))}</p>')
    cancelled = f", {c['cancelled']} cancelled (in flight at the stop)" if c.get("cancelled") else ""
    causes = f" ({causes_words(s['errors'])})" if s["errors"] else ""
    parts += ["<h2>Latency (successful requests)</h2>", _latency_table(s),
              (f"<p>Throughput: {t['requests_per_s']:.2f} req/s, {t['output_tokens_per_s']:.1f} output "
               f"tok/s over a {s['window_s']:.1f} s window. Requests: {c['requests']} measured, "
               f"{c['ok']} ok, {c['failed']} failed{escape(causes)}{cancelled}.</p>")]
    if "goodput" in s:
        g = s["goodput"]
        parts.append(f"<p>Goodput under {escape(slo_words(g['slo']))}: {g['requests_per_s']:.2f} "
                     f"req/s ({g['fraction']:.1%} of requests met every SLO).</p>")
    parts += [f'<p class="warn">warning: {escape(w)}</p>' for w in result["warnings"]]
    if len(result["phases"]) > 1:
        parts += ["<h2>Per phase</h2>", _phase_table(result["phases"])]
    if result.get("soak"):
        soak = result["soak"]
        parts.append(f"<h2>Soak verdict: {escape(soak['verdict'])}</h2>")
        parts += [f'<p class="flag">FLAG: {escape(f)}</p>' for f in soak["flags"]]
    context = {key: result[key] for key in ("server", "workload", "server_metrics")}
    parts += ["<h2>Plots</h2>", "<div>", *(render(chart) for chart in _charts(result)), "</div>",
              "<h2>Definitions</h2><dl>",
              *(f"<dt><b>{escape(k)}</b></dt><dd>{escape(v)}</dd>"
                for k, v in result["definitions"].items()),
              "</dl><h2>Server and workload</h2>",
              f"<pre>{escape(json.dumps(context, indent=1))}</pre>"]
    return ("<!DOCTYPE html><html><head><meta charset=\"utf-8\"><title>tally bench report</title>"
            f"<style>{_CSS}</style></head><body>{''.join(parts)}</body></html>")


def write_html(result: dict, path: Path) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(render_html(result), encoding="utf-8")
