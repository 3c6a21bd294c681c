"""`tally dashboards --out DIR`: a Grafana dashboard (DIR/tally-dashboard.json) and the Prometheus recording rules
its latency panels read (DIR/tally-recording-rules.yml)."""
from __future__ import annotations

import argparse

from tally.flags import METRICS_PREFIX, OUT, WINDOW, parser
from tally.metric_names import METRICS_PREFIXES
from tally.ops.dashboards import dashboard_json, rules_yaml

DASHBOARD_FILE, RULES_FILE = "tally-dashboard.json", "tally-recording-rules.yml"


def build_parser() -> argparse.ArgumentParser:
    p = parser("tally dashboards", __doc__)
    OUT.add(p, required=True, note=": the folder both files go to")
    METRICS_PREFIX.add(p, note=" (vllm for a vLLM server)")
    WINDOW.add(p)
    return p


def main(argv: list[str]) -> int:
    ns = build_parser().parse_args(argv)
    prefix = METRICS_PREFIXES[ns.metrics_prefix]
    ns.out.mkdir(parents=True, exist_ok=True)
    (ns.out / DASHBOARD_FILE).write_text(dashboard_json(prefix, ns.window))
    (ns.out / RULES_FILE).write_text(rules_yaml(prefix, ns.window))
    print(f"wrote {ns.out / DASHBOARD_FILE} (import it in Grafana) and {ns.out / RULES_FILE} (add it to "
          f"Prometheus' rule_files)")
    return 0
