"""`tally bench` against a real `tally serve` (tiny checkpoint) on 127.0.0.1: a 10-second run with
phases; every request accounted for, TTFT ≤ E2E for all, the report files exist and parse, and the
server's KV pool is whole again afterwards."""
from __future__ import annotations

import json
from html.parser import HTMLParser

import httpx

from tally.bench.cli import main as bench_main
from tally.server.process import ServerProcess

PHASES = "3/s:4s,12/s:2s,3/s:4s"  # 57 requests at --seed 3


def test_phased_run_against_tally_serve_accounts_for_every_request(tiny_llama, tmp_path):
    with ServerProcess(["--model", str(tiny_llama), "--served-model-name", "tiny", "--dtype", "float32",
                        "--kv-cache-memory", "8MB", "--max-model-len", "256"]) as server:
        rc = bench_main(["--url", server.url, "--model", "tiny", "--phases", PHASES, "--seed", "3",
                         "--lengths", "lognormal:prompt_median=40,prompt_max=120,output_median=12,output_max=40",
                         "--slo", "ttft=2s,tpot=200ms", "--out", str(tmp_path / "run.json"),
                         "--html", str(tmp_path / "report.html"), "--quiet"])
        ledger = httpx.get(server.url + "/ledger", timeout=10).json()
    assert rc == 0
    result = json.loads((tmp_path / "run.json").read_text())
    requests = result["requests"]
    counts = result["summary"]["counts"]
    assert len(requests) > 40 and counts["requests"] == counts["ok"] + counts["failed"] == len(requests)
    assert counts["failed"] == 0
    for r in requests:
        assert r["sent_s"] <= r["first_token_s"] <= r["last_token_s"]
        assert r["first_token_s"] - r["sent_s"] <= r["last_token_s"] - r["sent_s"]
        # ignore_eos: every request runs to max_tokens, also one whose tokens have no text (the tiny model
        # samples its EOS or another special token now and then): an empty answer, not `no_output`
        # (tests/test_bench_client_stream.py pins how the client reads one).
        assert r["output_tokens"] == r["expected_output_tokens"] >= 1
    parser = HTMLParser()
    parser.feed((tmp_path / "report.html").read_text())
    assert "<svg" in (tmp_path / "report.html").read_text()
    assert ledger["kv"]["blocks_used"] == 0 and ledger["requests"]["running"] == 0
