"""benchmarks/peer_env.py: another engine a bench script starts gets the user's OpenMP waiting policy, not the PASSIVE
that importing tally sets (llama.cpp decodes slower with it: docs/benchmarks.md#kernels). Each case in a
fresh interpreter, since tally reads the environment once, at import."""
from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

BENCH = Path(__file__).resolve().parents[1] / "benchmarks"
PROBE = ("import os, sys; sys.path.insert(0, sys.argv[1]); from peer_env import peer_env; "
         "print(os.environ['OMP_WAIT_POLICY'], peer_env().get('OMP_WAIT_POLICY', '-'))")


@pytest.mark.parametrize("user, own, peer", [(None, "PASSIVE", "-"), ("ACTIVE", "ACTIVE", "ACTIVE"),
                                             ("PASSIVE", "PASSIVE", "PASSIVE")])
def test_a_peer_gets_the_users_policy_and_tally_keeps_its_own(user, own, peer):
    env = {k: v for k, v in os.environ.items() if k != "OMP_WAIT_POLICY"}
    if user is not None:
        env["OMP_WAIT_POLICY"] = user
    out = subprocess.run([sys.executable, "-c", PROBE, str(BENCH)], env=env, capture_output=True, text=True,
                         check=True).stdout.split()
    assert out == [own, peer]
