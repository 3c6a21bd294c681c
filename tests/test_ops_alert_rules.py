"""The rules `tally alerts` writes: thresholds are the baseline's figures × the stated factors, every rule says
what its baseline was, and a partial run is refused as a baseline."""
from __future__ import annotations

import json

import pytest
import yaml
from support.bench_servers import serve

from tally.bench.cli import main as bench_main
from tally.errors import ConfigError
from tally.ops.alerts import LATENCY_FACTOR, baseline_rules, rules_file


@pytest.fixture(scope="module")
def baseline(tmp_path_factory):
    path = tmp_path_factory.mktemp("baseline") / "run.json"
    with serve(mode="ok") as server:
        assert bench_main(["--url", server.url, "--rate", "20", "--duration", "2s", "--lengths", "fixed:16,4",
                           "--out", str(path), "--quiet"]) == 0
    return path


def test_thresholds_come_from_the_baseline(baseline):
    result = json.loads(baseline.read_text())
    rules = {r["alert"]: r for r in yaml.safe_load(rules_file(baseline))["groups"][0]["rules"]}
    ttft = rules["TallyTTFTP99High"]
    limit = float(ttft["expr"].rsplit(">", 1)[1])
    assert limit == pytest.approx(LATENCY_FACTOR * result["summary"]["ttft_s"]["p99"], rel=1e-5)
    assert "TTFT P99" in ttft["annotations"]["baseline"] and ttft["labels"]["severity"] == "page"
    assert {"TallyRejecting", "TallyRequestTimeouts", "TallyServerErrors", "TallyKVCacheNearlyFull",
            "TallyRequestsWaiting", "TallyOutputLengthDrop"} <= set(rules)
    assert all(r["annotations"]["baseline_run"] == str(baseline) for r in rules.values())


def test_the_prefix_follows_the_server_kind(baseline):
    text = rules_file(baseline, prefix="vllm:")
    assert "vllm:time_to_first_token_seconds_bucket" in text and "tally:" not in text.split("groups:")[1]


def test_a_partial_run_is_not_a_baseline(baseline, tmp_path):
    result = json.loads(baseline.read_text())
    result["partial"], result["stopped"] = True, {"reason": "interrupted"}
    partial = tmp_path / "partial.json"
    partial.write_text(json.dumps(result))
    with pytest.raises(ConfigError, match="partial run"):
        rules_file(partial)


def test_a_live_baseline_counts_what_finished_in_its_window():
    from tally.ops.live_baseline import baseline_from_scrapes
    from tally.prometheus_text import parse

    def scrape(ok: int, failed: int, ttft_le_01: int) -> str:
        return (f"# TYPE tally:request_success_total counter\ntally:request_success_total{{finished_reason=\"stop\"}} {ok}\n"
                f"# TYPE tally:request_error_total counter\ntally:request_error_total{{code=\"500\"}} {failed}\n"
                f"tally:request_error_total{{code=\"400\"}} 7\n"
                f"# TYPE tally:time_to_first_token_seconds histogram\n"
                f"tally:time_to_first_token_seconds_bucket{{le=\"0.1\"}} {ttft_le_01}\n"
                f"tally:time_to_first_token_seconds_bucket{{le=\"+Inf\"}} {ok}\n"
                f"tally:time_to_first_token_seconds_sum {ok * 0.05}\n"
                f"tally:time_to_first_token_seconds_count {ok}\n")

    result = baseline_from_scrapes(parse(scrape(10, 1, 10)), parse(scrape(110, 2, 110)), [0, 3])
    summary = result["summary"]
    assert summary["counts"]["requests"] == 101 and summary["errors"] == {"http_5xx": 1}  # 400s are clients'
    assert summary["ttft_s"]["count"] == 100 and summary["ttft_s"]["p99"] <= 0.1
    rules = {r.name: r for r in baseline_rules(result)}
    assert "TallyTTFTP99High" in rules and "most waiting in the baseline 3" in rules["TallyRequestsWaiting"].baseline
    with pytest.raises(ConfigError, match="no request finished"):
        baseline_from_scrapes(parse(scrape(10, 1, 10)), parse(scrape(10, 1, 10)), [])
