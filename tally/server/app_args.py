"""The app a `tally serve` command line describes: its engine and its ServerConfig. One function, so the single
process (tally/server/cli.py) and each Ray Serve replica (tally/deploy/ray_server.py) build the same server."""
from __future__ import annotations

import argparse
import logging

from fastapi import FastAPI

from tally.engine.args import config_from_args
from tally.engine.load_engine import load_engine
from tally.server.allowed_hosts import AllowedHosts
from tally.server.app import ServerConfig, build_app
from tally.server.request_log import RequestLog, redaction_hook

log = logging.getLogger("tally.server")
LOOPBACK_NAMES = ("localhost", "127.0.0.1", "::1")


def allowed_hosts(flag: str | None, bind_host: str) -> tuple[str, ...]:
    if flag is not None:
        return tuple(h.strip() for h in flag.split(",") if h.strip())
    if bind_host in ("127.0.0.1", "localhost", "::1"):
        return LOOPBACK_NAMES
    return ("*",)


def app_from_args(ns: argparse.Namespace) -> FastAPI:
    """Loads the engine `ns` names and wraps it in the OpenAI app; raises TallyError with what to fix."""
    request_log = None if ns.request_log is None else RequestLog(
        ns.request_log, ns.request_log_max_bytes, ns.log_prompts, redaction_hook(ns.redact))
    hosts = allowed_hosts(ns.allowed_hosts, ns.host)
    for warning in AllowedHosts(hosts).start_warnings(ns.port):
        log.warning(warning)
    engine = load_engine(config_from_args(ns))
    return build_app(engine, ServerConfig(max_queue=ns.max_queue, request_timeout_s=ns.request_timeout,
                                          max_queue_delay_s=ns.max_queue_delay, max_body_bytes=ns.max_body_bytes,
                                          restart_on_failure=ns.restart_on_failure,
                                          allowed_hosts=hosts,
                                          request_log=request_log, api_key=ns.api_key,
                                          tool_call_parser=ns.tool_call_parser if ns.enable_auto_tool_choice
                                          else None, chat_template=ns.chat_template,
                                          trust_request_chat_template=ns.trust_request_chat_template,
                                          reasoning_parser=ns.reasoning_parser,
                                          metrics_prefix=ns.metrics_prefix,
                                          responses_store_size=ns.responses_store_size))
