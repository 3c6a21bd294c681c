"""The reliability soak (benchmarks/soak_hostile.py), shortened to half a minute on a tiny model: at twice the
measured capacity, with clients leaving mid-stream and bad requests of every kind, nothing is lost or hangs, every bad
request gets a 4xx, no 5xx is served, the KV pool is whole again and nothing trends."""
from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
from support.tiny_models import make_checkpoint

SCRIPT = Path(__file__).resolve().parents[1] / "benchmarks" / "soak_hostile.py"
pytestmark = pytest.mark.exclusive  # its load is twice a capacity it measures: a neighbour test would move both


def test_a_half_minute_hostile_soak_loses_nothing(tmp_path):
    ckpt = make_checkpoint(tmp_path / "tiny", "llama", max_position_embeddings=4096)
    out = tmp_path / "soak"
    run = subprocess.run([sys.executable, str(SCRIPT), "--duration", "30s", "--model", str(ckpt),
                          "--capacity-requests", "16", "--out", str(out)], capture_output=True, text=True,
                         timeout=900)
    result = json.loads((out / "soak.json").read_text())
    assert run.returncode == 0, run.stdout[-3000:] + run.stderr[-3000:]
    assert all(result["checks"].values()), result["checks"]
    assert result["chaos"]["left"] > 0 and sum(result["chaos"]["bad_status"].values()) > 0
    assert result["load"]["ok"] > 0
