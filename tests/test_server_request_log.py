"""`tally serve --request-log DIR`: real traffic, logged as it finishes, drives planning, replay and calibration.
A real server writes the log; the readers of tally plan, tally bench and tally quantize read the directory."""
from __future__ import annotations

import json

import httpx
import pytest

from tally.ledger.length_percentiles import load_lengths
from tally.models.loader import load_checkpoint
from tally.models.tokenizer import load_tokenizer
from tally.quantize.calibrate import load_calibration
from tally.server.process import ServerProcess
from tally.server.request_log import redact
from tally.traces import load_trace


@pytest.fixture(scope="module")
def logged(tiny_llama, tmp_path_factory):
    log_dir = tmp_path_factory.mktemp("requests")
    with ServerProcess(["--model", str(tiny_llama), "--served-model-name", "tiny", "--dtype", "float32",
                        "--max-model-len", "256", "--kv-cache-memory", "8MB", "--request-log", str(log_dir),
                        "--log-prompts", "--request-log-max-bytes", "600"]) as server:
        for i in range(3):
            r = httpx.post(server.base_url + "/completions", json={
                "model": "tiny", "prompt": f"write to bob{i}@example.com about order 4415 2233 9012", "max_tokens": 4 + i})
            assert r.status_code == 200
        r = httpx.post(server.base_url + "/chat/completions", json={
            "model": "tiny", "messages": [{"role": "system", "content": "be brief"},
                                         {"role": "user", "content": "my key is sk-abcdef0123456789xyz"}],
            "max_tokens": 3, "stream": True})
        assert r.status_code == 200
    return log_dir


def _records(log_dir) -> list[dict]:
    return [json.loads(ln) for f in sorted(log_dir.glob("*.jsonl")) for ln in f.read_text().splitlines()]


def test_every_finished_request_is_a_line_with_counts_latencies_and_redacted_text(logged):
    records = _records(logged)
    assert len(records) == 4 and len(list(logged.glob("*.jsonl"))) > 1  # rotated by size
    completions = [r for r in records if r["endpoint"] == "/v1/completions"]
    assert [r["output_tokens"] for r in completions] == [4, 5, 6]
    assert all(r["prompt_tokens"] > 0 and r["finish_reason"] == "length" and r["e2e_s"] >= r["ttft_s"] > 0
               for r in records)
    # only the logged text: a latency's or an id's digits may contain "4415" by chance
    text = json.dumps([{k: r[k] for k in ("prompt", "messages") if k in r} for r in records])
    assert "example.com" not in text and "4415" not in text and "sk-abcdef" not in text
    assert "<email>" in completions[0]["prompt"] and "<number>" in completions[0]["prompt"]
    chat = next(r for r in records if r["endpoint"] == "/v1/chat/completions")
    assert chat["messages"][0] == {"role": "system", "content": "be brief"}
    assert "<key>" in chat["messages"][1]["content"]


def test_plan_bench_and_quantize_read_the_log_directory(logged, tiny_llama):
    trace = load_trace(logged)
    assert len(trace) == 4 and trace.arrival_s is not None and trace.arrival_s[0] == 0.0  # replayable
    assert load_lengths(logged) == trace.pairs()
    tokenizer = load_tokenizer(load_checkpoint(str(tiny_llama)))
    calib = load_calibration(logged, tokenizer)
    assert len(calib.token_ids) == 4 and all(calib.token_ids)


def test_the_default_redaction():
    assert redact("mail a.b+c@mail.co.uk, call +44 20 7946 0958, key api_0123456789abcdef") == \
        "mail <email>, call <number>, key <key>"
