"""A run stopped early keeps what it measured: `--time-limit` and Ctrl-C (SIGINT) stop sending,
cancel what is still in flight after the grace period, and still write the terminal, JSON and HTML
reports, marked partial, with every request that was sent accounted for (finished + cancelled).
Real streaming servers on 127.0.0.1 (tests/support/bench_servers.py); no clock assertions."""
from __future__ import annotations

import asyncio
import json
import signal
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import pytest
from support.bench_servers import serve

from tally.bench.arrivals import RateArrivals, build_schedule
from tally.bench.benchmark import BenchConfig, run_benchmark
from tally.bench.cli import EXIT_INTERRUPTED, EXIT_TIME_LIMIT, main
from tally.bench.length_samplers import FixedLengths
from tally.bench.run_diff import main as compare_main
from tally.bench.workload import WorkloadConfig

REPO = Path(__file__).resolve().parents[1]
BOUND_S = 120.0  # generous upper bounds on waits, never asserted as durations


def _check_accounting(result: dict, reason: str) -> list[dict]:
    """The partial result accounts for every request sent; returns the cancelled records."""
    assert result["partial"] is True
    stopped, requests = result["stopped"], result["requests"]
    assert stopped["reason"] == reason
    cancelled = [r for r in requests if r["error"] == "cancelled"]
    finished = [r for r in requests if r["error"] != "cancelled"]
    assert stopped["sent"] == len(requests) > 0
    assert stopped["finished"] == len(finished) and stopped["cancelled"] == len(cancelled)
    assert stopped["finished"] + stopped["cancelled"] == stopped["sent"]
    assert all(r["sent_s"] is not None and r["end_s"] is not None for r in requests)
    assert all(r["sent_s"] <= r["end_s"] for r in requests)
    counts = result["summary"]["counts"]  # no warmup in these runs: every request is measured
    assert counts["requests"] == len(requests)
    assert counts["ok"] + counts["failed"] + counts["cancelled"] == counts["requests"]
    assert counts["cancelled"] == len(cancelled) and counts["failed"] == 0
    assert "cancelled" not in result["summary"]["errors"]  # not a failure
    for key in ("ttft_s", "e2e_s"):  # latency statistics hold only what finished well
        assert result["summary"][key]["count"] == counts["ok"]
    assert result["warnings"][0].startswith("partial run:")
    return cancelled


def test_time_limit_writes_a_partial_report_of_what_finished(tmp_path, capsys):
    out, html = tmp_path / "run.json", tmp_path / "report.html"
    # outputs of ~20 tokens at 50 ms each (some far longer): short ones finish, long ones are cut
    lengths = "lognormal:prompt_median=16,output_median=20,output_sigma=1.0,output_max=400"
    with serve(token_delay_ms=50) as server:
        rc = main(["--url", server.url, "--rate", "20", "--duration", "60s", "--lengths", lengths,
                   "--seed", "3", "--time-limit", "2s", "--grace", "0.5s",
                   "--out", str(out), "--html", str(html), "--quiet"])
    assert rc == EXIT_TIME_LIMIT
    text = capsys.readouterr().out
    assert text.startswith("PARTIAL REPORT") and "--time-limit 2s reached" in text

    result = json.loads(out.read_text())
    cancelled = _check_accounting(result, "time_limit")
    stopped, requests = result["stopped"], result["requests"]
    assert cancelled and result["summary"]["counts"]["ok"] > 0
    schedule = build_schedule(RateArrivals(20.0), seed=3, warmup_s=0.0, duration_s=60.0,
                              max_requests=None)
    assert stopped["scheduled"] == len(schedule.scheduled_s)
    assert stopped["not_sent"] == stopped["scheduled"] - stopped["sent"] > 0
    # the open loop sent a prefix of its schedule, in order
    assert [r["id"] for r in requests] == list(range(len(requests)))
    assert all(r["scheduled_s"] <= stopped["at_s"] for r in requests)
    # the phase table ends at the stop; what finished in the grace period is the drain row
    phases = result["phases"]
    assert phases[0]["end_s"] == pytest.approx(stopped["at_s"], abs=1e-5)
    assert [p["name"] for p in phases[1:]] in ([], ["drain"])
    assert sum(p["counts"]["requests"] for p in phases) == len(requests)

    page = html.read_text()
    assert 'data-partial="time_limit"' in page and "PARTIAL REPORT" in page
    compare_main([str(out), str(out)])  # comparing a partial run says so
    assert "A is a partial run" in capsys.readouterr().out


