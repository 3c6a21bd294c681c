"""The terminal report: one table of latency percentiles, then throughput, goodput, failures by
cause, per-phase rows, the server's own view, the soak verdict, warnings, and the definitions.
A partial run (stopped early) says so on its first line."""
from __future__ import annotations

from rich.console import Console
from rich.table import Table

from tally.bench.report_json import partial_line
from tally.bench.wording import causes_words, slo_words
from tally.units import format_s

LATENCIES = (("TTFT", "ttft_s"), ("TPOT", "tpot_s"), ("ITL", "itl_s"), ("E2E", "e2e_s"),
             ("Lateness", "lateness_s"))
COLUMNS = ("mean", "p50", "p90", "p95", "p99", "p99.9")


def latency_table(summary: dict, title: str) -> Table:
    table = Table(title=title, title_justify="left")
    table.add_column("metric")
    table.add_column("n", justify="right")
    for column in COLUMNS:
        table.add_column(column.upper(), justify="right")
    for label, key in LATENCIES:
        dist = summary[key]
        table.add_row(label, str(dist["count"]), *(format_s(dist.get(c)) for c in COLUMNS))
    return table


def phase_table(phases: list[dict]) -> Table:
    table = Table(title="per phase (latency by scheduled time; throughput by finish time)",
                  title_justify="left")
    for column in ("phase", "span", "offered/s", "requests", "failed", "TTFT P50", "TTFT P99",
                   "TPOT P50", "E2E P99", "req/s", "tok/s"):
        table.add_column(column, justify="left" if column == "phase" else "right")
    for p in phases:
        table.add_row(p["name"], f"{p['start_s']:.0f}-{p['end_s']:.0f}s",
                      f"{p['offered_rate_per_s']:.1f}", str(p["counts"]["requests"]),
                      str(p["counts"]["failed"]), format_s(p["ttft_s"].get("p50")),
                      format_s(p["ttft_s"].get("p99")), format_s(p["tpot_s"].get("p50")),
                      format_s(p["e2e_s"].get("p99")), f"{p['throughput']['requests_per_s']:.1f}",
                      f"{p['throughput']['output_tokens_per_s']:.0f}")
    return table


def print_report(result: dict, console: Console | None = None) -> None:
    if console is None:
        console = Console()
        if not console.is_terminal:  # files and pipes get full-width tables, not 80 columns
            console = Console(width=140)
    s, server, wl = result["summary"], result["server"], result["workload"]
    if result.get("partial"):
        console.print(f"[bold red]PARTIAL REPORT[/] {partial_line(result['stopped'])}", highlight=False)
    console.print(f"[bold]tally bench[/] {server['url']}  model {server['model']}  "
                  f"endpoint {server['endpoint']}  tokenizer: {server['tokenizer']}")
    console.print(f"workload: lengths {wl['lengths']['kind']}, arrivals {wl['arrivals']['kind']}, "
                  f"seed {wl['seed']}, warmup {wl['warmup_s']:g}s; measured window "
                  f"{s['window_s']:.1f}s")
    console.print(latency_table(s, "latency (successful requests)"))
    t = s["throughput"]
    console.print(f"throughput: {t['requests_per_s']:.2f} req/s, {t['output_tokens_per_s']:.1f} "
                  f"output tok/s, {t['prompt_tokens_per_s']:.1f} prompt tok/s")
    if "goodput" in s:
        g = s["goodput"]
        console.print(f"goodput under {slo_words(g['slo'])}: {g['requests_per_s']:.2f} req/s "
                      f"({g['met']}/{s['counts']['requests'] - s['counts'].get('cancelled', 0)} = "
                      f"{g['fraction']:.1%} met every SLO)")
    c = s["counts"]
    cancelled = f", {c['cancelled']} cancelled (in flight at the stop)" if c.get("cancelled") else ""
    causes = f" ({causes_words(s['errors'])})" if s["errors"] else ""
    console.print(f"requests: {c['requests']} measured, {c['ok']} ok, {c['failed']} failed{causes}{cancelled}",
                  highlight=False)
    if len(result["phases"]) > 1:
        console.print(phase_table(result["phases"]))
    for key, dist in (result.get("server_metrics") or {}).items():
        if dist:
            console.print(f"server {key}: mean {format_s(dist['mean'])}, P50 ~{format_s(dist.get('p50'))}, "
                          f"P99 ~{format_s(dist.get('p99'))} (from /metrics histogram, n={dist['count']})")
    spec = result.get("speculative_decoding")
    if spec and spec["draft_tokens"]:
        console.print(f"speculative decoding: {spec['accepted_tokens']:,} of {spec['draft_tokens']:,} proposed tokens "
                      f"accepted ({spec['acceptance_rate']:.1%}), {spec['accepted_per_draft']:.2f} per proposal")
    if result.get("soak"):
        soak = result["soak"]
        console.print(f"[bold]soak verdict:[/] {soak['verdict']}")
        for name, fit in soak["series"].items():
            console.print(f"  {name}: {fit['start']:.4g} -> {fit['end']:.4g}, "
                          f"{fit['slope_per_h']:+.4g}/h, r²={fit['r2']:.2f}")
        for flag in soak["flags"]:
            console.print(f"  [red]FLAG[/] {flag}")
    for warning in result["warnings"]:
        console.print(f"[yellow]warning:[/] {warning}")
    console.print("definitions:")
    for word, meaning in result["definitions"].items():
        console.print(f"  {word}: {meaning}", highlight=False)
