"""`tally route`: one address in front of several OpenAI-compatible replicas (tally/ops/router.py), optionally
rolling out a canary step by step under rollback rules (tally/ops/canary.py)."""
from __future__ import annotations

import argparse
from pathlib import Path

import uvicorn

from tally.errors import ConfigError
from tally.flags import HOST, LOG_LEVEL, PORT, REQUEST_TIMEOUT, parser
from tally.ops.canary import DEFAULT_EVAL_INTERVAL_S, CanaryConfig
from tally.ops.router import RouterConfig, build_router_app
from tally.units import parse_duration_s

CANARY_FLAGS = ("plan", "rules", "eval_interval", "audit_log", "sticky_header")


def build_parser() -> argparse.ArgumentParser:
    p = parser("tally route", __doc__)
    p.add_argument("--replica", action="append", required=True, metavar="URL",
                   help="a replica's base URL, e.g. http://10.0.0.5:8000 (repeat for each)")
    HOST.add(p)
    PORT.add(p, default=8080, note=" (8080, beside the replicas' 8000)")
    p.add_argument("--health-interval", type=float, default=1.0, help="seconds between health checks")
    REQUEST_TIMEOUT.add(p, default=600.0, note="; the router gives its replica up")
    LOG_LEVEL.add(p, default="warning")
    canary = p.add_argument_group("canary release (docs/operations.md)")
    canary.add_argument("--canary", action="append", metavar="URL",
                        help="the new version's base URL (repeat for several); the --replica ones are the stable")
    canary.add_argument("--plan", help="canary weights and how long each must hold, e.g. 5%%:2h,20%%:2h,50%%:2h,100%%")
    canary.add_argument("--rules", type=Path, help="the rollback rules (YAML); required with --canary")
    canary.add_argument("--eval-interval", help="how often the rules are judged, e.g. 5s (default) or 500ms")
    canary.add_argument("--audit-log", type=Path, help="append every canary decision here as a JSON line")
    canary.add_argument("--sticky-header", metavar="NAME",
                        help="requests with the same value of this header (e.g. X-Session-Id) stay on one side")
    return p


def main(argv: list[str]) -> int:
    p = build_parser()
    ns = p.parse_args(argv)
    if ns.health_interval <= 0:
        p.error("--health-interval must be > 0 seconds")
    canary_config = None
    if ns.canary:
        overlap = sorted({u.rstrip("/") for u in ns.canary} & {u.rstrip("/") for u in ns.replica})
        if overlap:
            p.error(f"{overlap[0]} is both a --replica (stable) and a --canary; give it as one of them")
        try:
            eval_interval_s = parse_duration_s(ns.eval_interval, "--eval-interval") if ns.eval_interval \
                else DEFAULT_EVAL_INTERVAL_S
            canary_config = CanaryConfig.from_args(ns.canary, ns.plan, ns.rules, eval_interval_s, ns.audit_log,
                                                   ns.sticky_header)
        except ConfigError as e:
            p.error(e.message)
    elif any(getattr(ns, name) is not None for name in CANARY_FLAGS):
        p.error("--plan, --rules, --eval-interval, --audit-log and --sticky-header go with --canary URL")
    app = build_router_app(RouterConfig(ns.replica, ns.health_interval, ns.request_timeout, canary_config))
    uvicorn.run(app, host=ns.host, port=ns.port, log_level=ns.log_level)
    return 0
