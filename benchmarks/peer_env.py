"""The environment for another engine that a bench script starts: the user's, not the one importing tally made.

Importing tally sets OMP_WAIT_POLICY=PASSIVE for its own process (tally/__init__.py), and a child process inherits
it; llama.cpp's OpenMP threads would then sleep at every barrier and decode slower (docs/benchmarks.md#kernels), a
handicap the comparison scripts must not give their peer.
"""
from __future__ import annotations

import os

import tally


def peer_env() -> dict[str, str]:
    """os.environ with OMP_WAIT_POLICY as the user had it (absent if unset)."""
    env = {k: v for k, v in os.environ.items() if k != "OMP_WAIT_POLICY"}
    if tally.OMP_WAIT_POLICY_OF_USER is not None:
        env["OMP_WAIT_POLICY"] = tally.OMP_WAIT_POLICY_OF_USER
    return env
