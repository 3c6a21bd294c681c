"""The other ways to drive load: closed loop, the chat endpoint, trace replay, the --fit
printout, and bad command lines that must say what to fix."""
from __future__ import annotations

import asyncio
import json

import numpy as np
import pytest
from support.bench_servers import serve

from tally.bench.benchmark import BenchConfig, run_benchmark
from tally.bench.cli import main
from tally.bench.client import RequestRecord
from tally.bench.length_samplers import FixedLengths
from tally.bench.progress import progress_line
from tally.bench.runner import RunState
from tally.bench.workload import WorkloadConfig


def test_closed_loop_runs_exactly_the_requested_measured_requests():
    workload = WorkloadConfig(FixedLengths(32, 6), None, concurrency=4, max_requests=25,
                              warmup_s=0.3)
    with serve(token_delay_ms=2) as server:
        result = asyncio.run(run_benchmark(BenchConfig(server.url, workload, progress=False)))
    measured = [r for r in result["requests"] if not r["warmup"]]
    assert len(measured) == 25 and result["summary"]["counts"]["ok"] == 25
    assert all(r["output_tokens"] == 6 for r in result["requests"])
    # closed loop: never more than `concurrency` requests in flight
    events = sorted([(r["sent_s"], 1) for r in result["requests"]] +
                    [(r["end_s"], -1) for r in result["requests"]], key=lambda e: (e[0], e[1]))
    in_flight = max(np.cumsum([e[1] for e in events]))
    assert in_flight <= 4


def test_a_rate_with_a_concurrency_cap_never_exceeds_the_cap(tmp_path):
    """vLLM's --request-rate with --max-concurrency: 40 requests/s into a server that takes ~0.1 s each, at most
    3 in flight; a request that waited for a slot is timed from its send."""
    with serve(token_delay_ms=20) as server:
        rc = main(["--url", server.url, "--rate", "40", "--concurrency", "3", "--requests", "12",
                   "--lengths", "fixed:16,5", "--out", str(tmp_path / "capped.json"), "--quiet"])
    result = json.loads((tmp_path / "capped.json").read_text())
    assert rc == 0 and result["summary"]["counts"]["ok"] == 12
    assert result["workload"]["arrivals"]["max_concurrency"] == 3
    events = sorted([(r["sent_s"], 1) for r in result["requests"]] + [(r["end_s"], -1) for r in result["requests"]],
                    key=lambda e: (e[0], e[1]))
    assert max(np.cumsum([e[1] for e in events])) <= 3
    assert any(r["sent_s"] > r["scheduled_s"] + 0.05 for r in result["requests"])  # some waited for a slot


def test_chat_endpoint_streams_and_counts_tokens(tmp_path):
    with serve() as server:
        rc = main(["--url", server.url, "--endpoint", "chat", "--concurrency", "2",
                   "--requests", "6", "--lengths", "fixed:40,5", "--system-prompt-tokens", "20",
                   "--prefix-share", "1", "--out", str(tmp_path / "chat.json"), "--quiet"])
    result = json.loads((tmp_path / "chat.json").read_text())
    assert rc == 0 and result["summary"]["counts"]["ok"] == 6
    assert result["server"]["endpoint"] == "chat"
    assert all(r["output_tokens"] == 5 for r in result["requests"])


def test_replay_sends_at_trace_timestamps_with_trace_lengths(tmp_path):
    trace = tmp_path / "trace.csv"
    trace.write_text("timestamp,prompt_tokens,output_tokens\n"
                     "100.0,30,3\n100.5,60,4\n101.0,90,5\n104.0,20,2\n")
    with serve() as server:
        rc = main(["--url", server.url, "--replay", str(trace), "--time-scale", "0.2",
                   "--out", str(tmp_path / "replay.json"), "--quiet"])
    result = json.loads((tmp_path / "replay.json").read_text())
    assert rc == 0
    assert [r["scheduled_s"] for r in result["requests"]] == pytest.approx([0, 0.1, 0.2, 0.8])
    assert [r["output_tokens"] for r in result["requests"]] == [3, 4, 5, 2]
    assert [r["prompt_tokens"] for r in result["requests"]] == [30, 60, 90, 20]


def test_fit_prints_parameters_usable_as_lengths(capsys):
    assert main(["--fit", "conv"]) == 0
    out = capsys.readouterr().out
    assert "median" in out and "--lengths lognormal:prompt_median=" in out


@pytest.mark.parametrize("argv,message", [
    (["--rate", "5"], "--url is required"),
    (["--url", "http://x", "--rate", "5", "--replay", "t.csv"], "choose one arrival process"),
    (["--url", "http://x", "--rate", "5", "--concurrency", "0", "--requests", "3"], "--concurrency must be >= 1"),
    (["--url", "http://x", "--phases", "5/s:1s", "--duration", "5s"], "--phases sets the run"),
    (["--url", "http://x", "--lengths", "fixed:1"], "fixed:512,256"),
    (["--url", "http://x", "--slo", "latency=1s"], "ttft, tpot and/or e2e"),
])
def test_bad_command_lines_say_what_to_fix(argv, message, capsys):
    assert main(argv) == 2
    assert message in capsys.readouterr().err


def test_progress_line_shows_sent_done_in_flight_and_failures():
    state = RunState(expected=10, end_s=5.0)
    state.records = [RequestRecord(i, "p", 0.0, 8, 8, 4, sent_s=0.0, first_token_s=0.25,
                                   last_token_s=0.5, end_s=0.5) for i in range(3)]
    state.records[2].error, state.done, state.failed = "http_503", 2, 1
    line = progress_line(state).plain
    assert "sent 3/10" in line and "done 2" in line and "in flight 1" in line
    assert "failed 1" in line and "250.0ms" in line


def test_results_in_vllms_shape_and_as_csv(tmp_path):
    with serve() as server:
        for fmt in ("vllm", "csv"):
            assert main(["--url", server.url, "--concurrency", "2", "--requests", "5", "--lengths", "fixed:20,4",
                         "--format", fmt, "--out", str(tmp_path / f"run.{fmt}"), "--quiet"]) == 0
    vllm = json.loads((tmp_path / "run.vllm").read_text())
    assert vllm["completed"] == 5 and vllm["total_output_tokens"] == 20 and vllm["max_concurrency"] == 2
    assert vllm["output_lens"] == [4] * 5 and len(vllm["ttfts"]) == 5 and len(vllm["itls"]) == 5
    for key in ("ttft", "tpot", "itl", "e2el"):
        assert vllm[f"mean_{key}_ms"] > 0 and vllm[f"p99_{key}_ms"] >= vllm[f"median_{key}_ms"]
    rows = (tmp_path / "run.csv").read_text().splitlines()
    assert rows[0].startswith("id,phase,warmup") and len(rows) == 6
