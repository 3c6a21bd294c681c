"""`tally route`: one address in front of several OpenAI-compatible replicas (tally/ops/router.py), optionally
in two length pools (tally/ops/route_pools.py) and rolling out a canary step by step under rollback rules
(tally/ops/canary.py)."""
from __future__ import annotations

import argparse
import logging
from pathlib import Path

import uvicorn

from tally.errors import ConfigError
from tally.flags import (
    HEADER_TIMEOUT,
    HOST,
    LOG_LEVEL,
    MAX_BODY_BYTES,
    MAX_CONNECTIONS,
    PORT,
    REQUEST_TIMEOUT,
    parser,
)
from tally.http_limits import BODY_TIMEOUT_S, guarded_protocol
from tally.ops.canary import DEFAULT_EVAL_INTERVAL_S, CanaryConfig
from tally.ops.route_limits import RouteLimits
from tally.ops.route_pools import PoolsConfig
from tally.ops.router import RouterConfig, build_router_app
from tally.units import fmt_small_bytes, parse_duration_s

log = logging.getLogger("tally.route")

CANARY_FLAGS = ("plan", "rules", "eval_interval", "audit_log", "sticky_header", "canary_pool")


def build_parser() -> argparse.ArgumentParser:
    p = parser("tally route", __doc__)
    p.add_argument("--replica", action="append", metavar="URL",
                   help="a replica's base URL, e.g. http://10.0.0.5:8000 (repeat for each); they form the pool main")
    pools = p.add_argument_group("length pools (docs/operations.md)")
    pools.add_argument("--pool", action="append", metavar="NAME=URL[,URL...]",
                       help="a pool of replicas, e.g. long=http://10.0.0.7:8000 (repeat for each pool)")
    pools.add_argument("--long-pool", metavar="NAME",
                       help="the pool for requests whose prompt + max_tokens exceed --long-threshold")
    pools.add_argument("--long-threshold", metavar="TOKENS|PLAN",
                       help="tokens, or a `tally plan --lengths ... --out` file (its main pool's max_model_len); "
                            "default: the main pool's max_model_len, read from its replicas")
    HOST.add(p)
    PORT.add(p, default=8080, note=" (8080, beside the replicas' 8000)")
    p.add_argument("--health-interval", type=float, default=1.0, help="seconds between health checks")
    REQUEST_TIMEOUT.add(p, default=600.0, note=", from its arrival to its last byte: a stream cut at it ends with an "
                                               "error event and [DONE]")
    limits = p.add_argument_group("client limits, as tally serve's")
    MAX_BODY_BYTES.add(limits)
    limits.add_argument("--body-timeout", type=float, default=BODY_TIMEOUT_S,
                        help="seconds a request's body may take to arrive; a slower one gets 408")
    HEADER_TIMEOUT.add(limits)
    MAX_CONNECTIONS.add(limits)
    LOG_LEVEL.add(p, note="; debug adds a line per request")
    canary = p.add_argument_group("canary release (docs/operations.md)")
    canary.add_argument("--canary", action="append", metavar="URL",
                        help="the new version's base URL (repeat for several); the --replica ones are the stable")
    canary.add_argument("--plan", help="canary weights and how long each must hold, e.g. 5%%:2h,20%%:2h,50%%:2h,100%%")
    canary.add_argument("--rules", type=Path, help="the rollback rules (YAML); required with --canary")
    canary.add_argument("--eval-interval", help="how often the rules are judged, e.g. 5s (default) or 500ms")
    canary.add_argument("--audit-log", type=Path, help="append every canary decision here as a JSON line")
    canary.add_argument("--sticky-header", metavar="NAME",
                        help="requests with the same value of this header (e.g. X-Session-Id) stay on one side")
    canary.add_argument("--canary-pool", metavar="NAME", help="the pool the canary joins and is judged in (default: "
                                                              "the main one); other pools' requests never reach it")
    return p


def main(argv: list[str]) -> int:
    p = build_parser()
    ns = p.parse_args(argv)
    for flag in ("health_interval", "request_timeout", "body_timeout", "header_timeout"):
        if getattr(ns, flag) <= 0:
            p.error(f"--{flag.replace('_', '-')} must be > 0 seconds")
    if ns.max_connections < 1 or ns.max_body_bytes < 1:
        p.error("--max-connections and --max-body-bytes must be ≥ 1")
    try:
        pools = PoolsConfig.from_args(ns.replica, ns.pool, ns.long_pool, ns.long_threshold)
    except ConfigError as e:
        p.error(e.message)
    canary_config = None
    if ns.canary:
        overlap = sorted({u.rstrip("/") for u in ns.canary} & {u for _, urls in pools.pools for u in urls})
        if overlap:
            p.error(f"{overlap[0]} is both a --replica (stable, or in a --pool) and a --canary; give it as one of "
                    "them")
        if ns.canary_pool is not None and ns.canary_pool not in dict(pools.pools):
            p.error(f"--canary-pool {ns.canary_pool}: no such pool; the pools are {', '.join(dict(pools.pools))}")
        try:
            eval_interval_s = parse_duration_s(ns.eval_interval, "--eval-interval") if ns.eval_interval \
                else DEFAULT_EVAL_INTERVAL_S
            canary_config = CanaryConfig.from_args(ns.canary, ns.plan, ns.rules, eval_interval_s, ns.audit_log,
                                                   ns.sticky_header)
        except ConfigError as e:
            p.error(e.message)
    elif any(getattr(ns, name) is not None for name in CANARY_FLAGS):
        p.error("--plan, --rules, --eval-interval, --audit-log, --sticky-header and --canary-pool go with --canary "
                "URL")
    limits = RouteLimits(ns.max_body_bytes, ns.body_timeout, ns.request_timeout, ns.header_timeout,
                         ns.max_connections)
    logging.basicConfig(level=ns.log_level.upper(), format="%(asctime)s %(name)s %(levelname)s %(message)s")
    if ns.log_level != "debug":  # a line per health check and per request otherwise
        logging.getLogger("httpx").setLevel(logging.WARNING)
    log.info("tally route on http://%s:%d in front of %s; %s", ns.host, ns.port,
             ", ".join(pools.pools[0][1]) if len(pools.pools) == 1 else
             "; ".join(f"pool {name}: {', '.join(urls)}" for name, urls in pools.pools),
             f"canary {', '.join(ns.canary)} (its plan and rules follow)" if ns.canary else "no canary")
    if pools.long_pool is not None:
        log.info("requests above %s tokens (prompt + max_tokens) go to pool %s, the others to %s",
                 pools.long_threshold_tokens or "the main pool's max_model_len", pools.long_pool, pools.main_pool)
    log.info("limits: a body of at most %s within %g s, headers within %g s, each request whole within %g s, %d "
             "connections", fmt_small_bytes(limits.max_body_bytes), limits.body_timeout_s, limits.header_timeout_s,
             limits.request_timeout_s, limits.max_connections)
    app = build_router_app(RouterConfig(pools, ns.health_interval, canary_config, limits, ns.canary_pool))
    uvicorn.run(app, host=ns.host, port=ns.port, log_level=ns.log_level, access_log=ns.log_level == "debug",
                http=guarded_protocol(limits.max_connections, limits.header_timeout_s))
    return 0
