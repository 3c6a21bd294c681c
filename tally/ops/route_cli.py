"""`tally route`: one address in front of several OpenAI-compatible replicas (tally/ops/router.py)."""
from __future__ import annotations

import argparse

import uvicorn

from tally.ops.router import RouterConfig, build_router_app


def main(argv: list[str]) -> int:
    p = argparse.ArgumentParser(prog="tally route", description=__doc__)
    p.add_argument("--replica", action="append", required=True, metavar="URL",
                   help="a replica's base URL, e.g. http://10.0.0.5:8000 (repeat for each)")
    p.add_argument("--host", default="127.0.0.1")
    p.add_argument("--port", type=int, default=8080)
    p.add_argument("--health-interval", type=float, default=1.0, help="seconds between health checks")
    p.add_argument("--request-timeout", type=float, default=600.0, help="seconds a replica may take")
    p.add_argument("--log-level", default="warning", choices=["debug", "info", "warning", "error"])
    ns = p.parse_args(argv)
    if ns.health_interval <= 0:
        p.error("--health-interval must be > 0 seconds")
    app = build_router_app(RouterConfig(ns.replica, ns.health_interval, ns.request_timeout))
    uvicorn.run(app, host=ns.host, port=ns.port, log_level=ns.log_level)
    return 0
