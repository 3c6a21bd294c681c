"""The rules `tally alerts` writes: thresholds are the baseline's figures × the stated factors, every rule says
what its baseline was; a partial run, or one the server could not keep up with, is refused as a baseline, and one
that only looks saturated is warned about; a live window shows its progress; success says what went where."""
from __future__ import annotations

import json
import threading
from pathlib import Path

import pytest
import yaml
from support.bench_servers import serve

from tally.bench.cli import main as bench_main
from tally.errors import ConfigError
from tally.ops.alerts import LATENCY_FACTOR, baseline_rules, rules_file
from tally.ops.alerts_cli import main as alerts_main


@pytest.fixture(scope="module")
def baseline(tmp_path_factory):
    path = tmp_path_factory.mktemp("baseline") / "run.json"
    with serve(mode="ok") as server:
        assert bench_main(["--url", server.url, "--rate", "20", "--duration", "2s", "--lengths", "fixed:16,4",
                           "--out", str(path), "--quiet"]) == 0
    return path


def test_thresholds_come_from_the_baseline(baseline):
    result = json.loads(baseline.read_text())
    rules = {r["alert"]: r for r in yaml.safe_load(rules_file(baseline).text)["groups"][0]["rules"]}
    ttft = rules["TallyTTFTP99High"]
    limit = float(ttft["expr"].rsplit(">", 1)[1])
    assert limit == pytest.approx(LATENCY_FACTOR * result["summary"]["ttft_s"]["p99"], rel=1e-5)
    assert "TTFT P99" in ttft["annotations"]["baseline"] and ttft["labels"]["severity"] == "page"
    assert {"TallyRejecting", "TallyRequestTimeouts", "TallyServerErrors", "TallyKVCacheNearlyFull",
            "TallyRequestsWaiting", "TallyOutputLengthDrop"} <= set(rules)
    assert all(r["annotations"]["baseline_run"] == str(baseline) for r in rules.values())


def test_the_prefix_follows_the_server_kind(baseline):
    text = rules_file(baseline, prefix="vllm:").text
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


def _variant(baseline, tmp_path, change) -> Path:
    result = json.loads(baseline.read_text())
    change(result)
    path = tmp_path / "variant.json"
    path.write_text(json.dumps(result))
    return path


@pytest.mark.parametrize("change,says", [
    (lambda r: r["summary"]["errors"].update(http_503=3), "3 request(s) turned away"),
    (lambda r: r["summary"]["errors"].update(http_504=1), "1 request(s) timed out"),
    (lambda r: r["server_metrics"].update(queue_time_s={"count": 50, "mean": 9.0, "p50": 8.0, "p99": 30.0}),
     "waited over 8.00s for a batch slot"),
])
def test_a_baseline_the_server_could_not_keep_up_with_is_refused(baseline, tmp_path, change, says):
    with pytest.raises(ConfigError, match="not a healthy baseline") as refused:
        rules_file(_variant(baseline, tmp_path, change))
    assert says in refused.value.message and "--rate" in refused.value.message


def test_first_tokens_far_slower_than_whole_answers_are_warned_about(baseline, tmp_path, capsys):
    def queued(result: dict) -> None:  # the issue's baseline: TTFT P99 148 s against answers of a few seconds
        result["summary"]["ttft_s"]["p99"] = 148.0
    path = _variant(baseline, tmp_path, queued)
    made = rules_file(path)
    assert len(made.warnings) == 1 and "TTFT P99 148.00s" in made.warnings[0]
    assert f"# WARNING: the baseline looks saturated: {made.warnings[0]}" in made.text
    assert alerts_main(["--baseline", str(path), "--out", str(tmp_path / "alerts.yml")]) == 0
    assert "WARNING: the baseline looks saturated" in capsys.readouterr().err


def test_success_says_in_one_line_what_was_written_where(baseline, tmp_path, capsys):
    out = tmp_path / "alerts.yml"
    assert alerts_main(["--baseline", str(baseline), "--out", str(out)]) == 0
    captured = capsys.readouterr()
    rules = yaml.safe_load(out.read_text())["groups"][0]["rules"]
    assert captured.out == "" and captured.err.count("\n") == 1
    assert captured.err.startswith(f"tally alerts: wrote {len(rules)} rules from {baseline} (")
    assert captured.err.rstrip().endswith(f"to {out}") and "TTFT P99" in captured.err


def test_a_live_window_shows_its_progress_while_it_waits():
    """A real HTTP server whose counters grow by one finished request per scrape."""
    from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

    from tally.ops.live_baseline import live_baseline

    scrapes = []

    class Metrics(BaseHTTPRequestHandler):
        def do_GET(self) -> None:  # noqa: N802 - http.server's name
            scrapes.append(1)
            body = f"# TYPE tally:request_success_total counter\ntally:request_success_total {len(scrapes)}\n".encode()
            self.send_response(200)
            self.send_header("content-length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, *args) -> None:
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), Metrics)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    lines: list[str] = []
    try:
        result = live_baseline(f"http://127.0.0.1:{server.server_port}", window_s=1.0, sample_every_s=0.1,
                               log=lines.append, progress_every_s=0.3)
    finally:
        server.shutdown()
    assert lines[0].startswith("reading http://127.0.0.1:") and "keep normal traffic flowing" in lines[0]
    progress = lines[1:]
    assert len(progress) >= 2 and all(" of 1s: " in line and "request(s) finished" in line for line in progress)
    finished = [int(line.split(": ")[1].split()[0]) for line in progress]
    assert finished == sorted(finished) and finished[-1] > 0  # the traffic seen so far, growing
    assert result["summary"]["counts"]["requests"] == len(scrapes) - 1
