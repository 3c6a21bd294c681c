"""`tally alerts`: Prometheus alerting rules with thresholds from a measured baseline run."""
from __future__ import annotations

import argparse
import sys

from tally.errors import TallyError
from tally.flags import METRICS_PREFIX, OUT, WINDOW, parser
from tally.metric_names import METRICS_PREFIXES
from tally.ops.alerts import rules_file
from tally.units import parse_duration_s


def build_parser() -> argparse.ArgumentParser:
    p = parser("tally alerts", __doc__)
    p.add_argument("--baseline", required=True, help="a `tally bench --out` result of a healthy run, or a running "
                   "server's URL (its /metrics is read over --baseline-window)")
    p.add_argument("--baseline-window", default="5m", help="how long to watch a live server")
    OUT.add(p, note=": the rules file (default: stdout)")
    WINDOW.add(p)
    p.add_argument("--for", dest="for_s", default="5m", help="how long a condition holds before the alert fires")
    METRICS_PREFIX.add(p, note=" (vllm for a vLLM server)")
    return p


def main(argv: list[str]) -> int:
    ns = build_parser().parse_args(argv)
    try:
        made = rules_file(ns.baseline, METRICS_PREFIXES[ns.metrics_prefix], ns.window, ns.for_s,
                          parse_duration_s(ns.baseline_window, "--baseline-window"), log=_say)
    except TallyError as exc:
        print(f"tally alerts: {exc.message}", file=sys.stderr)
        return 2
    for warning in made.warnings:
        _say(f"WARNING: the baseline looks saturated: {warning}. Its thresholds would call that normal; measure "
             "again at a load the server keeps up with")
    if ns.out is None:
        sys.stdout.write(made.text)
    else:
        ns.out.write_text(made.text)
    _say(f"wrote {made.summary} to {ns.out or 'stdout'}")
    return 0


def _say(line: str) -> None:
    """Progress and the closing summary go to stderr: stdout may be the rules file itself."""
    print(f"tally alerts: {line}", file=sys.stderr, flush=True)
