"""`tally serve`: the server in this process (tally/server/cli.py), or with --ray its replicas on Ray Serve. The
choice is made here, above both, so the server never imports the deployment code that wraps it."""
from __future__ import annotations

from tally.server.cli import parse_args, serve, start_logging


def main(argv: list[str]) -> int:
    ns = parse_args(argv)
    if not ns.ray:
        return serve(ns)
    from tally.deploy.ray_serve import serve_on_ray  # Ray loads only for --ray

    start_logging(ns)
    return serve_on_ray(ns)
