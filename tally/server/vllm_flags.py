"""vLLM flags that mean nothing on a CPU engine (tally/engine/vllm_compat.py), accepted so that a vLLM command line
runs unchanged: each one given is named in one warning line instead of failing argparse."""
from __future__ import annotations

import argparse
import logging

from tally.engine.vllm_compat import NO_EFFECT

log = logging.getLogger("tally.server")

NO_EFFECT_FLAGS = {"--" + name.replace("_", "-"): takes_value for name, takes_value in NO_EFFECT.items()}


def add_vllm_flags(p: argparse.ArgumentParser) -> None:
    g = p.add_argument_group("vLLM flags with no effect here (accepted with a warning)")
    for flag, takes_value in NO_EFFECT_FLAGS.items():
        g.add_argument(flag, dest=_dest(flag), default=None, help="vLLM's; no effect here",
                       **({"metavar": "VALUE"} if takes_value else {"action": "store_const", "const": True}))


def warn_no_effect(ns: argparse.Namespace) -> None:
    given = [flag for flag in NO_EFFECT_FLAGS if getattr(ns, _dest(flag)) is not None]
    if given:
        log.warning("ignoring vLLM flags that have no effect on this CPU engine: %s", ", ".join(given))


def _dest(flag: str) -> str:
    return "vllm_" + flag.lstrip("-").replace("-", "_")
