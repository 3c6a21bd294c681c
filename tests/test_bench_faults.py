"""Failing servers (real HTTP servers that answer 503, drop streams, or never answer): the run
finishes, every failure is counted by cause, and none of them leaks into latency statistics."""
from __future__ import annotations

import asyncio

import pytest
from support.bench_servers import serve

from tally.bench.arrivals import RateArrivals
from tally.bench.benchmark import BenchConfig, run_benchmark
from tally.bench.cli import main
from tally.bench.length_samplers import FixedLengths
from tally.bench.workload import WorkloadConfig
from tally.errors import ConfigError

REQUESTS = 30


def _run(url: str, timeout_s: float = 30.0) -> dict:
    workload = WorkloadConfig(FixedLengths(16, 8), RateArrivals(40.0), max_requests=REQUESTS)
    config = BenchConfig(url, workload, timeout_s=timeout_s, progress=False)
    return asyncio.run(run_benchmark(config, ["test"]))


def _check_failures_kept_apart(result: dict, cause: str) -> None:
    summary, requests = result["summary"], result["requests"]
    failed = [r for r in requests if r["error"] is not None]
    assert len(requests) == REQUESTS and all(r["end_s"] is not None for r in requests)
    assert {r["error"] for r in failed} == {cause}
    assert summary["errors"] == {cause: len(failed)}
    assert summary["counts"]["failed"] == len(failed)
    assert summary["counts"]["ok"] == REQUESTS - len(failed)
    for key in ("ttft_s", "e2e_s"):  # latency samples come from successful requests only
        assert summary[key]["count"] == summary["counts"]["ok"]
    assert any(cause in w for w in result["warnings"])


@pytest.mark.parametrize("mode,cause", [("503", "http_503"), ("drop", "disconnect")])
def test_every_third_request_failing_is_counted_by_cause(mode, cause):
    with serve(mode=mode, fault_every=3, token_delay_ms=1) as server:
        result = _run(server.url)
    _check_failures_kept_apart(result, cause)
    assert len([r for r in result["requests"] if r["error"]]) == pytest.approx(REQUESTS / 3, abs=1)


def test_requests_that_never_get_an_answer_time_out_and_the_run_ends():
    with serve(mode="hang", fault_every=3) as server:
        result = _run(server.url, timeout_s=1.0)
    _check_failures_kept_apart(result, "timeout")
    timed_out = [r for r in result["requests"] if r["error"] == "timeout"]
    assert all(r["end_s"] - r["sent_s"] >= 1.0 for r in timed_out)
    assert result["summary"]["e2e_s"]["max"] < 1.0  # the slow ones are not latency samples


def test_a_server_failing_every_request_gives_a_report_and_exit_status_1(capsys):
    with serve(mode="503", fault_every=1) as server:
        rc = main(["--url", server.url, "--rate", "20", "--requests", "10", "--quiet"])
    assert rc == 1
    out = capsys.readouterr().out
    assert "10 failed (10 http_503)" in out and "{'" not in out  # causes in words, not a Python dict


def test_no_server_at_the_url_is_a_clear_error():
    with pytest.raises(ConfigError, match="no server answers"):
        _run("http://127.0.0.1:9")
