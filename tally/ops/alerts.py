"""Prometheus alerting rules whose thresholds come from a measured baseline, not from a guess.

Each latency rule fires when a P99 over the window exceeds the baseline run's P99 × the signal's factor; the early
signals fire before latency does (requests waiting, KV cache nearly full, rejections, timeouts, a drop in output
length — a model that truncates looks fast). Every rule carries its baseline figure and factor as annotations,
so whoever is paged sees what "normal" was. The baseline is a `tally bench --out` result (tally/bench), or a
window of a live server's /metrics (tally/ops/live_baseline.py), and must not itself be an overload
(tally/ops/saturation.py).
"""
from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import yaml

from tally.bench.report_json import load_result
from tally.errors import ConfigError
from tally.ops.live_baseline import clock, live_baseline
from tally.ops.saturation import saturation
from tally.units import format_s

# Per signal: how far past the baseline it may go before anyone is told.
LATENCY_FACTOR = 1.5
QUEUE_FACTOR = 2.0
OUTPUT_DROP_FACTOR = 0.8  # mean output tokens below 0.8 × the baseline's
KV_USAGE_LIMIT = 0.95
ERROR_RATIO_FLOOR = 0.005  # 5xx per finished request, at least half a percent before paging


@dataclass(frozen=True)
class Rule:
    name: str
    expr: str
    severity: str  # page | warn
    summary: str
    baseline: str  # the figure the threshold came from, for the person paged

    def to_dict(self, for_s: str, source: str) -> dict:
        return {"alert": self.name, "expr": self.expr, "for": for_s, "labels": {"severity": self.severity},
                "annotations": {"summary": self.summary, "baseline": self.baseline, "baseline_run": source}}


def _quantile(prefix: str, histogram: str, window: str) -> str:
    return f"histogram_quantile(0.99, sum by (le) (rate({prefix}{histogram}_bucket[{window}])))"


def baseline_rules(result: dict, prefix: str = "tally:", window: str = "5m") -> list[Rule]:
    summary = result["summary"]
    rules = []
    for key, histogram, what in (("ttft_s", "time_to_first_token_seconds", "TTFT"),
                                 ("tpot_s", "request_time_per_output_token_seconds", "TPOT"),
                                 ("itl_s", "inter_token_latency_seconds", "ITL"),
                                 ("e2e_s", "e2e_request_latency_seconds", "E2E latency")):
        p99 = summary.get(key, {}).get("p99")
        if p99 is None:
            continue
        limit = LATENCY_FACTOR * p99
        rules.append(Rule(f"Tally{what.split()[0].upper()}P99High",
                          f"{_quantile(prefix, histogram, window)} > {limit:.6g}", "page",
                          f"{what} P99 over {window} above {limit:.3g} s",
                          f"{what} P99 {p99:.4g} s × {LATENCY_FACTOR}"))
    queue = (result.get("server_metrics") or {}).get("queue_time_s") or {}
    if queue.get("p99") is not None:
        limit = max(QUEUE_FACTOR * queue["p99"], 0.05)
        rules.append(Rule("TallyQueueTimeP99High",
                          f"{_quantile(prefix, 'request_queue_time_seconds', window)} > {limit:.6g}", "warn",
                          f"queue time P99 over {window} above {limit:.3g} s (requests wait for a batch slot)",
                          f"queue time P99 {queue['p99']:.4g} s × {QUEUE_FACTOR} (at least 50 ms)"))
    waiting = [s["waiting"] for s in ((result.get("soak") or {}).get("samples") or []) if s.get("waiting") is not None]
    base_waiting = max(waiting, default=0.0)
    limit = max(QUEUE_FACTOR * base_waiting, 1.0)
    rules.append(Rule("TallyRequestsWaiting", f"max_over_time({prefix}num_requests_waiting[{window}]) > {limit:.6g}",
                      "warn", f"more than {limit:g} requests waiting for a batch slot",
                      f"most waiting in the baseline {base_waiting:g} × {QUEUE_FACTOR} (at least 1)"))
    rules.append(Rule("TallyKVCacheNearlyFull",
                      f"max_over_time({prefix}kv_cache_usage_perc[{window}]) > {KV_USAGE_LIMIT}", "warn",
                      f"KV cache over {KV_USAGE_LIMIT:.0%} used: preemptions and queueing come next",
                      f"a fixed limit of {KV_USAGE_LIMIT:.0%}"))
    for name, counter, what in (("TallyRejecting", "request_rejected_total", "requests turned away (429/503)"),
                                ("TallyRequestTimeouts", "request_timeout_total", "requests past --request-timeout")):
        rules.append(Rule(name, f"sum(rate({prefix}{counter}[{window}])) > 0", "page", what, "none in a healthy run"))
    counts = summary["counts"]
    errors = sum(n for kind, n in summary.get("errors", {}).items() if kind.startswith("http_5"))
    base_ratio = errors / max(counts["requests"], 1)
    limit = max(2 * base_ratio, ERROR_RATIO_FLOOR)
    rules.append(Rule("TallyServerErrors",
                      f"sum(rate({prefix}request_error_total{{code=~\"5..\"}}[{window}])) / "
                      f"clamp_min(sum(rate({prefix}request_success_total[{window}])), 1e-9) > {limit:.6g}",
                      "page", f"5xx answers above {limit:.2%} of finished requests",
                      f"baseline 5xx share {base_ratio:.2%} × 2 (at least {ERROR_RATIO_FLOOR:.1%})"))
    mean_out = summary.get("output_tokens", {}).get("mean")
    if mean_out:
        limit = OUTPUT_DROP_FACTOR * mean_out
        rules.append(Rule("TallyOutputLengthDrop",
                          f"sum(rate({prefix}request_generation_tokens_sum[{window}])) / "
                          f"sum(rate({prefix}request_generation_tokens_count[{window}])) < {limit:.6g}", "warn",
                          f"mean output below {limit:.3g} tokens (answers truncated?)",
                          f"mean output {mean_out:.4g} tokens × {OUTPUT_DROP_FACTOR}"))
    return rules


