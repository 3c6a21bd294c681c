"""`tally alerts` and `tally dashboards` against the real thing: Debian's Prometheus scrapes a real `tally serve`,
evaluates the alert rules made from a baseline run of that server and the dashboard's recording rules; every
dashboard expression returns series; an alert fires when the server is deliberately overloaded."""
from __future__ import annotations

import re
import shutil
import subprocess
import threading
import time

import httpx
import pytest
import yaml
from support.ledger_polling import expect_ledger
from support.tiny_models import make_checkpoint

from tally.bench.cli import main as bench_main
from tally.ops.alerts import rules_file
from tally.ops.dashboards import dashboard_json, expressions, rules_yaml
from tally.server.process import ServerProcess, free_port

pytestmark = pytest.mark.skipif(not (shutil.which("prometheus") and shutil.which("promtool")),
                                reason="needs Debian's prometheus package: apt-get install prometheus")
NEVER_S = 120.0
WINDOW = "30s"


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    ckpt = make_checkpoint(tmp_path_factory.mktemp("tiny-64k"), "llama", max_position_embeddings=65536)
    with ServerProcess(["--model", str(ckpt), "--served-model-name", "tiny", "--dtype", "float32",
                        "--max-model-len", "65536", "--kv-cache-memory", "64MB", "--max-num-seqs", "2",
                        "--max-queue", "1", "--log-level", "warning",
                        "--speculative-config", '{"method": "ngram", "num_speculative_tokens": 2}']) as s:
        yield s


@pytest.fixture(scope="module")
def rules(server, tmp_path_factory):
    out = tmp_path_factory.mktemp("ops")
    assert bench_main(["--url", server.url, "--rate", "4", "--duration", "3s", "--lengths", "fixed:16,8",
                       "--out", str(out / "baseline.json"), "--quiet"]) == 0
    alerts, recording = out / "alerts.yml", out / "recording.yml"
    alerts.write_text(rules_file(out / "baseline.json", window=WINDOW, for_s="0s").text)
    recording.write_text(rules_yaml(window=WINDOW))
    return [alerts, recording]


@pytest.fixture(scope="module")
def prometheus(server, rules, tmp_path_factory):
    work = tmp_path_factory.mktemp("prometheus")
    config = work / "prometheus.yml"
    config.write_text(f"""global: {{scrape_interval: 1s, evaluation_interval: 1s}}
rule_files: [{", ".join(map(str, rules))}]
scrape_configs:
  - job_name: tally
    static_configs: [{{targets: ["127.0.0.1:{server.port}"]}}]
""")
    port = free_port()
    proc = subprocess.Popen(["prometheus", f"--config.file={config}", f"--storage.tsdb.path={work / 'data'}",
                             f"--web.listen-address=127.0.0.1:{port}"], stdout=subprocess.DEVNULL,
                            stderr=subprocess.DEVNULL)
    url = f"http://127.0.0.1:{port}"
    deadline = time.monotonic() + NEVER_S
    while True:
        try:
            if httpx.get(url + "/-/ready").status_code == 200:
                break
        except httpx.HTTPError:
            pass
        assert time.monotonic() < deadline, "prometheus never became ready"
        time.sleep(0.2)
    yield url
    proc.terminate()
    proc.wait(30)


def _wait(what: str, check) -> object:
    deadline = time.monotonic() + NEVER_S
    while (result := check()) is None or result is False:
        assert time.monotonic() < deadline, f"never: {what}"
        time.sleep(0.5)
    return result


def test_promtool_accepts_the_rules(rules):
    out = subprocess.run(["promtool", "check", "rules", *map(str, rules)], capture_output=True, text=True)
    assert out.returncode == 0, out.stdout + out.stderr


def test_every_rule_evaluates_and_the_latency_signals_return_series(server, prometheus):
    for _ in range(6):  # traffic, so the histograms have samples in the window
        httpx.post(server.base_url + "/completions", json={"model": "tiny", "prompt": "hi", "max_tokens": 8})
    groups = _wait("every rule evaluated", lambda: (lambda gs: gs if len(gs) == 2 and all(
        r.get("lastEvaluation", "").startswith("2") for g in gs for r in g["rules"]) else None)(
        httpx.get(prometheus + "/api/v1/rules").json()["data"]["groups"]))
    rules = [r for g in groups for r in g["rules"]]
    assert all(r["health"] == "ok" and not r.get("lastError") for r in rules), rules
    for r in rules:
        if r["name"] in ("TallyTTFTP99High", "TallyE2EP99High", "TallyRequestsWaiting", "TallyKVCacheNearlyFull"):
            lhs = re.split(r" [<>] ", r["query"])[0]
            _wait(f"series for {r['name']}", lambda: httpx.get(prometheus + "/api/v1/query", params={"query": lhs})
                  .json()["data"]["result"] or None)


def test_every_dashboard_expression_returns_series(server, prometheus):
    for _ in range(4):
        httpx.post(server.base_url + "/completions", json={"model": "tiny", "prompt": "hi", "max_tokens": 8})
    for expr in expressions(dashboard_json(window=WINDOW)):
        result = _wait(f"series for {expr}", lambda: (lambda r: r if r.get("status") == "success" and
                                                      r["data"]["result"] else None)(
            httpx.get(prometheus + "/api/v1/query", params={"query": expr}).json()))
        assert result["data"]["result"], expr


def test_an_overloaded_server_fires_the_rejection_alert(server, prometheus):
    release = threading.Event()

    def long_stream() -> None:
        body = {"model": "tiny", "prompt": "go", "max_tokens": 65000, "ignore_eos": True, "stream": True}
        with httpx.stream("POST", server.base_url + "/completions", json=body, timeout=NEVER_S) as r:
            if r.status_code == 200:
                release.wait(NEVER_S)

    holders = [threading.Thread(target=long_stream) for _ in range(3)]  # 2 slots and the 1-deep queue
    for t in holders:
        t.start()
    try:
        expect_ledger(server, lambda led: led["requests"]["running"] == 2, "both slots busy")
        for _ in range(5):  # turned away: the queue is full
            httpx.post(server.base_url + "/completions", json={"model": "tiny", "prompt": "x", "max_tokens": 2})

        def firing():
            alerts = httpx.get(prometheus + "/api/v1/alerts").json()["data"]["alerts"]
            return any(a["labels"]["alertname"] == "TallyRejecting" and a["state"] == "firing" for a in alerts)

        _wait("TallyRejecting firing", firing)
    finally:
        release.set()
        for t in holders:
            t.join(NEVER_S)


def test_a_live_window_of_the_server_is_a_baseline_too(server, tmp_path):
    """`tally alerts --baseline URL`: the server's own /metrics over a window of normal traffic, no bench run."""
    traffic = threading.Thread(target=bench_main, args=(["--url", server.url, "--rate", "4", "--duration", "3s",
                                                         "--lengths", "fixed:16,8", "--quiet"],))
    traffic.start()
    try:
        text = rules_file(server.url, window=WINDOW, for_s="0s", baseline_window_s=3.0).text
    finally:
        traffic.join()
    rules = {r["alert"]: r for group in yaml.safe_load(text)["groups"] for r in group["rules"]}
    assert {"TallyTTFTP99High", "TallyE2EP99High", "TallyOutputLengthDrop"} <= set(rules)
    assert all(server.url in r["annotations"]["baseline_run"] for r in rules.values())
    path = tmp_path / "live.yml"
    path.write_text(text)
    check = subprocess.run(["promtool", "check", "rules", str(path)], capture_output=True, text=True)
    assert check.returncode == 0, check.stdout + check.stderr
