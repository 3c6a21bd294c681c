"""Soak mode samples /metrics and memory while the run goes on and ends with a verdict that
flags a trend (leak, creep) with the numbers behind it, and stays quiet when nothing drifts."""
from __future__ import annotations

import json
import os

import numpy as np
import pytest
from support.bench_servers import serve

from tally.bench.cli import main
from tally.bench.scrape import process_rss_bytes
from tally.bench.soak import SoakSample, trend, verdict


def _soak(url: str, out, *extra: str) -> dict:
    rc = main(["--url", url, "--rate", "20", "--soak", "3s", "--sample", "0.4s",
               "--lengths", "fixed:16,4", "--out", str(out), "--quiet", *extra])
    assert rc == 0
    return json.loads(out.read_text())["soak"]


def test_soak_flags_a_leaking_server_with_the_numbers(tmp_path):
    with serve(mode="leak") as server:
        soak = _soak(server.url, tmp_path / "leak.json")
    assert soak["verdict"] == "trend found"
    flags = " ".join(soak["flags"])
    assert "memory leak suspected" in flags and "KV usage creeping" in flags
    rss = soak["series"]["rss_bytes"]
    assert rss["slope_per_h"] > 0 and rss["r2"] > 0.9 and rss["end"] > rss["start"]
    assert len(soak["samples"]) >= 5
    assert all(s["kv_usage"] is not None and s["completed"] >= 0 for s in soak["samples"])


def test_soak_of_a_steady_server_is_stable(tmp_path):
    with serve(mode="ok") as server:
        soak = _soak(server.url, tmp_path / "steady.json")
    assert soak["verdict"] == "stable" and soak["flags"] == []
    assert {"kv_usage", "rss_bytes", "fragmentation"} <= set(soak["series"])


def test_soak_reads_rss_of_a_local_server_process(tmp_path):
    with serve(mode="ok") as server:
        soak = _soak(server.url, tmp_path / "pid.json", "--server-pid", str(server.pid))
    rss = [s["rss_bytes"] for s in soak["samples"]]
    assert all(r is not None and r < 200_000_000 for r in rss)  # /proc, not the fake gauge
    assert process_rss_bytes(os.getpid()) > 0


def test_verdict_ignores_noise_and_flags_fragmentation_creep():
    rng = np.random.default_rng(0)
    t = np.arange(20) * 30.0
    samples = [SoakSample(float(ti), 10, 0.5 + 0.02 * rng.standard_normal(),
                          kv_usage=0.4 + 0.01 * rng.standard_normal(),
                          fragmentation=0.05 + 0.004 * i, rss_bytes=1e9)
               for i, ti in enumerate(t)]
    result = verdict(samples)
    assert len(result["flags"]) == 1 and result["flags"][0].startswith("fragmentation creep")
    assert "0.05" in result["flags"][0] and "r²=1.00" in result["flags"][0]
    fit = trend(t, 2.0 * t + 1.0)
    assert fit["slope_per_h"] == pytest.approx(7200.0) and fit["r2"] == pytest.approx(1.0)


def test_verdict_needs_enough_samples():
    assert verdict([SoakSample(1.0, 1, 0.1)])["verdict"].startswith("not enough samples")
