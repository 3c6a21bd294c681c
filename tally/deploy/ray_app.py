"""`serve run`'s application builder (docs/deploy.md has the config file):

    import_path: tally.deploy.ray_app:build_app
    args:
      cli: --model smollm2-135m --autoscale 1:4 --max-num-seqs 16
      upscale_delay_s: 10

`cli` is a `tally serve` command line (--ray implied; where Ray's proxy listens is the config's http_options, and
cli's --host sets only the Host allow-list's default, as in tally serve: loopback names for a loopback --host);
the other keys are RayServeOptions fields (tally/server/ray_flags.py)."""
from __future__ import annotations

import contextlib
import dataclasses
import io
import shlex
from typing import Any

from ray.serve import Application

from tally.deploy.ray_serve import application
from tally.errors import ConfigError
from tally.server.cli import parse_args
from tally.server.ray_flags import RayServeOptions, ray_options


def build_app(args: dict[str, Any]) -> Application:
    unknown = set(args) - {"cli"} - RayServeOptions.field_names()
    if unknown:
        raise ConfigError(f"unknown args {', '.join(sorted(unknown))}; give `cli` (tally serve's flags) and RayServeOptions "
                          f"fields: {', '.join(sorted(RayServeOptions.field_names()))}")
    cli = args.get("cli", "")
    argv = ["--ray", *(shlex.split(cli) if isinstance(cli, str) else map(str, cli))]
    errors = io.StringIO()
    try:
        with contextlib.redirect_stderr(errors):
            ns = parse_args(argv)
    except SystemExit:  # argparse's way to refuse a flag: its message, not an exit of Serve's process
        raise ConfigError(f"cli {shlex.join(argv[1:])!r}: {errors.getvalue().strip().splitlines()[-1]}") from None
    fields = {key: value for key, value in args.items() if key != "cli"}
    return application(ns, dataclasses.replace(ray_options(ns), **fields))
