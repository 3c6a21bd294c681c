"""`tally serve`: load the engine, then serve the OpenAI API with uvicorn until SIGTERM drains it."""
from __future__ import annotations

import argparse
import logging
import os
import socket
import sys
from pathlib import Path
from types import FrameType

import uvicorn

from tally.engine.args import add_engine_args, config_from_args
from tally.engine.parallel.distributed import is_follower
from tally.engine.parallel.follower import follow
from tally.errors import TallyError
from tally.flags import (
    DRAIN_TIMEOUT,
    HEADER_TIMEOUT,
    HOST,
    LOG_LEVEL,
    MAX_BODY_BYTES,
    MAX_CONNECTIONS,
    METRICS_PREFIX,
    PORT,
    REQUEST_TIMEOUT,
    parser,
)
from tally.http_limits import guarded_protocol
from tally.server.answer_flags import add_answer_flags, check_answer_flags
from tally.server.app_args import app_from_args
from tally.server.listen import bind_sockets
from tally.server.ray_flags import add_ray_args, check_ray_args
from tally.server.vllm_flags import add_vllm_flags, warn_no_effect
from tally.units import parse_bytes

# A server's clients stream, so it keeps their tokens flowing by default; LLM() (offline) has no latency target.
SERVE_MAX_ITL_S = 0.3


class DrainingServer(uvicorn.Server):
    """On SIGTERM/SIGINT: turn new requests away (503), let running ones finish within
    --drain-timeout (uvicorn cancels the rest, which aborts them), then exit 0."""

    def handle_exit(self, sig: int, frame: FrameType | None) -> None:
        self.config.app.state.tally.draining = True
        super().handle_exit(sig, frame)
        self._captured_signals.clear()  # uvicorn would re-raise the signal after shutdown; we exit cleanly

    async def startup(self, sockets: list[socket.socket] | None = None) -> None:
        await super().startup(sockets)
        if sockets and self.started:  # uvicorn names the address only for sockets it bound itself
            self._log_started_message(sockets)


def build_parser() -> argparse.ArgumentParser:
    p = parser("tally serve", "OpenAI-compatible HTTP server.")
    p.add_argument("model_tag", nargs="?", metavar="MODEL", help="as --model (vLLM's `vllm serve MODEL`)")
    p.add_argument("--api-key", default=None,  # read from the environment after parsing: --help never shows it
                   help="require 'Authorization: Bearer KEY' on /v1/*, /tokenize and /detokenize (default: "
                        "$TALLY_API_KEY or $VLLM_API_KEY)")
    HOST.add(p)
    PORT.add(p)
    p.add_argument("--max-queue", type=int, default=None,
                   help="requests allowed to wait for a batch slot; beyond it: 429 with Retry-After (default: no "
                        "limit)")
    p.add_argument("--max-queue-delay", type=float, default=None, metavar="SECONDS",
                   help="refuse (429, Retry-After) a request whose predicted wait for a batch slot, from the rate "
                        "requests started at lately, is longer (default: no limit)")
    REQUEST_TIMEOUT.add(p, note="; the engine aborts it")
    MAX_BODY_BYTES.add(p)
    DRAIN_TIMEOUT.add(p)
    MAX_CONNECTIONS.add(p)
    HEADER_TIMEOUT.add(p)
    p.add_argument("--allowed-hosts", default=None,
                   help="comma-separated Host header values to serve, * for any (default: localhost, 127.0.0.1 "
                        "and ::1 when --host is a loopback address, else any)")
    p.add_argument("--request-log", type=Path, default=None, metavar="DIR",
                   help="write one JSON line per finished request (token counts, finish reason, latencies) to "
                        "files in DIR rotated by --request-log-max-bytes; read by tally plan --lengths DIR, "
                        "tally bench --replay DIR, tally quantize --calib DIR")
    p.add_argument("--request-log-max-bytes", type=parse_bytes, default="64MiB",
                   help="a --request-log file this large is closed and the next one begun")
    p.add_argument("--log-prompts", action="store_true",
                   help="also log the prompt text / chat messages, through --redact")
    p.add_argument("--redact", default=None, metavar="MODULE:FUNCTION",
                   help="str -> str applied to logged prompts (default: e-mails, long numbers, key-like strings)")
    p.add_argument("--restart-on-failure", action="store_true",
                   help="when the engine loop dies, fail the requests in flight, reload the engine, serve again")
    LOG_LEVEL.add(p)
    METRICS_PREFIX.add(p)
    add_answer_flags(p)
    p.add_argument("--trust-request-chat-template", action="store_true",
                   help="render a request's own chat_template (a template is code: it runs sandboxed, within a time "
                        "and memory limit); without it such a request gets 400")
    p.add_argument("--responses-store-size", type=int, default=1000, metavar="N",
                   help="finished /v1/responses kept in memory for previous_response_id and GET (least recently used "
                        "evicted first; at most 64 MiB of conversation text in all); 0 keeps none "
                        "(default: %(default)s)")
    add_engine_args(p)
    add_vllm_flags(p)
    add_ray_args(p)
    p.set_defaults(max_itl_s=SERVE_MAX_ITL_S)
    return p


def parse_args(argv: list[str]) -> argparse.Namespace:
    p = build_parser()
    ns = p.parse_args(argv)
    ns.api_key = ns.api_key or os.environ.get("TALLY_API_KEY") or os.environ.get("VLLM_API_KEY")
    check_ray_args(p, ns)
    if ns.model_tag is not None:
        if ns.model is not None and ns.model != ns.model_tag:
            p.error(f"the model is given twice ({ns.model_tag!r} and --model {ns.model!r}); give it once")
        ns.model = ns.model_tag
    if ns.max_queue is not None and ns.max_queue < 1:
        p.error("--max-queue must be ≥ 1")
    if ns.max_connections < 1 or ns.header_timeout <= 0:
        p.error("--max-connections must be ≥ 1 and --header-timeout > 0 seconds")
    if ns.request_timeout is not None and ns.request_timeout <= 0:
        p.error("--request-timeout must be > 0 seconds")
    check_answer_flags(p, ns)
    return ns


def main(argv: list[str]) -> int:
    """`tally serve` in this process; with --ray, tally/deploy/serve_cli.py takes the command first."""
    return serve(parse_args(argv))


def start_logging(ns: argparse.Namespace) -> None:
    logging.basicConfig(level=ns.log_level.upper(), format="%(asctime)s %(name)s %(levelname)s %(message)s")
    warn_no_effect(ns)


def serve(ns: argparse.Namespace) -> int:
    start_logging(ns)
    sockets: list[socket.socket] = []
    try:
        config = config_from_args(ns)
        if is_follower(config):  # torchrun's ranks 1..N-1 follow rank 0's steps and serve nothing
            return follow(config)
        sockets = bind_sockets(ns.host, ns.port)  # a busy port fails now, not after the model has loaded
        app = app_from_args(ns)
    except TallyError as exc:
        for sock in sockets:
            sock.close()
        print(f"tally serve: {exc.message}", file=sys.stderr)
        return 2
    config = uvicorn.Config(app, host=ns.host, port=ns.port, log_level=ns.log_level,
                            http=guarded_protocol(ns.max_connections, ns.header_timeout),
                            timeout_graceful_shutdown=ns.drain_timeout, access_log=ns.log_level == "debug")
    DrainingServer(config).run(sockets=sockets)
    return 0
