"""`tally bench` end to end against a real streaming HTTP server on 127.0.0.1: a 10-second
phased run, every request accounted for, and the JSON and HTML reports readable."""
from __future__ import annotations

import copy
import json
from html.parser import HTMLParser

import pytest
from support.bench_servers import serve

from tally.bench.arrivals import RateArrivals, build_schedule, parse_phases
from tally.bench.cli import main
from tally.bench.run_diff import compare

PHASES = "4/s:4s,25/s:1s,4/s:4s"  # a burst in the middle of steady load; 1 s warmup in front
PLOTS = {"ttft_cdf", "tpot_cdf", "e2e_cdf", "ttft_over_time", "tpot_over_time",
         "throughput_over_time", "token_throughput_over_time"}


@pytest.fixture(scope="module")
def phased_run(tmp_path_factory):
    out = tmp_path_factory.mktemp("bench")
    with serve(token_delay_ms=2) as server:
        rc = main(["--url", server.url, "--phases", PHASES, "--warmup", "1s", "--seed", "5",
                   "--lengths", "lognormal:prompt_median=200,output_median=12,output_max=40",
                   "--system-prompt-tokens", "100", "--prefix-share", "0.5",
                   "--slo", "ttft=1s,tpot=200ms", "--out", str(out / "run.json"),
                   "--html", str(out / "report.html"), "--quiet"])
    assert rc == 0
    return out


def test_every_scheduled_request_is_accounted_for(phased_run):
    result = json.loads((phased_run / "run.json").read_text())
    schedule = build_schedule(RateArrivals(4.0, phases=parse_phases(PHASES)), seed=5,
                              warmup_s=1.0, duration_s=None, max_requests=None)
    requests = result["requests"]
    assert len(requests) == len(schedule.scheduled_s)
    assert sorted(r["id"] for r in requests) == list(range(len(requests)))
    assert all(r["end_s"] is not None and r["error"] is None for r in requests)
    counts = result["summary"]["counts"]
    measured = [r for r in requests if not r["warmup"]]
    assert counts["requests"] == len(measured) == counts["ok"] + counts["failed"]
    assert sum(p["counts"]["requests"] for p in result["phases"]) == len(requests)
    names = [p["name"] for p in result["phases"]]
    assert names[:4] == ["warmup", "1:4/s", "2:25/s", "3:4/s"] and names[4:] in ([], ["drain"])
    finished = sum(p["throughput"]["requests_per_s"] * (p["end_s"] - p["start_s"])
                   for p in result["phases"])
    assert finished == pytest.approx(len(requests))  # each finish falls in exactly one row


def test_timings_are_ordered_and_ttft_never_exceeds_e2e(phased_run):
    result = json.loads((phased_run / "run.json").read_text())
    for r in result["requests"]:
        assert r["scheduled_s"] <= r["sent_s"] + 1e-6
        assert r["sent_s"] <= r["first_token_s"] <= r["last_token_s"] <= r["end_s"]
        ttft, e2e = r["first_token_s"] - r["sent_s"], r["last_token_s"] - r["sent_s"]
        assert ttft <= e2e
        assert sum(r["itl_s"]) == pytest.approx(r["last_token_s"] - r["first_token_s"], abs=1e-4)
    summary = result["summary"]
    assert summary["ttft_s"]["p50"] <= summary["e2e_s"]["p50"]
    assert summary["goodput"]["met"] <= summary["counts"]["ok"]


def test_lengths_reach_the_server_exactly(phased_run):
    """The server's usage report equals the planned prompt and forced output lengths."""
    result = json.loads((phased_run / "run.json").read_text())
    system = result["workload"]["system_prompt_tokens_actual"]
    assert system == 100
    assert result["server"]["ignore_eos"] and result["server"]["tokenizer_exact"]
    assert not any("approximate" in w for w in result["warnings"])
    for r in result["requests"]:
        assert r["output_tokens"] == r["expected_output_tokens"]
        assert r["prompt_tokens"] == r["expected_prompt_tokens"]
    assert {r["prompt_tokens"] > system for r in result["requests"]} == {True, False}


def test_json_report_is_self_describing(phased_run):
    result = json.loads((phased_run / "run.json").read_text())
    assert result["schema"] == "tally.bench/1"
    assert {"TTFT", "TPOT", "ITL", "E2E", "Goodput"} <= set(result["definitions"])
    assert result["workload"]["arrivals"]["kind"] == "phases"
    assert result["server"]["model"] == "fake-model"
    assert result["server_metrics"]["queue_time_s"]["count"] > 0
    assert result["command"][:2] == ["tally", "bench"]


class _PageParser(HTMLParser):
    def __init__(self):
        super().__init__()
        self.plots, self.tags, self.external = set(), set(), []

    def handle_starttag(self, tag, attrs):
        attrs = dict(attrs)
        self.tags.add(tag)
        if tag == "svg":
            self.plots.add(attrs.get("data-plot"))
        for key in ("src", "href"):
            if str(attrs.get(key, "")).startswith(("http:", "https:", "//")):
                self.external.append(attrs[key])


def test_html_report_is_self_contained_and_has_the_plots(phased_run):
    parser = _PageParser()
    parser.feed((phased_run / "report.html").read_text())
    assert PLOTS <= parser.plots
    assert "script" not in parser.tags and "link" not in parser.tags and not parser.external


def test_compare_flags_a_regression_beyond_the_threshold(phased_run):
    base = json.loads((phased_run / "run.json").read_text())
    assert not any(row["regression"] for row in compare(base, base, 0.10))
    slower = copy.deepcopy(base)
    slower["summary"]["ttft_s"]["p99"] *= 1.5
    slower["summary"]["throughput"]["requests_per_s"] *= 0.95
    rows = {row["figure"]: row for row in compare(base, slower, 0.10)}
    assert rows["TTFT P99"]["regression"] and rows["TTFT P99"]["change"] == pytest.approx(0.5)
    assert not rows["requests/s"]["regression"]  # 5% worse, under the 10% threshold
    path = phased_run / "slower.json"
    path.write_text(json.dumps(slower))
    assert main(["compare", str(phased_run / "run.json"), str(path)]) == 1
    assert main(["compare", str(phased_run / "run.json"), str(phased_run / "run.json")]) == 0
