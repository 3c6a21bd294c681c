"""`tally dashboards`: a Grafana dashboard of what users feel and where the server is headed, and the Prometheus
recording rules behind its percentiles.

Built with Grafana's own builder library (grafana-foundation-sdk: typed builders for every panel, kept in step
with Grafana by Grafana Labs) instead of hand-written JSON. Every panel is one or more PromQL expressions over
`{prefix}` metrics, so `--prefix vllm:` draws a vLLM server the same way (Tally's metric names follow vLLM's).
"""
from __future__ import annotations

import json
from dataclasses import dataclass

import yaml
from grafana_foundation_sdk.builders import dashboard, prometheus, timeseries
from grafana_foundation_sdk.cog.encoder import JSONEncoder

LATENCIES = (("TTFT", "time_to_first_token_seconds"), ("TPOT", "request_time_per_output_token_seconds"),
             ("ITL", "inter_token_latency_seconds"), ("E2E", "e2e_request_latency_seconds"),
             ("Queue time", "request_queue_time_seconds"))
QUANTILES = (0.5, 0.95, 0.99)
BY = "model_name, endpoint"


@dataclass(frozen=True)
class Panel:
    title: str
    unit: str
    queries: tuple[tuple[str, str], ...]  # (PromQL, legend)


def _recorded(prefix: str, name: str, q: float, window: str) -> str:
    return f"{prefix}{name.lower().replace(' ', '_')}_seconds:p{q * 100:g}_{window}"


def recording_rules(prefix: str = "tally:", window: str = "5m") -> list[dict]:
    """One series per latency and quantile, by model and endpoint: `<prefix>ttft_seconds:p99_5m` and so on."""
    return [{"record": _recorded(prefix, name, q, window),
             "expr": f"histogram_quantile({q}, sum by (le, {BY}) (rate({prefix}{histogram}_bucket[{window}])))"}
            for name, histogram in LATENCIES for q in QUANTILES]


def panels(prefix: str = "tally:", window: str = "5m") -> list[Panel]:
    p, w = prefix, window
    out = [Panel(f"{name} P50 / P95 / P99", "s",
                 tuple((_recorded(p, name, q, w), f"p{q * 100:g} {{{{model_name}}}} {{{{endpoint}}}}")
                       for q in QUANTILES))
           for name, _ in LATENCIES]
    out += [
        Panel("Tokens per second", "short", (
            (f"sum by ({BY}) (rate({p}generation_tokens_total[{w}]))", "generated {{model_name}} {{endpoint}}"),
            (f"sum by ({BY}) (rate({p}prompt_tokens_total[{w}]))", "prompt {{model_name}} {{endpoint}}"))),
        Panel("Requests running and waiting", "short", (
            (f"sum by (model_name) ({p}num_requests_running)", "running {{model_name}}"),
            (f"sum by (model_name) ({p}num_requests_waiting)", "waiting {{model_name}}"))),
        Panel("KV cache usage and fragmentation", "percentunit", (
            (f"max by (model_name) ({p}kv_cache_usage_perc)", "usage {{model_name}}"),
            (f"max by (model_name) ({p}kv_cache_fragmentation_perc)", "fragmentation {{model_name}}"))),
        Panel("Prefix cache hit rate", "percentunit", (
            (f"sum by (model_name) (rate({p}prefix_cache_hits_total[{w}])) / "
             f"clamp_min(sum by (model_name) (rate({p}prefix_cache_queries_total[{w}])), 1e-9)", "{{model_name}}"),)),
        Panel("Preemptions per second", "short", (
            (f"sum by (model_name) (rate({p}num_preemptions_total[{w}]))", "{{model_name}}"),)),
        Panel("Rejections, timeouts and errors per second", "short", (
            (f"sum by (reason) (rate({p}request_rejected_total[{w}]))", "rejected: {{reason}}"),
            (f"sum(rate({p}request_timeout_total[{w}]))", "timeout"),
            (f"sum by (code) (rate({p}request_error_total[{w}]))", "error {{code}}"))),
        Panel("Finished requests per second, by finish reason", "short", (
            (f"sum by (finished_reason) (rate({p}request_success_total[{w}]))", "{{finished_reason}}"),)),
        Panel("Prompt and output tokens per request (mean)", "short", (
            (f"sum(rate({p}request_prompt_tokens_sum[{w}])) / clamp_min(sum(rate({p}request_prompt_tokens_count"
             f"[{w}])), 1e-9)", "prompt"),
            (f"sum(rate({p}request_generation_tokens_sum[{w}])) / clamp_min(sum(rate("
             f"{p}request_generation_tokens_count[{w}])), 1e-9)", "output"))),
        # Speculative decoding (series exist only on servers started with --speculative-config).
        Panel("Speculative decoding: acceptance rate", "percentunit", (
            (f"sum by (model_name) (rate({p}spec_decode_num_accepted_tokens_total[{w}])) / clamp_min(sum by "
             f"(model_name) (rate({p}spec_decode_num_draft_tokens_total[{w}])), 1e-9)", "{{model_name}}"),)),
        Panel("Speculative decoding: accepted tokens per second, by position", "short", (
            (f"sum by (position) (rate({p}spec_decode_num_accepted_tokens_per_pos_total[{w}]))",
             "position {{position}}"),)),
        Panel("Speculative decoding: proposals verified per speculating request", "short", (
            (f"max by (model_name) ({p}spec_decode_num_speculative_tokens)", "{{model_name}}"),)),
    ]
    return out


def dashboard_json(prefix: str = "tally:", window: str = "5m") -> str:
    board = dashboard.Dashboard("Tally: what users feel").uid(f"tally-{prefix.rstrip(':')}").tags(
        ["tally", "llm-serving"]).refresh("10s").time("now-1h", "now")
    for panel in panels(prefix, window):
        ts = timeseries.Panel().title(panel.title).unit(panel.unit).height(8).span(12)
        for ref, (expr, legend) in zip("ABCDEFGHIJ", panel.queries):
            ts = ts.with_target(prometheus.Dataquery().expr(expr).legend_format(legend).ref_id(ref))
        board = board.with_panel(ts)
    return json.dumps(board.build(), cls=JSONEncoder, indent=2)


def rules_yaml(prefix: str = "tally:", window: str = "5m") -> str:
    return yaml.safe_dump({"groups": [{"name": "tally-recording", "rules": recording_rules(prefix, window)}]},
                          sort_keys=False, width=1000)


def expressions(dashboard_text: str) -> list[str]:
    """Every PromQL expression of a dashboard's panels (the tests evaluate each one)."""
    return [t["expr"] for panel in json.loads(dashboard_text)["panels"] for t in panel.get("targets", [])]
