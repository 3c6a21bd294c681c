"""`tally alerts`: Prometheus alerting rules with thresholds from a measured baseline run."""
from __future__ import annotations

import argparse
import sys
from pathlib import Path

from tally.errors import TallyError
from tally.ops.alerts import rules_file
from tally.units import parse_duration_s


def main(argv: list[str]) -> int:
    p = argparse.ArgumentParser(prog="tally alerts", description=__doc__)
    p.add_argument("--baseline", required=True, help="a `tally bench --out` result of a healthy run, or a running "
                   "server's URL (its /metrics is read over --baseline-window)")
    p.add_argument("--baseline-window", default="5m", help="how long to watch a live server (default 5m)")
    p.add_argument("--out", type=Path, help="rules file to write (default: stdout)")
    p.add_argument("--window", default="5m", help="range each rate and quantile covers (Prometheus duration)")
    p.add_argument("--for", dest="for_s", default="5m", help="how long a condition holds before the alert fires")
    p.add_argument("--prefix", default="tally:", help="metric name prefix (vllm: for a vLLM server)")
    ns = p.parse_args(argv)
    try:
        text = rules_file(ns.baseline, ns.prefix, ns.window, ns.for_s,
                          parse_duration_s(ns.baseline_window, "--baseline-window"))
    except TallyError as exc:
        print(f"tally alerts: {exc.message}", file=sys.stderr)
        return 2
    if ns.out is None:
        sys.stdout.write(text)
    else:
        ns.out.write_text(text)
    return 0