def test_sigint_writes_a_partial_report_and_exits_130(tmp_path):
    out, html = tmp_path / "run.json", tmp_path / "report.html"
    with serve(token_delay_ms=100) as server:  # 50 tokens: 5 s per request
        proc = subprocess.Popen(
            [sys.executable, "-m", "tally.cli", "bench", "--url", server.url, "--rate", "10",
             "--duration", "10m", "--lengths", "fixed:16,50", "--grace", "1s",
             "--out", str(out), "--html", str(html), "--quiet"],
            cwd=REPO, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        try:
            deadline = time.monotonic() + BOUND_S
            while _running(server.url) < 3:  # the run is sending: requests are streaming now
                assert proc.poll() is None, proc.communicate()
                assert time.monotonic() < deadline, "the bench never got 3 requests in flight"
                time.sleep(0.1)
            proc.send_signal(signal.SIGINT)
            stdout, stderr = proc.communicate(timeout=BOUND_S)
        finally:
            if proc.poll() is None:
                proc.kill()
                proc.wait()
    assert proc.returncode == EXIT_INTERRUPTED, stderr
    assert "interrupted" in stderr and "partial report" in stderr
    assert stdout.startswith("PARTIAL REPORT")

    result = json.loads(out.read_text())
    cancelled = _check_accounting(result, "interrupted")
    assert len(cancelled) >= 1  # requests of 5 s were in flight, with 1 s to finish
    assert all("in flight when the run stopped" in r["detail"] for r in cancelled)
    assert result["stopped"]["not_sent"] > 0
    assert 'data-partial="interrupted"' in html.read_text()


def _running(url: str) -> float:
    """The toy server's own count of streams in progress (its /metrics gauge)."""
    with urllib.request.urlopen(f"{url}/metrics", timeout=10) as response:
        for line in response.read().decode().splitlines():
            if line.startswith("tally:num_requests_running "):
                return float(line.split()[1])
    return 0.0


def test_closed_loop_time_limit_cancels_in_flight_requests_at_once():
    workload = WorkloadConfig(FixedLengths(16, 400), None, concurrency=4, duration_s=600.0)
    with serve(token_delay_ms=20) as server:  # 400 tokens: 8 s per request
        config = BenchConfig(server.url, workload, progress=False, time_limit_s=1.0, grace_s=0.0)
        result = asyncio.run(run_benchmark(config, ["test"]))
    cancelled = _check_accounting(result, "time_limit")
    assert len(cancelled) == len(result["requests"]) == 4  # every worker had one in flight
    stopped = result["stopped"]
    assert stopped["scheduled"] is None and stopped["not_sent"] is None  # no schedule in a closed loop
    assert result["summary"]["counts"]["ok"] == 0


def test_a_run_that_ends_within_its_time_limit_is_complete(tmp_path):
    out = tmp_path / "run.json"
    with serve() as server:
        rc = main(["--url", server.url, "--concurrency", "2", "--requests", "6",
                   "--lengths", "fixed:16,4", "--time-limit", "10m", "--out", str(out), "--quiet"])
    result = json.loads(out.read_text())
    assert rc == 0 and result["partial"] is False and result["stopped"] is None
    assert result["summary"]["counts"] == {"requests": 6, "ok": 6, "failed": 0, "cancelled": 0,
                                           "not_finished": 0}
    assert not any(w.startswith("partial") for w in result["warnings"])