@dataclass(frozen=True)
class RulesFile:
    text: str  # the YAML of a Prometheus rules file (`promtool check rules` accepts it)
    rules: int
    summary: str  # one line: what the thresholds came from
    warnings: tuple[str, ...]  # the baseline looked saturated (tally/ops/saturation.py), in the file's header too


def rules_file(baseline: Path | str, prefix: str = "tally:", window: str = "5m", for_s: str = "5m",
               baseline_window_s: float = 300.0, log: Callable[[str], None] = lambda line: None) -> RulesFile:
    """Rules from `baseline`: a bench result file, or a server's URL, scraped over `baseline_window_s` (`log` gets
    its progress). A baseline that was itself an overload is refused, or warned about (tally/ops/saturation.py)."""
    if str(baseline).startswith(("http://", "https://")):
        result = live_baseline(str(baseline), baseline_window_s, log=log)
        baseline = f"{baseline} /metrics over {clock(baseline_window_s)}"
    else:
        result = load_result(Path(baseline))
    if result.get("partial"):
        raise ConfigError(f"{baseline} is a partial run ({result['stopped']['reason']}); use a complete baseline")
    summary = result["summary"]
    found = saturation(summary, (result.get("server_metrics") or {}).get("queue_time_s"))
    if found.refusals:
        raise ConfigError(f"{baseline} is not a healthy baseline: {'; '.join(found.refusals)}. Thresholds from an "
                          "overloaded run would call the overload normal; measure again at a load the server keeps "
                          "up with (a lower --rate, or shorter --lengths)")
    rules = [r.to_dict(for_s, str(baseline)) for r in baseline_rules(result, prefix, window)]
    header = (f"# Alerting rules from the baseline run {baseline} (tally alerts).\n"
              f"# Factors: latency P99 × {LATENCY_FACTOR}, queue × {QUEUE_FACTOR}, output length × "
              f"{OUTPUT_DROP_FACTOR}, KV usage > {KV_USAGE_LIMIT}, 5xx share × 2 (floor {ERROR_RATIO_FLOOR}).\n")
    header += "".join(f"# WARNING: the baseline looks saturated: {w}\n" for w in found.warnings)
    text = header + yaml.safe_dump({"groups": [{"name": "tally-baseline", "rules": rules}]}, sort_keys=False,
                                   allow_unicode=True, width=1000)
    return RulesFile(text, len(rules), f"{len(rules)} rules from {baseline} ({_figures(summary)})", found.warnings)


def _figures(summary: dict) -> str:
    """The baseline's headline figures, as the one-line summary shows them."""
    parts = [f"{summary['counts']['requests']} requests"]
    for key, what in (("ttft_s", "TTFT"), ("tpot_s", "TPOT")):
        p99 = (summary.get(key) or {}).get("p99")
        if p99 is not None:
            parts.append(f"{what} P99 {format_s(p99)}")
    return ", ".join(parts)
