"""`tally dashboards --out DIR`: a Grafana dashboard (DIR/tally-dashboard.json) and the Prometheus recording rules
its latency panels read (DIR/tally-recording-rules.yml)."""
from __future__ import annotations

import argparse
from pathlib import Path

from tally.ops.dashboards import dashboard_json, rules_yaml

DASHBOARD_FILE, RULES_FILE = "tally-dashboard.json", "tally-recording-rules.yml"


def main(argv: list[str]) -> int:
    p = argparse.ArgumentParser(prog="tally dashboards", description=__doc__)
    p.add_argument("--out", type=Path, required=True, help="directory to write both files to")
    p.add_argument("--prefix", default="tally:", help="metric name prefix (vllm: for a vLLM server)")
    p.add_argument("--window", default="5m", help="range of the rates and quantiles (Prometheus duration)")
    ns = p.parse_args(argv)
    ns.out.mkdir(parents=True, exist_ok=True)
    (ns.out / DASHBOARD_FILE).write_text(dashboard_json(ns.prefix, ns.window))
    (ns.out / RULES_FILE).write_text(rules_yaml(ns.prefix, ns.window))
    print(f"wrote {ns.out / DASHBOARD_FILE} (import it in Grafana) and {ns.out / RULES_FILE} (add it to "
          f"Prometheus' rule_files)")
    return 0
