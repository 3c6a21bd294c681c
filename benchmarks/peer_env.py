"""The environment for another engine that a bench script starts: the user's, not the one importing tally made.

Importing tally sets OMP_WAIT_POLICY=PASSIVE for its own process (tally/__init__.py), and a child process inherits
it. llama.cpp's OpenMP threads then sleep at every barrier: on a 2-vCPU Zen 4 VM, llama-bench decoded Qwen2.5-Coder
0.5B at 22-26 tok/s with it and 32-45 without, one after the other (session 24). Until then the comparison scripts
gave llama.cpp that handicap once tally was imported: the last of llama_bench_compare.py's two runs a round, and
every llama-server that llamacpp_compare.py started.
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
