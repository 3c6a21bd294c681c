"""`tally bench --format guidellm`: a run in GuideLLM's report shape (benchmarks → requests by status, metrics as
distribution summaries by status), that `tally plan --lengths` reads back."""
from __future__ import annotations

import json

import pytest
from support.bench_servers import serve

from tally.bench.cli import main as bench
from tally.bench.report_guidellm import _concurrency, _rate, _summary
from tally.cli import main as tally
from tally.ledger.length_percentiles import load_lengths

SUMMARY_KEYS = {"mean", "median", "mode", "variance", "std_dev", "min", "max", "count", "total_sum", "percentiles"}


@pytest.fixture(scope="module")
def run(tmp_path_factory):
    out = tmp_path_factory.mktemp("guidellm") / "benchmarks.json"
    with serve(token_delay_ms=2) as server:
        assert bench(["--url", server.url, "--concurrency", "2", "--requests", "6", "--lengths", "fixed:20,4",
                      "--format", "guidellm", "--out", str(out), "--quiet"]) == 0
    return out, json.loads(out.read_text())


def test_a_guidellm_report_holds_each_request_with_guidellms_timings(run):
    _, report = run
    (benchmark,) = report["benchmarks"]
    assert benchmark["type_"] == "generative_benchmark"
    assert benchmark["config"]["strategy"] == {"type_": "concurrent", "streams": 2}
    requests = benchmark["requests"]
    assert len(requests["successful"]) == 6 and requests["errored"] == [] and requests["incomplete"] == []
    for r in requests["successful"]:
        assert r["prompt_tokens"] > 0 and r["output_tokens"] == 4 and r["total_tokens"] == r["prompt_tokens"] + 4
        assert r["input_metrics"]["text_tokens"] == r["prompt_tokens"] and r["output_metrics"]["text_tokens"] == 4
        t = r["info"]["timings"]  # what GuideLLM's loader computes the figures below from
        first, last = t["first_token_iteration"], t["last_token_iteration"]
        assert r["request_start_time"] == t["request_start"] <= first <= last <= t["request_end"]
        assert t["request_end"] == r["request_end_time"]
        assert r["time_to_first_token_ms"] == pytest.approx(1e3 * (first - r["request_start_time"]))
        assert r["inter_token_latency_ms"] == pytest.approx(1e3 * (last - first) / 3)
        # GuideLLM's time per output token spans the whole request, the first token's wait included.
        assert r["time_per_output_token_ms"] == pytest.approx(1e3 * (last - r["request_start_time"]) / 4)
    assert benchmark["start_time"] < benchmark["end_time"] and benchmark["duration"] > 0
    # GuideLLM's scenario: the arrival process as its profile, the lengths sent as its synthetic data
    spec = report["config"]["spec"]
    assert spec["profile"] == {"kind": "concurrent", "streams": [2]}
    assert spec["data"] == [{"kind": "synthetic_text", "prompt_tokens": 20, "prompt_tokens_stdev": None,
                             "prompt_tokens_min": 20, "prompt_tokens_max": 20, "output_tokens": 4,
                             "output_tokens_stdev": None, "output_tokens_min": 4, "output_tokens_max": 4}]


def test_a_guidellm_report_has_the_metrics_a_notebook_reads(run):
    _, report = run
    metrics = report["benchmarks"][0]["metrics"]
    assert metrics["request_totals"] == {"successful": 6, "incomplete": 0, "errored": 0, "total": 6}
    for name in ("requests_per_second", "request_concurrency", "request_latency", "prompt_token_count",
                 "output_token_count", "time_to_first_token_ms", "time_per_output_token_ms", "inter_token_latency_ms",
                 "output_tokens_per_second", "tokens_per_second"):
        assert set(metrics[name]) == {"successful", "incomplete", "errored", "total"}, name
        assert set(metrics[name]["successful"]) == SUMMARY_KEYS, name
    ttft = [r["time_to_first_token_ms"] for r in report["benchmarks"][0]["requests"]["successful"]]
    assert metrics["time_to_first_token_ms"]["successful"]["mean"] == pytest.approx(sum(ttft) / 6)
    assert metrics["output_token_count"]["successful"]["total_sum"] == pytest.approx(24)
    assert 0 < metrics["request_concurrency"]["successful"]["mean"] <= 2  # closed loop of 2 workers
    assert metrics["requests_per_second"]["successful"]["mean"] > 0


def test_a_guidellm_report_round_trips_through_plan_lengths(run, capsys):
    path, report = run
    sent = [(r["prompt_tokens"], r["output_tokens"]) for r in report["benchmarks"][0]["requests"]["successful"]]
    assert load_lengths(path) == sent
    assert tally(["plan", "--model", "smollm2-135m", "--device", "cpu", "--lengths", str(path), "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["lengths"]["num_requests"] == 6


def test_distribution_summaries_follow_guidellms_definitions():
    s = _summary([1.0, 2.0, 2.0, 10.0])
    assert (s["mean"], s["median"], s["mode"], s["min"], s["max"], s["count"]) == (3.75, 2.0, 2.0, 1.0, 10.0, 4)
    assert s["percentiles"]["p99"] == 10.0 and s["percentiles"]["p25"] == 1.0
    # two requests in flight for 1 s, then one for 1 s
    c = _concurrency([{"request_start_time": 0.0, "request_end_time": 2.0},
                      {"request_start_time": 0.0, "request_end_time": 1.0}])
    assert c["mean"] == pytest.approx(1.5) and c["max"] == 2.0
    # ten events evenly over 9 s: about one per second
    assert _rate([(float(t), 1.0) for t in range(10)], 0.0, 9.0)["mean"] == pytest.approx(10 / 9, rel=0.01)
